// The local launcher behind `train --nproc-per-node N` (torchrun's role): spawns the ranks of this node with the
// torchrun environment, relays their output with a rank prefix, forwards signals, and stops the job when one rank
// fails. Thread-safety: call from one thread; it installs signal handlers while it runs.
#pragma once

#include <string>
#include <vector>

namespace tessera::dist {

struct LaunchOptions {
  int nproc_per_node = 1;  // local ranks to spawn
  int nnodes = 1;          // nodes in the job
  int node_rank = 0;       // this node's index
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::vector<std::string> argv;  // program and arguments every rank runs (argv[0]: the executable)
  double stop_grace_seconds = 5;  // after a failure: SIGTERM the other ranks, SIGKILL those left after this
  bool prefix_output = true;      // prefix each line a rank prints with "[rank R] "
};

// Spawns nproc_per_node processes running argv with RANK = node_rank * nproc_per_node + local rank, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, NODE_RANK, MASTER_ADDR, MASTER_PORT, TESSERA_LAUNCHED=1 and, unless set,
// OMP_NUM_THREADS = online cores / nproc_per_node (at least 1); forwards
// SIGINT, SIGTERM and SIGHUP to them; relays their stdout and stderr line by line. Returns 0 when every rank exits 0.
// When a rank exits non-zero or dies by a signal, logs one error naming the rank, its pid and the exit code or
// signal, stops the others and returns that rank's exit code (128 + signal for a signal). Throws ConfigError for
// invalid options.
int launch(const LaunchOptions& options);

}  // namespace tessera::dist
