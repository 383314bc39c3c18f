// The rank launcher with /bin/sh children: the torchrun environment, exit codes, stopping the job when a rank fails
// (processes the ranks started included), output relay and prefixes, signal forwarding, a killed launcher, bad options;
// the supervisor's restarts and its watchdog (the children write their heartbeat records themselves).
#include <gtest/gtest.h>

#include <ATen/Parallel.h>
#include <sched.h>

#include <future>

#include "launcher_test_util.h"

namespace tessera::testing::launcher_test {

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
    std::string want = "[rank ";  // (appended, not a chain of operator+: GCC 12 warns of array bounds there)
    want += rank;
    want += "] ";
    want.append(2400, rank);
    EXPECT_EQ(line, want);
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

TEST(Launcher, ForkedRanksRunTheEntryWithTheirEnvironmentThreadsAndDescriptorsAndRestart) {
  const TempDir dir;
  // Not the thread count this process has: a forked rank must take OMP_NUM_THREADS as a fresh process would.
  const int threads = at::get_num_threads() + 2;
  const ScopedEnv omp("OMP_NUM_THREADS", std::to_string(threads));
  const int closes = ::open("/dev/null", O_RDONLY | O_CLOEXEC), stays = ::open("/dev/null", O_RDONLY);
  ASSERT_GE(closes, 0);
  ASSERT_GE(stays, 0);
  LaunchOptions o = shell("echo run; exit 9", 2);  // what the ranks would run as new programs
  o.max_restarts = 1;
  o.fork_entry = [&](int argc, char** argv) {
    const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
    std::printf("argc %d %s %s, RANK %s LOCAL_RANK %s restart %s, %d threads, close-on-exec open %d, other open %d\n",
                argc, argv[0], argv[2], std::getenv("RANK"), std::getenv("LOCAL_RANK"), restart, at::get_num_threads(),
                ::fcntl(closes, F_GETFD) >= 0, ::fcntl(stays, F_GETFD) >= 0);
    return std::string(restart) == "0" && std::string(std::getenv("RANK")) == "1" ? 5 : 0;  // one failed attempt
  };
  const Outcome r = launch_capturing(o, dir);
  ::close(closes);
  ::close(stays);
  EXPECT_EQ(r.rc, 0) << r.log << r.out << r.err;
  EXPECT_NE(r.log.find("the ranks start as forks of the launcher"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("restart 1/1 after rank 1"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("exited with code 5"), std::string::npos) << r.log;
  EXPECT_EQ(r.out.find("] run\n"), std::string::npos) << r.out;
  for (int rank : {0, 1}) {
    for (int restart : {0, 1}) {
      const std::string line = fmt::format(
          "[rank {0}] argc 3 /bin/sh echo run; exit 9, RANK {0} LOCAL_RANK {0} restart {1}, {2} threads, "
          "close-on-exec open 0, other open 1\n",
          rank, restart, threads);
      EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
    }
  }
}

TEST(Launcher, ForkedRanksFallBackToExecWhileTheLauncherRunsAnotherThread) {
  const TempDir dir;
  std::promise<void> release;
  std::thread other([done = release.get_future()] { done.wait(); });
  LaunchOptions o = shell("echo exec $RANK", 2);
  o.fork_entry = [](int, char**) {
    std::puts("forked");
    return 0;
  };
  const Outcome r = launch_capturing(o, dir);
  release.set_value();
  other.join();
  EXPECT_EQ(r.rc, 0) << r.log;
  EXPECT_NE(r.out.find("[rank 1] exec 1"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("forked"), std::string::npos) << r.out;
  EXPECT_NE(r.log.find("starting the ranks with exec rather than as forks of the launcher: the launcher runs other "
                       "threads"),
            std::string::npos)
      << r.log;
}

TEST(Launcher, BindCoresGivesEachRankItsOwnSliceOfTheCpus) {
  const TempDir dir;
  const ScopedEnv test_dir("TEST_DIR", dir.str());
  cpu_set_t set;
  ASSERT_EQ(::sched_getaffinity(0, sizeof(set), &set), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  // More ranks than CPUs: refused before anything starts, naming the flag and the CPUs.
  LaunchOptions too_many = shell("exit 0", static_cast<int>(cpus.size()) + 1);
  too_many.bind_cores = true;
  try {
    launch(too_many);
    ADD_FAILURE() << "no error for more ranks than CPUs";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("--bind-cores: {} local ranks, but this process may run on {} CPU",
                                                     cpus.size() + 1, cpus.size())),
              std::string::npos)
        << e.what();
  }
  if (cpus.size() < 2) return;
  // Two ranks: each on its half, its threads included (the kernel's list of the rank's allowed CPUs).
  LaunchOptions o = shell("grep Cpus_allowed_list /proc/self/status | cut -f2 > $TEST_DIR/cpus_$RANK", 2);
  o.bind_cores = true;
  const Outcome r = launch_capturing(o, dir);
  ASSERT_EQ(r.rc, 0) << r.log;
  // The kernel's list format: "0-3,8".
  auto list = [](const std::vector<int>& c) {
    std::string out;
    for (size_t i = 0; i < c.size();) {
      size_t j = i;
      while (j + 1 < c.size() && c[j + 1] == c[j] + 1) ++j;
      if (!out.empty()) out += ',';
      out += j == i ? std::to_string(c[i]) : fmt::format("{}-{}", c[i], c[j]);
      i = j + 1;
    }
    return out;
  };
  for (int rank : {0, 1}) {
    const std::vector<int> mine(cpus.begin() + static_cast<std::ptrdiff_t>(cpus.size() * rank / 2),
                                cpus.begin() + static_cast<std::ptrdiff_t>(cpus.size() * (rank + 1) / 2));
    EXPECT_EQ(read_launcher_log(dir.path() / fmt::format("cpus_{}", rank)), list(mine) + "\n") << rank;
    EXPECT_NE(r.log.find(fmt::format("rank {} on CPU {}", rank, list(mine))), std::string::npos) << r.log;
  }
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
  // Steps of 0.25 s under a 0.5 s floor: until the second beat no step is known and the floor is the timeout, so the
  // first step must stay well inside it (with 0.4 s steps under a 0.3 s floor, a poll in the first step declared a
  // hang once on a loaded machine). The 1.2 s evaluation pause stays inside the derived 8 x 0.25 = 2 s.
  LaunchOptions o = shell(
      "beat() { echo \"$(date +%s.%N) $1\" > $TESSERA_HEARTBEAT_DIR/rank$RANK; }; "
      "i=0; while [ $i -lt 6 ]; do beat \"batch $i\"; sleep 0.25; i=$((i+1)); "
      "  if [ $i = 3 ]; then beat \"eval batch 1\"; sleep 1.2; fi; done; "
      "beat \"batch 6\"; date +%s.%N > $TEST_DIR/last_beat_$RANK; exec sleep 60",
      2);
  o.watchdog_timeout_seconds = 0.5;
  o.watchdog_step_multiple = 8;
  const Outcome r = launch_capturing(o, dir);
  EXPECT_EQ(r.rc, 124) << r.log;
  ASSERT_TRUE(fs::exists(dir.path() / "last_beat_0")) << "the job was stopped before its last beat:\n" << r.log;
  const double last_beat = std::stod(read_launcher_log(dir.path() / "last_beat_0"));
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  // The launcher returned after the derived timeout (8 x at least 0.25 s = 2 s) from the last beat, not after the
  // 0.5 s floor, nor after 8 x the 1.45 s the evaluation made of one interval.
  const double caught = now - last_beat;
  EXPECT_GT(caught, 1.9) << r.log;
  EXPECT_LT(caught, 11.0 * kScale) << r.log;
  const size_t at = r.log.find("hang: no rank made progress for ");
  ASSERT_NE(at, std::string::npos) << r.log;
  const std::string line = r.log.substr(at, r.log.find('\n', at) - at);
  std::printf("caught %.1f s after the last beat: %s\n", caught, line.c_str());
  EXPECT_NE(line.find(" x the longest step seen, 0."), std::string::npos) << line;
  EXPECT_NE(line.find("(timeout "), std::string::npos) << line;
  EXPECT_NE(r.log.find("watchdog after 8 x the longest step without progress (at least 0.5 s)"), std::string::npos)
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

}  // namespace tessera::testing::launcher_test
