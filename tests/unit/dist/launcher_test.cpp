// The rank launcher with shell children: environment, exit codes, signals, output prefixes, bad options.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tessera/dist/launcher.h"
#include "tessera/util/error.h"

namespace fs = std::filesystem;
using tessera::dist::launch;
using tessera::dist::LaunchOptions;

namespace {

LaunchOptions shell(const std::string& script, int nproc) {
  LaunchOptions o;
  o.nproc_per_node = nproc;
  o.argv = {"/bin/sh", "-c", script};
  o.stop_grace_seconds = 1;
  return o;
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs launch() with our stdout redirected to a file; returns the exit code and what was printed.
std::pair<int, std::string> launch_capturing(const LaunchOptions& o) {
  const fs::path out = fs::temp_directory_path() / "launcher_out.txt";
  std::fflush(stdout);
  const int saved = dup(1);
  FILE* f = std::fopen(out.c_str(), "w");
  dup2(fileno(f), 1);
  const int rc = launch(o);
  std::fflush(stdout);
  dup2(saved, 1);
  close(saved);
  std::fclose(f);
  return {rc, read_text(out)};
}

}  // namespace

TEST(Launcher, GivesEveryRankTheTorchrunEnvironment) {
  const fs::path dir = fs::temp_directory_path() / "launcher_env";
  fs::remove_all(dir);
  fs::create_directories(dir);
  LaunchOptions o = shell(
      "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR "
      "$MASTER_PORT $TESSERA_LAUNCHED\" > " +
          dir.string() + "/$RANK",
      3);
  o.nnodes = 2;
  o.node_rank = 1;
  o.master_addr = "10.1.2.3";
  o.master_port = 31234;
  EXPECT_EQ(launch(o), 0);
  for (int local = 0; local < 3; ++local) {
    const int rank = 3 + local;
    EXPECT_EQ(read_text(dir / std::to_string(rank)),
              std::to_string(rank) + " 6 " + std::to_string(local) + " 3 1 10.1.2.3 31234 1\n");
  }
}

TEST(Launcher, PrefixesEachLineWithTheRank) {
  const auto [rc, text] = launch_capturing(shell("printf 'a\\nb\\n'; printf 'unterminated'", 2));
  EXPECT_EQ(rc, 0);
  for (const char* line : {"[rank 0] a\n", "[rank 0] b\n", "[rank 1] a\n", "[rank 1] unterminated\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << text;
  }
}

TEST(Launcher, AFailingRankStopsTheOthersAndGivesItsExitCode) {
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(launch(shell("if [ \"$RANK\" = 1 ]; then exit 3; fi; sleep 60", 3)), 3);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
}

TEST(Launcher, ARankKilledBySignalGives128PlusTheSignal) {
  const auto start = std::chrono::steady_clock::now();
  // Survivors ignore SIGTERM: the launcher must SIGKILL them after the grace period.
  EXPECT_EQ(launch(shell("trap '' TERM; if [ \"$RANK\" = 0 ]; then kill -9 $$; fi; sleep 60", 2)), 137);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
}

TEST(Launcher, AProgramThatCannotRunExits127) {
  LaunchOptions o;
  o.argv = {"/nonexistent/program"};
  EXPECT_EQ(launch(o), 127);
}

TEST(Launcher, RejectsBadOptions) {
  LaunchOptions o = shell("true", 0);
  EXPECT_THROW(launch(o), tessera::ConfigError);
  o = shell("true", 1);
  o.node_rank = 1;
  EXPECT_THROW(launch(o), tessera::ConfigError);
  o = shell("true", 1);
  o.argv.clear();
  EXPECT_THROW(launch(o), tessera::ConfigError);
}
