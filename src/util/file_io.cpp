// Whole-file reads; atomic file publication: temporary file, fsync, rename.
#include "tessera/util/file_io.h"
#include "tessera/util/path_pattern.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <utility>

#include "tessera/util/error.h"
#include "tessera/util/file_env.h"

namespace tessera::util {

std::string read_file(const std::string& path, const std::string& component) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(component, fmt::format("{}: cannot open", path));
  std::stringstream s;
  s << in.rdbuf();
  if (in.bad()) throw Error(component, fmt::format("{}: read failed", path));
  return s.str();
}

void write_file_atomically(const std::string& path, const std::vector<std::string_view>& parts,
                           const std::string& component, const std::function<void(std::string_view)>& observe) {
  constexpr size_t kChunk = size_t{8} << 20;
  // A name of this writer's own: processes (e.g. the local ranks decompressing one shard) may write the same path at
  // once; each renames its complete file over it, and the last one wins with the same bytes.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = fmt::format("{}.tmp.{}.{}", path, ::getpid(), counter.fetch_add(1));
  FileEnv& env = file_env();
  const int fd = env.open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(component, fmt::format("{}: cannot create {}: {}", path, tmp, std::strerror(errno)));
  auto fail = [&](const std::string& what) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(component, fmt::format("{}: {} failed: {}", path, what, why));
  };
  for (std::string_view part : parts) {
    for (size_t off = 0; off < part.size(); off += kChunk) {
      const std::string_view chunk = part.substr(off, kChunk);
      if (observe) observe(chunk);
      size_t done = 0;
      while (done < chunk.size()) {
        const ssize_t w = env.write(fd, chunk.data() + done, chunk.size() - done, tmp);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) fail("write");
        done += static_cast<size_t>(w);
      }
    }
  }
  if (env.fsync(fd, tmp) != 0) fail("fsync");
  if (env.close(fd, tmp) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw Error(component, fmt::format("{}: close failed: {}", path, why));
  }
  if (env.rename(tmp, path) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw Error(component, fmt::format("{}: rename from {} failed: {}", path, tmp, why));
  }
}

std::string make_temp_dir(const std::string& prefix, const std::string& component) {
  std::error_code ec;
  std::filesystem::path base = std::filesystem::temp_directory_path(ec);
  if (ec) base = "/tmp";
  std::string tmpl = (base / (prefix + "-XXXXXX")).string();
  if (::mkdtemp(tmpl.data()) == nullptr) {
    throw Error(component, fmt::format("{}: cannot create a temporary directory: {}", tmpl, std::strerror(errno)));
  }
  return tmpl;
}

TempFolder::~TempFolder() {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

namespace {
std::string fill_keys(std::string pattern, std::initializer_list<std::pair<std::string, std::string>> keys) {
  for (const auto& [key, value] : keys) {
    for (size_t at = pattern.find(key); at != std::string::npos; at = pattern.find(key, at + value.size())) {
      pattern.replace(at, key.size(), value);
    }
  }
  return pattern;
}
}  // namespace

std::string fill_path_pattern(std::string pattern, const std::string& run_name, int64_t rank) {
  return fill_keys(std::move(pattern), {{"{run_name}", run_name}, {"{rank}", std::to_string(rank)}});
}

std::string fill_path_pattern(std::string pattern, const std::string& run_name, int64_t rank, int64_t batch) {
  return fill_keys(std::move(pattern),
                   {{"{run_name}", run_name}, {"{rank}", std::to_string(rank)}, {"{batch}", std::to_string(batch)}});
}

}  // namespace tessera::util
