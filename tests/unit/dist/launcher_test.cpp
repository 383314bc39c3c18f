// The rank launcher with /bin/sh children: the torchrun environment, exit codes, stopping the job when a rank fails
// (processes the ranks started included), output relay and prefixes, signal forwarding, a killed launcher, bad options;
// the supervisor's restarts and its watchdog (the children write their heartbeat records themselves).
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
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "tessera/dist/launcher.h"
#include "tessera/util/error.h"
#include "tessera/util/preemption.h"
#include "test_util.h"

extern char** environ;

namespace fs = std::filesystem;
using tessera::dist::launch;
using tessera::dist::LaunchOptions;
using Clock = std::chrono::steady_clock;
// Every upper time bound here is this many times the bound on an idle machine (docs/testing.md#flakes).
const double kScale = tessera::testing::time_scale();

namespace {

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

// Sets an environment variable for the scope of the test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Sends spdlog's default logger to a string for the scope of the test.
class LogCapture {
 public:
  LogCapture() : old_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(text_);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("launcher_test", std::move(sink)));
  }
  ~LogCapture() { spdlog::set_default_logger(old_); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  std::string text() const { return text_.str(); }

 private:
  std::shared_ptr<spdlog::logger> old_;
  std::ostringstream text_;
};

std::string read_launcher_log(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream ss(text);
  for (std::string line; std::getline(ss, line);) lines.push_back(line);
  return lines;
}

// /bin/sh -c script on nproc ranks, with a short grace period. Tests pass their directory as $TEST_DIR.
LaunchOptions shell(const std::string& script, int nproc) {
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
Outcome launch_capturing(const LaunchOptions& o, const TempDir& dir) {
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
bool running(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

// Waits up to two seconds (a SIGKILL takes effect asynchronously) for pid to stop running.
bool ends_soon(pid_t pid) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(2 * kScale);
  while (running(pid) && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return !running(pid);
}

pid_t read_pid(const fs::path& p) {
  const std::string text = read_launcher_log(p);
  return text.empty() ? 0 : static_cast<pid_t>(std::stol(text));
}

// Shell snippet: a function `beat STATUS` that writes this rank's heartbeat record as util::heartbeat does.
const std::string kBeat = "beat() { echo \"$(date +%s) $1\" > $TESSERA_HEARTBEAT_DIR/rank$RANK; }; ";

// Whether any watchdog directory is left in our temporary directory (private to this test process).
bool heartbeat_dirs_left() {
  for (const auto& e : fs::directory_iterator(fs::temp_directory_path())) {
    if (e.path().filename().string().rfind("tessera-heartbeat-", 0) == 0) return true;
  }
  return false;
}

// Shell snippet: start `sleep 60` in the background, publish its pid as $TEST_DIR/sleep_$RANK, and wait for it.
const std::string kSleepInBackground =
    "sleep 60 & echo $! > $TEST_DIR/tmp_$RANK && mv $TEST_DIR/tmp_$RANK $TEST_DIR/sleep_$RANK; wait";

}  // namespace

TEST(Launcher, GivesEveryRankTheTorchrunEnvironment) {
  const TempDir dir;
  const ScopedEnv test_dir("TEST_DIR", dir.str());
  const ScopedEnv stale("RANK", "99");  // ours is replaced, not inherited
  const std::string script =
      "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $NODE_RANK $MASTER_ADDR $MASTER_PORT "
      "$TESSERA_LAUNCHED\" > $TEST_DIR/env_$RANK";
  LaunchOptions o = shell(script, 3);
  o.nnodes = 2;
  o.node_rank = 1;
  o.master_addr = "10.1.2.3";
  o.master_port = 31234;
  EXPECT_EQ(launch_capturing(o, dir).rc, 0);
  for (int local = 0; local < 3; ++local) {
    const int rank = 3 + local;
    EXPECT_EQ(read_launcher_log(dir.path() / ("env_" + std::to_string(rank))),
              fmt::format("{} 6 {} 3 1 1 10.1.2.3 31234 1\n", rank, local));
  }
  EXPECT_FALSE(fs::exists(dir.path() / "env_0"));
  EXPECT_FALSE(fs::exists(dir.path() / "env_99"));

  // One node with the defaults.
  EXPECT_EQ(launch_capturing(shell(script, 2), dir).rc, 0);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(read_launcher_log(dir.path() / ("env_" + std::to_string(rank))),
              fmt::format("{} 2 {} 2 0 0 127.0.0.1 29500 1\n", rank, rank));
  }
}

TEST(Launcher, ReturnsZeroWhenEveryRankExitsZero) {
  const TempDir dir;
  const Outcome r = launch_capturing(shell("exit 0", 4), dir);
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.log.find("[error]"), std::string::npos) << r.log;
}

