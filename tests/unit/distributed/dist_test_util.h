// Helpers shared by the multi-process tests of the communicator, the sharding engine and the trainer
// (collectives_test.cpp, dist_training_test.cpp): processes are spawned through dist::launch, as copies of this test
// binary running a worker test (DistWorker.*), or the `train` tool.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tessera/distributed/launcher.h"

namespace tessera::testing {

// Whether this process is a worker that a test launched (the tests that launch skip in it).
inline bool is_worker() {
  return std::getenv("TESSERA_DIST_WORKER") != nullptr;
}

inline int free_port() {
  return dist::free_local_port();
}

inline std::string read_dist_log(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs the worker test `name` of this binary on `nproc` ranks; returns the launcher's exit code.
inline int launch_workers(const std::string& name, int nproc) {
  dist::LaunchOptions o;
  o.nproc_per_node = nproc;
  o.master_port = 0;  // the launcher binds the port (no probe that another process can race)
  o.argv = {std::filesystem::read_symlink("/proc/self/exe").string(), "--gtest_filter=DistWorker." + name};
  setenv("TESSERA_DIST_WORKER", "1", 1);
  // A sharded run of this binary (GTEST_TOTAL_SHARDS, as tools/sanitize.sh and tools/gpu_check.sh use) must not
  // shard the workers too: each would run its test only in the shard that happens to hold it.
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* var : {"GTEST_SHARD_INDEX", "GTEST_TOTAL_SHARDS", "GTEST_SHARD_STATUS_FILE"}) {
    if (const char* v = std::getenv(var)) {
      saved.emplace_back(var, v);
      unsetenv(var);
    }
  }
  const int rc = dist::launch(o);
  for (const auto& [var, v] : saved) setenv(var.c_str(), v.c_str(), 1);
  unsetenv("TESSERA_DIST_WORKER");
  return rc;
}

}  // namespace tessera::testing
