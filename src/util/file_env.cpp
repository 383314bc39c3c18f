// The plain POSIX FileEnv and the process's current one.
#include "tessera/util/file_env.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <system_error>

namespace tessera::util {
namespace {

namespace fs = std::filesystem;

int from_error_code(const std::error_code& ec) {
  if (!ec) return 0;
  errno = ec.value();
  return -1;
}

FileEnv g_posix;
std::atomic<FileEnv*> g_current{&g_posix};

}  // namespace

int FileEnv::open(const std::string& path, int flags, mode_t mode) {
  return ::open(path.c_str(), flags, mode);
}

ssize_t FileEnv::write(int fd, const void* data, size_t n, const std::string& /*path*/) {
  return ::write(fd, data, n);
}

int FileEnv::fsync(int fd, const std::string& /*path*/) {
  return ::fsync(fd);
}

int FileEnv::close(int fd, const std::string& /*path*/) {
  return ::close(fd);
}

int FileEnv::rename(const std::string& from, const std::string& to) {
  return ::rename(from.c_str(), to.c_str());
}

int FileEnv::unlink(const std::string& path) {
  return ::unlink(path.c_str()) == 0 || errno == ENOENT ? 0 : -1;
}

int FileEnv::mkdir(const std::string& path, mode_t mode) {
  return ::mkdir(path.c_str(), mode);
}

int FileEnv::create_directories(const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  return from_error_code(ec);
}

int FileEnv::remove_all(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  return from_error_code(ec);
}

int FileEnv::symlink(const std::string& target, const std::string& link) {
  return ::symlink(target.c_str(), link.c_str());
}

FileEnv& file_env() {
  return *g_current.load(std::memory_order_acquire);
}

void set_file_env(FileEnv* env) {
  g_current.store(env != nullptr ? env : &g_posix, std::memory_order_release);
}

}  // namespace tessera::util