TEST(Launcher, AFailingRankStopsTheOthersAndGivesItsExitCode) {
  const TempDir dir;
  const ScopedEnv test_dir("TEST_DIR", dir.str());
  // Rank 1 fails once the others sleep in a child process of theirs, which must be stopped too.
  const Outcome r = launch_capturing(
      shell("echo $$ > $TEST_DIR/pid_$RANK; if [ \"$RANK\" = 1 ]; then "
            "while [ ! -e $TEST_DIR/sleep_0 ] || [ ! -e $TEST_DIR/sleep_2 ]; do sleep 0.02; done; exit 3; fi; " +
                kSleepInBackground,
            3),
      dir);
  EXPECT_EQ(r.rc, 3);
  EXPECT_LT(r.seconds, 15 * kScale);
  EXPECT_NE(r.log.find(fmt::format("rank 1 (pid {}) exited with code 3", read_pid(dir.path() / "pid_1"))),
            std::string::npos)
      << r.log;
  for (int rank : {0, 2}) {
    const pid_t pid = read_pid(dir.path() / ("pid_" + std::to_string(rank)));
    const pid_t sleeper = read_pid(dir.path() / ("sleep_" + std::to_string(rank)));
    ASSERT_NE(pid, 0);
    ASSERT_NE(sleeper, 0);
    EXPECT_TRUE(ends_soon(pid)) << "rank " << rank;
    EXPECT_TRUE(ends_soon(sleeper)) << "the sleep that rank " << rank << " started";
  }
}

TEST(Launcher, ARankKilledBySignalGives128PlusTheSignal) {
  const TempDir dir;
  const ScopedEnv test_dir("TEST_DIR", dir.str());
  // The survivor and its child ignore SIGTERM: the launcher must SIGKILL them after the grace period (1 s).
  const Outcome r = launch_capturing(shell("trap '' TERM; echo $$ > $TEST_DIR/pid_$RANK; if [ \"$RANK\" = 0 ]; then "
                                           "while [ ! -e $TEST_DIR/sleep_1 ]; do sleep 0.02; done; kill -9 $$; fi; " +
                                               kSleepInBackground,
                                           2),
                                     dir);
  EXPECT_EQ(r.rc, 128 + SIGKILL);
  EXPECT_LT(r.seconds, 15 * kScale);
  const pid_t victim = read_pid(dir.path() / "pid_0");
  EXPECT_NE(r.log.find(fmt::format("rank 0 (pid {}) was killed by signal 9 ({})", victim, strsignal(SIGKILL))),
            std::string::npos)
      << r.log;
  EXPECT_NE(r.log.find("rank 1"), std::string::npos) << r.log;  // the warning that it had to be killed
  EXPECT_TRUE(ends_soon(read_pid(dir.path() / "pid_1")));
  EXPECT_TRUE(ends_soon(read_pid(dir.path() / "sleep_1")));
}

TEST(Launcher, PrefixesEachLineWithTheRank) {
  const TempDir dir;
  const Outcome r =
      launch_capturing(shell("printf 'a\\nb\\n'; printf 'to stderr\\n' >&2; printf 'unterminated'", 2), dir);
  EXPECT_EQ(r.rc, 0);
  for (const char* line : {"[rank 0] a\n", "[rank 0] b\n", "[rank 1] a\n", "[rank 1] b\n", "[rank 0] unterminated\n",
                           "[rank 1] unterminated\n"}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << " in:\n" << r.out;
  }
  EXPECT_EQ(lines_of(r.out).size(), 6u) << r.out;
  EXPECT_EQ(r.out.find("stderr"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("[rank 0] to stderr\n"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("[rank 1] to stderr\n"), std::string::npos) << r.err;
}

TEST(Launcher, NeverInterleavesPartsOfLines) {
  const TempDir dir;
  // Four ranks each write three lines of 2,400 characters in 300 small writes, at the same time.
  const Outcome r = launch_capturing(shell("for line in 1 2 3; do i=0; while [ $i -lt 300 ]; do "
                                           "printf %s \"$RANK$RANK$RANK$RANK$RANK$RANK$RANK$RANK\"; i=$((i+1)); "
                                           "done; echo; done",
                                           4),
                                     dir);
  EXPECT_EQ(r.rc, 0);
  const std::vector<std::string> lines = lines_of(r.out);
  EXPECT_EQ(lines.size(), 12u);
  for (const std::string& line : lines) {
    ASSERT_GT(line.size(), 9u);
    const char rank = line[6];
    EXPECT_EQ(line, std::string("[rank ") + rank + "] " + std::string(2400, rank));
  }
}

TEST(Launcher, CanLeaveOutputUnprefixed) {
  const TempDir dir;
  LaunchOptions o = shell("echo \"hello from $RANK\"", 1);
  o.prefix_output = false;
  const Outcome r = launch_capturing(o, dir);
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.out, "hello from 0\n");
}

TEST(Launcher, AProgramThatCannotRunExits127) {
  const TempDir dir;
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.argv = {"/nonexistent/program", "--flag"};
  const Outcome r = launch_capturing(o, dir);
  EXPECT_EQ(r.rc, 127);
  EXPECT_NE(r.log.find("could not run /nonexistent/program: No such file or directory"), std::string::npos) << r.log;
  o.argv = {"tessera-no-such-program-in-path"};
  EXPECT_EQ(launch_capturing(o, dir).rc, 127);
}

TEST(Launcher, ForwardsSignalsAndRestoresTheHandlers) {
  const TempDir dir;
  const ScopedEnv test_dir("TEST_DIR", dir.str());
  struct sigaction before {};
  ::sigaction(SIGTERM, nullptr, &before);
  // Rank 0 sends SIGTERM to the launcher (its parent), which forwards it to every rank's process group.
  const Outcome r = launch_capturing(
      shell("if [ \"$RANK\" = 0 ]; then while [ ! -e $TEST_DIR/sleep_1 ]; do sleep 0.02; done; kill -TERM $PPID; fi; " +
                kSleepInBackground,
            2),
      dir);
  EXPECT_EQ(r.rc, 128 + SIGTERM);
  EXPECT_LT(r.seconds, 5 * kScale);
  EXPECT_NE(r.log.find("forwarding signal 15"), std::string::npos) << r.log;
  EXPECT_TRUE(ends_soon(read_pid(dir.path() / "sleep_1")));
  struct sigaction after {};
  ::sigaction(SIGTERM, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before.sa_handler);
}

TEST(Launcher, LeavesIgnoredSignalsIgnored) {
  // Under nohup (SIGHUP ignored), a hangup must not stop the job.
  struct sigaction ignore {
  }, before{};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGHUP, &ignore, &before);
  const TempDir dir;
  const Outcome r =
      launch_capturing(shell("if [ \"$RANK\" = 0 ]; then kill -HUP $PPID; sleep 0.3; echo \"survived\"; fi", 2), dir);
  struct sigaction after {};
  ::sigaction(SIGHUP, &before, &after);
  EXPECT_EQ(r.rc, 0) << r.log;
  EXPECT_EQ(r.out, "[rank 0] survived\n");
  EXPECT_EQ(after.sa_handler, SIG_IGN);
}

