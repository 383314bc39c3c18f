// The file operations a checkpoint save makes, behind one seam (LevelDB's `Env`): the process's FileEnv performs
// them, and a test can install a wrapper that fails or kills the process at any chosen step of the
// write / fsync / rename / publish sequence (tests/unit/checkpoint/save_faults_test.cpp).
//
// Every method behaves as the POSIX call it is named after: 0 (or a count, or a descriptor) on success, -1 with errno
// set on failure. `path` arguments that a call does not need (write, fsync, close) are for wrappers to match on.
#pragma once

#include <sys/types.h>

#include <string>

namespace tessera::util {

class FileEnv {
 public:
  virtual ~FileEnv() = default;

  virtual int open(const std::string& path, int flags, mode_t mode);
  virtual ssize_t write(int fd, const void* data, size_t n, const std::string& path);
  virtual int fsync(int fd, const std::string& path);
  virtual int close(int fd, const std::string& path);
  virtual int rename(const std::string& from, const std::string& to);
  virtual int unlink(const std::string& path);  // a file or a symlink; absent is not an error here
  virtual int mkdir(const std::string& path, mode_t mode);
  virtual int create_directories(const std::string& path);  // mkdir -p
  virtual int remove_all(const std::string& path);          // rm -rf; absent is not an error
  virtual int symlink(const std::string& target, const std::string& link);
};

// The process's FileEnv: the plain POSIX one unless a test installed another.
FileEnv& file_env();

// Installs `env` for the whole process (not owned; it must outlive its use); nullptr restores the plain one. For
// tests: install before the operations to observe, uninstall once they are done.
void set_file_env(FileEnv* env);

}  // namespace tessera::util
