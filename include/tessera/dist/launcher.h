// The local launcher behind `train --nproc-per-node N` (torchrun's role): spawns the ranks of this node with the
// torchrun environment, relays their output with a rank prefix, forwards signals, and stops the job when one rank
// fails.
#pragma once

#include <string>
#include <vector>

namespace tessera::dist {

struct LaunchOptions {
  int nproc_per_node = 1;                 // local ranks to spawn (>= 1)
  int nnodes = 1;                         // nodes in the job (>= 1)
  int node_rank = 0;                      // this node's index, in [0, nnodes)
  std::string master_addr = "127.0.0.1";  // rendezvous host (node 0)
  int master_port = 29500;                // rendezvous TCP port
  std::vector<std::string> argv;  // program and arguments every rank runs (argv[0]: the executable, found in PATH)
  double stop_grace_seconds = 5;  // seconds; after a failure: SIGTERM the other ranks, SIGKILL those left after this
  bool prefix_output = true;      // prefix each line a rank prints with "[rank R] "
};

// Spawns nproc_per_node processes running argv with RANK = node_rank * nproc_per_node + local rank, WORLD_SIZE =
// nnodes * nproc_per_node, LOCAL_RANK, LOCAL_WORLD_SIZE = nproc_per_node, GROUP_RANK = NODE_RANK = node_rank,
// MASTER_ADDR, MASTER_PORT, TESSERA_LAUNCHED=1 and, unless set, OMP_NUM_THREADS = online cores / nproc_per_node (at
// least 1), on top of our environment. Relays each rank's stdout to ours and its stderr to ours line by line, whole
// lines only (a line longer than 1 MiB goes out in pieces).
//
// Each rank runs in a session of its own (as under torchrun), so stopping a rank signals its whole process group,
// including what it started; terminal signals reach the ranks through the launcher, which forwards SIGINT, SIGTERM and
// SIGHUP (and stops the job as below, with that signal first), and a rank gets SIGKILL if the launcher dies.
//
// Returns 0 when every rank exits 0. When a rank exits non-zero or dies by a signal, logs one error naming the rank,
// its pid and the exit code or signal (e.g. "rank 1 (pid 1234) was killed by signal 9 (Killed)"), sends SIGTERM to
// every rank's process group, SIGKILL after stop_grace_seconds, and returns the first failed rank's exit code (128 +
// signal for a signal; 128 + the forwarded signal when stopped by one). A program that cannot be executed makes its
// rank exit 127, which is reported with the reason. When the launch ends, whatever the ranks left running in their
// process groups is killed. Throws ConfigError for invalid options and Error if it cannot create a process.
//
// Thread-safety: call from one thread at a time. While it runs, it owns the process's SIGINT, SIGTERM and SIGHUP
// handlers (a signal ignored on entry, e.g. SIGHUP under nohup, stays ignored and is not forwarded) and ignores
// SIGPIPE (a closed stdout drops the ranks' output instead of killing the launcher); the previous dispositions are
// restored when it returns, and the ranks start with them.
int launch(const LaunchOptions& options);

}  // namespace tessera::dist