TEST(Launcher, RanksDieWithTheLauncher) {
  const TempDir dir;
  const ScopedEnv test_dir("TEST_DIR", dir.str());
  std::fflush(nullptr);
  const pid_t launcher = ::fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    spdlog::set_level(spdlog::level::warn);
    LaunchOptions o =
        shell("echo $$ > $TEST_DIR/tmp_$RANK && mv $TEST_DIR/tmp_$RANK $TEST_DIR/pid_$RANK && exec sleep 60", 2);
    ::_exit(launch(o));
  }
  const auto deadline = Clock::now() + std::chrono::duration<double>(5 * kScale);
  while ((!fs::exists(dir.path() / "pid_0") || !fs::exists(dir.path() / "pid_1")) && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(launcher, SIGKILL);
  int status = 0;
  ::waitpid(launcher, &status, 0);
  for (int rank : {0, 1}) {
    const pid_t pid = read_pid(dir.path() / ("pid_" + std::to_string(rank)));
    ASSERT_NE(pid, 0) << "rank " << rank << " did not start";
    EXPECT_TRUE(ends_soon(pid)) << "rank " << rank;
  }
}

TEST(Launcher, RejectsBadOptions) {
  auto expect_config_error = [](const LaunchOptions& o, const std::string& what) {
    try {
      launch(o);
      ADD_FAILURE() << "no error for " << what;
    } catch (const tessera::ConfigError& e) {
      EXPECT_EQ(e.component(), "launch") << what;
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_config_error(shell("true", 0), "--nproc-per-node 0");
  LaunchOptions o = shell("true", 1);
  o.watchdog_step_multiple = 0.5;
  expect_config_error(o, "--watchdog-step-multiple 0.5");
  o.watchdog_step_multiple = 0;
  o.node_rank = 1;
  expect_config_error(o, "--node-rank 1");
  o.node_rank = -1;
  expect_config_error(o, "--node-rank -1");
  o = shell("true", 1);
  o.nnodes = 0;
  o.node_rank = 0;
  expect_config_error(o, "--nnodes 0");
  o = shell("true", 1);
  o.argv.clear();
  expect_config_error(o, "no program");
  o = shell("true", 1);
  o.master_port = 70000;
  expect_config_error(o, "--master-port 70000");
  o = shell("true", 1);
  o.master_port = 0;  // the launcher's own port works for one node only
  o.nnodes = 2;
  expect_config_error(o, "--master-port 0 (a port the launcher picks) works for one node only");
  o = shell("true", 1);
  o.stop_grace_seconds = -1;
  expect_config_error(o, "stop_grace_seconds");
  o = shell("true", 1);
  o.max_restarts = -1;
  expect_config_error(o, "--max-restarts -1");
  o = shell("true", 1);
  o.watchdog_timeout_seconds = -2;
  expect_config_error(o, "--watchdog-timeout -2");
  o.watchdog_timeout_seconds = std::nan("");
  expect_config_error(o, "--watchdog-timeout nan");
  // Elastic jobs.
  o = shell("true", 1);
  o.min_nodes = 3;
  o.max_nodes = 2;
  o.rdzv_endpoint = "127.0.0.1:29400";
  o.node_id = "a";
  expect_config_error(o, "--nnodes 3:2 must be MIN:MAX");
  o.min_nodes = 2;
  o.rdzv_endpoint = "";
  expect_config_error(o, "--nnodes 2:2 (an elastic job) needs --rdzv-endpoint");
  o.rdzv_endpoint = "node0";
  expect_config_error(o, "--rdzv-endpoint 'node0' is not HOST:PORT");
  o.rdzv_endpoint = "node0:http";
  expect_config_error(o, "'http' is not a TCP port");
  o.rdzv_endpoint = "node0:29400";
  o.node_id = "node a";
  expect_config_error(o, "--node-id 'node a' must be a non-empty name without spaces");
  o.node_id = "a";
  o.rdzv_timeout_seconds = -1;
  expect_config_error(o, "--rdzv-timeout -1");
}

TEST(Launcher, RestartsAfterACrashAndSucceeds) {
  const TempDir dir;
  const ScopedEnv test_dir("TEST_DIR", dir.str());
  // First attempt: rank 1 is killed once rank 0 runs (and sleeps); the second attempt succeeds.
  LaunchOptions o = shell(
      "echo \"$TORCHELASTIC_RESTART_COUNT $TORCHELASTIC_MAX_RESTARTS\" >> $TEST_DIR/runs_$RANK; "
      "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then "
      "  if [ \"$RANK\" = 1 ]; then while [ ! -e $TEST_DIR/runs_0 ]; do sleep 0.02; done; "
      "    echo $$ > $TEST_DIR/pid_1; kill -9 $$; fi; "
      "  exec sleep 60; "
      "fi",
      2);
  o.max_restarts = 3;
  const Outcome r = launch_capturing(o, dir);
  EXPECT_EQ(r.rc, 0) << r.log;
  EXPECT_LT(r.seconds, 10 * kScale);
  EXPECT_NE(r.log.find(fmt::format("restart 1/3 after rank 1 (pid {}) was killed by signal 9 ({})",
                                   read_pid(dir.path() / "pid_1"), strsignal(SIGKILL))),
            std::string::npos)
      << r.log;
  EXPECT_EQ(r.log.find("restart 2/3"), std::string::npos) << r.log;
  for (int rank : {0, 1}) EXPECT_EQ(read_launcher_log(dir.path() / fmt::format("runs_{}", rank)), "0 3\n1 3\n") << rank;
}

TEST(Launcher, GivesUpWhenTheRestartsAreUsedUp) {
  const TempDir dir;
  const ScopedEnv test_dir("TEST_DIR", dir.str());
  // Every attempt: rank 0 exits 3 once rank 1 of the same attempt runs.
  LaunchOptions o = shell(
      "touch $TEST_DIR/ran_${RANK}_$TORCHELASTIC_RESTART_COUNT; "
      "if [ \"$RANK\" = 0 ]; then while [ ! -e $TEST_DIR/ran_1_$TORCHELASTIC_RESTART_COUNT ]; do sleep 0.02; done; "
      "exit 3; fi; exec sleep 60",
      2);
  o.max_restarts = 2;
  const Outcome r = launch_capturing(o, dir);
  EXPECT_EQ(r.rc, 3) << r.log;
  EXPECT_LT(r.seconds, 10 * kScale);
  for (int attempt = 0; attempt < 4; ++attempt) {
    for (int rank : {0, 1}) {
      EXPECT_EQ(fs::exists(dir.path() / fmt::format("ran_{}_{}", rank, attempt)), attempt <= 2)
          << "rank " << rank << ", attempt " << attempt;
    }
  }
  EXPECT_NE(r.log.find("restart 1/2 after rank 0 (pid "), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("restart 2/2 after rank 0 (pid "), std::string::npos) << r.log;
  EXPECT_EQ(r.log.find("restart 3/2"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("giving up after 2 restarts"), std::string::npos) << r.log;
}

TEST(Launcher, WatchdogNamesTheStuckRankAndStopsTheJob) {
  const TempDir dir;
  const ScopedEnv test_dir("TEST_DIR", dir.str());
  // Both ranks make progress for a while; then rank 0 waits in a collective and rank 1 stops beating (both sleep).
  LaunchOptions o = shell(kBeat +
                              "echo $TESSERA_HEARTBEAT_DIR > $TEST_DIR/heartbeat_dir; echo $$ > $TEST_DIR/pid_$RANK; "
                              "i=0; while [ $i -lt 5 ]; do beat \"batch $i\"; i=$((i+1)); sleep 0.1; done; "
                              "if [ \"$RANK\" = 0 ]; then beat \"waiting in all_reduce of 1 Double elements\"; fi; "
                              "exec sleep 60",
                          2);
  o.watchdog_timeout_seconds = 1.5;
  const Outcome r = launch_capturing(o, dir);
  EXPECT_EQ(r.rc, tessera::dist::kLaunchHangExitCode) << r.log;
  EXPECT_EQ(r.rc, 124);
  EXPECT_LT(r.seconds, 8 * kScale);
  EXPECT_NE(r.log.find("hang: no rank made progress for "), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("rank 1 is stuck outside any collective (last: \"batch 4\", "), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("rank 0 is waiting in all_reduce of 1 Double elements ("), std::string::npos) << r.log;
  EXPECT_EQ(r.log.find("rank 0 is stuck"), std::string::npos) << r.log;
  EXPECT_EQ(r.log.find("restart 1/"), std::string::npos) << r.log;
  for (int rank : {0, 1}) EXPECT_TRUE(ends_soon(read_pid(dir.path() / fmt::format("pid_{}", rank)))) << rank;
  // The heartbeat directory was a fresh one under $TMPDIR, and is gone.
  const std::string heartbeat_dir = read_launcher_log(dir.path() / "heartbeat_dir");
  EXPECT_EQ(heartbeat_dir.rfind((fs::temp_directory_path() / "tessera-heartbeat-").string(), 0), 0u) << heartbeat_dir;
  EXPECT_FALSE(heartbeat_dirs_left());
}

// --watchdog-step-multiple: the timeout follows the job's pace. The ranks beat "batch N" every 0.4 s (with an
// evaluation batch between two of them, which must not count as a step), then stop: with a 0.3 s floor and a
// multiple of 8, the hang is reported after about 8 x 0.4 s, not after the floor.
TEST(Launcher, WatchdogDerivesItsTimeoutFromTheLongestStep) {
  const TempDir dir;
  const ScopedEnv test_dir("TEST_DIR", dir.str());
  LaunchOptions o = shell(
      "beat() { echo \"$(date +%s.%N) $1\" > $TESSERA_HEARTBEAT_DIR/rank$RANK; }; "
      "i=0; while [ $i -lt 6 ]; do beat \"batch $i\"; sleep 0.4; i=$((i+1)); "
      "  if [ $i = 3 ]; then beat \"eval batch 1\"; sleep 1.5; fi; done; "
      "beat \"batch 6\"; date +%s.%N > $TEST_DIR/last_beat_$RANK; exec sleep 60",
      2);
  o.watchdog_timeout_seconds = 0.3;
  o.watchdog_step_multiple = 8;
  const Outcome r = launch_capturing(o, dir);
  EXPECT_EQ(r.rc, 124) << r.log;
  const double last_beat = std::stod(read_launcher_log(dir.path() / "last_beat_0"));
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  // The launcher returned after the derived timeout (8 x at least 0.4 s = 3.2 s) from the last beat, not after the
  // 0.3 s floor, nor after 8 x the 1.9 s the evaluation made of one interval.
  const double caught = now - last_beat;
  EXPECT_GT(caught, 3.0) << r.log;
  EXPECT_LT(caught, 12.0 * kScale) << r.log;
  const size_t at = r.log.find("hang: no rank made progress for ");
  ASSERT_NE(at, std::string::npos) << r.log;
  const std::string line = r.log.substr(at, r.log.find('\n', at) - at);
  std::printf("caught %.1f s after the last beat: %s\n", caught, line.c_str());
  EXPECT_NE(line.find(" x the longest step seen, 0."), std::string::npos) << line;
  EXPECT_NE(line.find("(timeout "), std::string::npos) << line;
  EXPECT_NE(r.log.find("watchdog after 8 x the longest step without progress (at least 0.3 s)"), std::string::npos)
      << r.log;
}

TEST(Launcher, WatchdogCatchesAJobThatNeverBeats) {
  const TempDir dir;
  // No heartbeat at all: a hang after 10 x the timeout.
  LaunchOptions o = shell("exec sleep 60", 2);
  o.watchdog_timeout_seconds = 0.3;
  const Outcome r = launch_capturing(o, dir);
  EXPECT_EQ(r.rc, 124) << r.log;
  EXPECT_GT(r.seconds, 2.9);
  EXPECT_LT(r.seconds, 8 * kScale);
  EXPECT_NE(r.log.find("no rank wrote a heartbeat within"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("rank 0 has not written a heartbeat"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("rank 1 has not written a heartbeat"), std::string::npos) << r.log;
}

TEST(Launcher, RestartsAfterAHang) {
  const TempDir dir;
  const ScopedEnv test_dir("TEST_DIR", dir.str());
  // First attempt: rank 0 waits in a barrier for ever, rank 1 stops beating. Second attempt: both finish.
  LaunchOptions o = shell(kBeat +
                              "echo $TORCHELASTIC_RESTART_COUNT >> $TEST_DIR/runs_$RANK; beat \"batch 1\"; "
                              "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then "
                              "  if [ \"$RANK\" = 0 ]; then sleep 0.2; beat \"waiting in barrier\"; fi; exec sleep 60; "
                              "fi; beat \"batch 2\"",
                          2);
  o.watchdog_timeout_seconds = 1;
  o.max_restarts = 1;
  const Outcome r = launch_capturing(o, dir);
  EXPECT_EQ(r.rc, 0) << r.log;
  EXPECT_LT(r.seconds, 8 * kScale);
  EXPECT_NE(r.log.find("rank 0 is waiting in barrier"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("restart 1/1 after a hang: no rank made progress for "), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("(suspect: rank 1)"), std::string::npos) << r.log;
  for (int rank : {0, 1}) EXPECT_EQ(read_launcher_log(dir.path() / fmt::format("runs_{}", rank)), "0\n1\n") << rank;
  EXPECT_FALSE(heartbeat_dirs_left());
}

TEST(Launcher, AForwardedSignalIsNotRestarted) {
  const TempDir dir;
  const ScopedEnv test_dir("TEST_DIR", dir.str());
  // Rank 0 sends SIGTERM to the launcher, which stops the job and must not start it again.
  LaunchOptions o = shell(
      "echo $TORCHELASTIC_RESTART_COUNT >> $TEST_DIR/runs_$RANK; "
      "if [ \"$RANK\" = 0 ]; then while [ ! -e $TEST_DIR/sleep_1 ]; do sleep 0.02; done; kill -TERM $PPID; fi; " +
          kSleepInBackground,
      2);
  o.max_restarts = 3;
  o.watchdog_timeout_seconds = 30;
  const Outcome r = launch_capturing(o, dir);
  EXPECT_EQ(r.rc, 128 + SIGTERM) << r.log;
  EXPECT_LT(r.seconds, 5 * kScale);
  EXPECT_NE(r.log.find("forwarding signal 15"), std::string::npos) << r.log;
  EXPECT_EQ(r.log.find("restart 1/"), std::string::npos) << r.log;
  for (int rank : {0, 1}) EXPECT_EQ(read_launcher_log(dir.path() / fmt::format("runs_{}", rank)), "0\n") << rank;
  EXPECT_TRUE(ends_soon(read_pid(dir.path() / "sleep_1")));
}

// ---- Elastic jobs: one launcher per "node", each a re-executed test process running LauncherWorker.ElasticNode ----

namespace {

// The worker's options, from the environment its parent sets.
constexpr const char* kElasticNodeEnv = "TESSERA_TEST_ELASTIC_NODE";

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : fallback;
}

struct ElasticNode {
  std::string id;
  pid_t pid = -1;
  fs::path log;
  std::optional<int> status;  // waitpid's, once reaped

  std::string text() const { return read_launcher_log(log); }
};

struct ElasticSetup {
  std::string nnodes = "2:3";
  int port = 0;  // the rendezvous's
  int max_restarts = 1;
  int nproc = 1;
  double rdzv_timeout = 30;
  std::string script;
};

// Starts a launcher for node `id` (the rendezvous host when `host`), its output in dir/node_<id>.log.
ElasticNode start_node(const TempDir& dir, const std::string& id, bool host, const ElasticSetup& setup) {
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  std::vector<std::string> env = {
      std::string(kElasticNodeEnv) + "=" + id,
      "TESSERA_TEST_ELASTIC_HOST=" + std::string(host ? "1" : "0"),
      "TESSERA_TEST_ELASTIC_NNODES=" + setup.nnodes,
      "TESSERA_TEST_ELASTIC_PORT=" + std::to_string(setup.port),
      "TESSERA_TEST_ELASTIC_RESTARTS=" + std::to_string(setup.max_restarts),
      "TESSERA_TEST_ELASTIC_NPROC=" + std::to_string(setup.nproc),
      "TESSERA_TEST_ELASTIC_TIMEOUT=" + std::to_string(setup.rdzv_timeout),
      "TESSERA_TEST_ELASTIC_SCRIPT=" + setup.script,
      "TEST_DIR=" + dir.str(),
  };
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::string(*e).rfind("GTEST_", 0) != 0) env.emplace_back(*e);  // the worker runs its one test
  }
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string filter = "--gtest_filter=LauncherWorker.ElasticNode";
  std::vector<char*> argv = {const_cast<char*>(self.c_str()), filter.data(), nullptr};
  ElasticNode node{id, -1, dir.path() / ("node_" + id + ".log"), std::nullopt};
  const std::string log = node.log.string();
  std::fflush(nullptr);
  node.pid = ::fork();
  if (node.pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execve(self.c_str(), argv.data(), envp.data());
    ::_exit(127);
  }
  return node;
}

// Waits up to `seconds` for cond().
template <typename Cond>
bool wait_until(Cond cond, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (!cond()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// The node's exit code (128 + signal for a signal), waiting up to `seconds`; -1 (after killing it) if it runs on.
int exit_code(ElasticNode& node, double seconds) {
  const bool done = wait_until(
      [&] {
        int status = 0;
        if (::waitpid(node.pid, &status, WNOHANG) == node.pid) node.status = status;
        return node.status.has_value();
      },
      seconds);
  if (!done) {
    ::kill(node.pid, SIGKILL);
    int status = 0;
    ::waitpid(node.pid, &status, 0);
    return -1;
  }
  return WIFSIGNALED(*node.status) ? 128 + WTERMSIG(*node.status) : WEXITSTATUS(*node.status);
}

// Kills and reaps whatever node of the test is still running when it ends (a failed assertion returns early).
struct NodeReaper {
  std::vector<ElasticNode*> nodes;
  ~NodeReaper() {
    for (ElasticNode* n : nodes) {
      if (n->pid > 0 && !n->status) {
        ::kill(n->pid, SIGKILL);
        int status = 0;
        ::waitpid(n->pid, &status, 0);
      }
    }
  }
};

// Starts nodes ids[0] (the host), ids[1], ... one after the other, each once the host has seen the one before join
// (so that node ranks follow the order).
std::vector<ElasticNode> start_nodes(const TempDir& dir, const std::vector<std::string>& ids,
                                     const ElasticSetup& setup) {
  std::vector<ElasticNode> nodes;
  nodes.reserve(ids.size());
  nodes.push_back(start_node(dir, ids[0], true, setup));
  for (size_t i = 1; i < ids.size(); ++i) {
    nodes.push_back(start_node(dir, ids[i], false, setup));
    const std::string joined = "node " + ids[i] + " joined";
    if (!wait_until([&] { return nodes[0].text().find(joined) != std::string::npos; }, 60)) {
      ADD_FAILURE() << "node " << ids[i] << " did not join:\n" << nodes[0].text() << nodes[i].text();
    }
  }
  return nodes;
}

// The script's record of each attempt on a node: "<restart count> <RANK> <WORLD_SIZE> <GROUP_RANK>" lines.
const std::string kRecordAttempt =
    "echo \"$TORCHELASTIC_RESTART_COUNT $RANK $WORLD_SIZE $GROUP_RANK\" >> $TEST_DIR/runs_$TESSERA_NODE_ID; ";

}  // namespace

TEST(LauncherWorker, ElasticNode) {
  const char* id = std::getenv(kElasticNodeEnv);
  if (id == nullptr) GTEST_SKIP() << "run by the Elastic tests";
  LaunchOptions o =
      shell(env_or("TESSERA_TEST_ELASTIC_SCRIPT", "true"), std::stoi(env_or("TESSERA_TEST_ELASTIC_NPROC", "1")));
  const std::string nnodes = env_or("TESSERA_TEST_ELASTIC_NNODES", "1:1");
  o.min_nodes = std::stoi(nnodes.substr(0, nnodes.find(':')));
  o.max_nodes = std::stoi(nnodes.substr(nnodes.find(':') + 1));
  o.rdzv_endpoint = "127.0.0.1:" + env_or("TESSERA_TEST_ELASTIC_PORT", "0");
  o.rdzv_host = env_or("TESSERA_TEST_ELASTIC_HOST", "0") == "1";
  o.node_id = id;
  o.max_restarts = std::stoi(env_or("TESSERA_TEST_ELASTIC_RESTARTS", "0"));
  o.rdzv_timeout_seconds = std::stod(env_or("TESSERA_TEST_ELASTIC_TIMEOUT", "30"));
  o.rdzv_last_call_seconds = 30;  // the tests start every node before the job starts
  int rc = 0;
  try {
    rc = launch(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    rc = 2;
  }
  spdlog::default_logger()->flush();
  std::fflush(nullptr);
  ::_exit(rc);
}

TEST(Elastic, ALostNodeIsExcludedAndTheJobGoesOnWithTheOthers) {
  const TempDir dir;
  ElasticSetup setup;
  setup.port = tessera::dist::free_local_port();
  setup.script = kRecordAttempt + "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then exec sleep 60; fi";
  std::vector<ElasticNode> nodes = start_nodes(dir, {"a", "b", "c"}, setup);
  NodeReaper reaper{{&nodes[0], &nodes[1], &nodes[2]}};
  // Attempt 0 runs on three nodes; then node c dies, its launcher and ranks with it.
  ASSERT_TRUE(wait_until(
      [&] {
        return fs::exists(dir.path() / "runs_a") && fs::exists(dir.path() / "runs_b") &&
               fs::exists(dir.path() / "runs_c");
      },
      60))
      << nodes[0].text();
  ::kill(nodes[2].pid, SIGKILL);
  EXPECT_EQ(exit_code(nodes[0], 60), 0) << nodes[0].text();
  EXPECT_EQ(exit_code(nodes[1], 10), 0) << nodes[1].text();
  EXPECT_EQ(exit_code(nodes[2], 10), 128 + SIGKILL);
  // Attempt 1 ran on two nodes, world size 2, with the same node ranks for a and b.
  EXPECT_EQ(read_launcher_log(dir.path() / "runs_a"), "0 0 3 0\n1 0 2 0\n");
  EXPECT_EQ(read_launcher_log(dir.path() / "runs_b"), "0 1 3 1\n1 1 2 1\n");
  EXPECT_EQ(read_launcher_log(dir.path() / "runs_c"), "0 2 3 2\n");
  const std::string host = nodes[0].text();
  EXPECT_NE(host.find("attempt 0: 3 nodes (a, b, c), world size 3"), std::string::npos) << host;
  EXPECT_NE(host.find("node c is lost (its launcher's connection closed)"), std::string::npos) << host;
  EXPECT_NE(host.find("excluding node c from the job: lost"), std::string::npos) << host;
  EXPECT_NE(host.find("restart 1/1 after node c (lost); excluded nodes: c (lost)"), std::string::npos) << host;
  EXPECT_NE(host.find("attempt 1: 2 nodes (a, b), world size 2"), std::string::npos) << host;
  EXPECT_NE(nodes[1].text().find("stopping the ranks: another node failed"), std::string::npos) << nodes[1].text();
}

TEST(Elastic, AFailedRankRestartsOnTheSameNodesAndANodeMarkedBadIsExcluded) {
  const TempDir dir;
  ElasticSetup setup;
  setup.port = tessera::dist::free_local_port();
  setup.max_restarts = 2;
  // Attempt 0: a rank on b fails (a bug, not the node): all three go again. Attempt 1: c's rank marks its node bad.
  // Each failure waits until the attempt runs on every node.
  setup.script = kRecordAttempt +
                 "n=$TORCHELASTIC_RESTART_COUNT; "
                 "all() { while [ $(cat $TEST_DIR/runs_* | grep -c \"^$n \") -lt 3 ]; do sleep 0.02; done; }; "
                 "if [ $n = 0 ] && [ $TESSERA_NODE_ID = b ]; then all; exit 3; fi; "
                 "if [ $n = 1 ] && [ $TESSERA_NODE_ID = c ]; then all; exit " +
                 std::to_string(tessera::util::kExitNodeBad) +
                 "; fi; "
                 "if [ $n -lt 2 ]; then exec sleep 60; fi";
  std::vector<ElasticNode> nodes = start_nodes(dir, {"a", "b", "c"}, setup);
  NodeReaper reaper{{&nodes[0], &nodes[1], &nodes[2]}};
  EXPECT_EQ(exit_code(nodes[0], 60), 0) << nodes[0].text();
  EXPECT_EQ(exit_code(nodes[1], 10), 0) << nodes[1].text();
  EXPECT_EQ(exit_code(nodes[2], 10), tessera::util::kExitNodeBad) << nodes[2].text();
  EXPECT_EQ(read_launcher_log(dir.path() / "runs_a"), "0 0 3 0\n1 0 3 0\n2 0 2 0\n");
  EXPECT_EQ(read_launcher_log(dir.path() / "runs_b"), "0 1 3 1\n1 1 3 1\n2 1 2 1\n");
  EXPECT_EQ(read_launcher_log(dir.path() / "runs_c"), "0 2 3 2\n1 2 3 2\n");
  const std::string host = nodes[0].text();
  EXPECT_NE(host.find("restart 1/2 after node b: rank 1 (pid "), std::string::npos) << host;
  EXPECT_NE(host.find("exited with code 3\n"), std::string::npos) << host;
  EXPECT_NE(host.find("excluding node c from the job: its ranks marked it bad: rank 2 (pid "), std::string::npos)
      << host;
  EXPECT_NE(host.find("restart 2/2 after node c (its ranks marked it bad: rank 2 (pid "), std::string::npos) << host;
  EXPECT_NE(host.find("attempt 2: 2 nodes (a, b), world size 2"), std::string::npos) << host;
  EXPECT_NE(nodes[2].text().find("node c was excluded from the job: its ranks marked it bad"), std::string::npos)
      << nodes[2].text();
}

TEST(Elastic, FewerThanMinNodesEndsTheJobNamingTheExcludedOnes) {
  const TempDir dir;
  ElasticSetup setup;
  setup.port = tessera::dist::free_local_port();
  setup.nnodes = "2:2";
  // Long enough for node b to start and join (a test process loading LibTorch: seconds on a loaded machine); it is
  // also how long the host then waits for a second node once b is gone.
  setup.rdzv_timeout = std::round(5 * kScale);
  setup.script = kRecordAttempt + "exec sleep 60";
  std::vector<ElasticNode> nodes = start_nodes(dir, {"a", "b"}, setup);
  NodeReaper reaper{{&nodes[0], &nodes[1]}};
  ASSERT_TRUE(wait_until([&] { return fs::exists(dir.path() / "runs_b"); }, 60)) << nodes[0].text();
  ::kill(nodes[1].pid, SIGKILL);
  EXPECT_EQ(exit_code(nodes[0], 30 + setup.rdzv_timeout), 1) << nodes[0].text();
  const std::string host = nodes[0].text();
  EXPECT_NE(host.find(fmt::format("only 1 of the 2 nodes the job needs (--nnodes 2:2) joined within {} s; excluded "
                                  "nodes: b (lost)",
                                  setup.rdzv_timeout)),
            std::string::npos)
      << host;
  EXPECT_EQ(read_launcher_log(dir.path() / "runs_a"), "0 0 2 0\n");
}

TEST(Elastic, TheHostRefusesANodeThatDoesNotFitNamingIt) {
  const TempDir dir;
  ElasticSetup setup;
  setup.port = tessera::dist::free_local_port();
  setup.nnodes = "2:2";
  // Long enough for both refused nodes to start and reach the host (seconds each on a loaded machine) before it gives
  // up waiting for a second node.
  setup.rdzv_timeout = std::round(10 * kScale);
  setup.script = "true";
  ElasticNode a = start_node(dir, "a", true, setup);
  NodeReaper reaper{{&a}};
  ElasticSetup twice = setup;
  twice.nproc = 2;
  ElasticNode b = start_node(dir, "b", false, twice);
  ElasticNode a2 = start_node(dir, "a", false, setup);
  reaper.nodes = {&a, &b, &a2};
  EXPECT_EQ(exit_code(b, 30), 2) << b.text();
  EXPECT_NE(b.text().find(fmt::format("the rendezvous host at 127.0.0.1:{} refused node b: node b has "
                                      "--nproc-per-node 2, the job 1",
                                      setup.port)),
            std::string::npos)
      << b.text();
  EXPECT_EQ(exit_code(a2, 30), 2) << a2.text();
  EXPECT_NE(a2.text().find("a node named a is already in the job (give each launcher its own --node-id)"),
            std::string::npos)
      << a2.text();
  EXPECT_EQ(exit_code(a, 30 + setup.rdzv_timeout), 1) << a.text();
  EXPECT_NE(a.text().find("only 1 of the 2 nodes the job needs"), std::string::npos) << a.text();
}
