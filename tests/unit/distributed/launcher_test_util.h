// Helpers of the launcher's tests (launcher_test.cpp: one node; elastic_test.cpp: several): temporary directories,
// launching /bin/sh ranks and capturing the launcher's log, and checks on processes. (Environment variables for a
// test: ScopedEnv in test_util.h.)
#pragma once

#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "log_capture.h"
#include "tessera/distributed/launcher.h"
#include "tessera/util/error.h"
#include "tessera/util/preemption.h"
#include "test_util.h"

extern char** environ;

namespace tessera::testing::launcher_test {

namespace fs = std::filesystem;
using tessera::dist::launch;
using tessera::dist::LaunchOptions;
using Clock = std::chrono::steady_clock;
// Every upper time bound here is this many times the bound on an idle machine (docs/testing.md#flakes).
inline const double kScale = tessera::testing::time_scale();

// A private directory (mkdtemp), removed with everything in it at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "launcher_test_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp: " + std::string(std::strerror(errno)));
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

inline std::string read_launcher_log(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream ss(text);
  for (std::string line; std::getline(ss, line);) lines.push_back(line);
  return lines;
}

// /bin/sh -c script on nproc ranks, with a short grace period. Tests pass their directory as $TEST_DIR.
inline LaunchOptions shell(const std::string& script, int nproc) {
  LaunchOptions o;
  o.nproc_per_node = nproc;
  o.argv = {"/bin/sh", "-c", script};
  o.stop_grace_seconds = 1;
  return o;
}

struct Outcome {
  int rc = -1;
  double seconds = 0;
  std::string out, err, log;  // our stdout and stderr during the launch, and what it logged
};

// Runs launch() with fds 1 and 2 redirected to files in dir and spdlog captured.
inline Outcome launch_capturing(const LaunchOptions& o, const TempDir& dir) {
  Outcome r;
  LogCapture log;
  std::fflush(nullptr);
  const int saved_out = ::dup(1), saved_err = ::dup(2);
  std::FILE* out = std::fopen((dir.path() / "stdout.txt").c_str(), "w");
  std::FILE* err = std::fopen((dir.path() / "stderr.txt").c_str(), "w");
  ::dup2(::fileno(out), 1);
  ::dup2(::fileno(err), 2);
  const auto start = Clock::now();
  try {
    r.rc = launch(o);
  } catch (...) {
    r.rc = -2;
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::fflush(nullptr);
  ::dup2(saved_out, 1);
  ::dup2(saved_err, 2);
  ::close(saved_out);
  ::close(saved_err);
  std::fclose(out);
  std::fclose(err);
  r.out = read_launcher_log(dir.path() / "stdout.txt");
  r.err = read_launcher_log(dir.path() / "stderr.txt");
  r.log = log.text();
  return r;
}

// Whether pid is a live process (not gone, not a zombie).
inline bool running(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

// Waits up to two seconds (a SIGKILL takes effect asynchronously) for pid to stop running.
inline bool ends_soon(pid_t pid) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(2 * kScale);
  while (running(pid) && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return !running(pid);
}

inline pid_t read_pid(const fs::path& p) {
  const std::string text = read_launcher_log(p);
  return text.empty() ? 0 : static_cast<pid_t>(std::stol(text));
}

// Shell snippet: a function `beat STATUS` that writes this rank's heartbeat record as util::heartbeat does.
inline const std::string kBeat = "beat() { echo \"$(date +%s) $1\" > $TESSERA_HEARTBEAT_DIR/rank$RANK; }; ";

// Whether any watchdog directory is left in our temporary directory (private to this test process).
inline bool heartbeat_dirs_left() {
  for (const auto& e : fs::directory_iterator(fs::temp_directory_path())) {
    if (e.path().filename().string().rfind("tessera-heartbeat-", 0) == 0) return true;
  }
  return false;
}

// Shell snippet: start `sleep 60` in the background, publish its pid as $TEST_DIR/sleep_$RANK, and wait for it.
inline const std::string kSleepInBackground =
    "sleep 60 & echo $! > $TEST_DIR/tmp_$RANK && mv $TEST_DIR/tmp_$RANK $TEST_DIR/sleep_$RANK; wait";

}  // namespace tessera::testing::launcher_test
