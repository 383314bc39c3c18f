// The local launcher behind `train --nproc-per-node N` (torchrun's role): spawns the ranks of this node with the
// torchrun environment, relays their output with a rank prefix, forwards signals, stops the job when one rank fails,
// and, as a supervisor, restarts it after a failure or a hang its watchdog noticed.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace tessera::dist {

struct LaunchOptions {
  int nproc_per_node = 1;                 // local ranks to spawn (>= 1)
  int nnodes = 1;                         // nodes in the job (>= 1)
  int node_rank = 0;                      // this node's index, in [0, nnodes)
  std::string master_addr = "127.0.0.1";  // rendezvous host (node 0)
  // Rendezvous TCP port. 0 (one node, not elastic): the launcher binds a free port itself and hands the listening
  // socket to rank 0's store (TESSERA_MASTER_LISTEN_FD), so no other process can take the port between its choice and
  // its use, as a probed "free" port can be (torchrun --standalone).
  int master_port = 29500;
  int master_listen_fd = -1;      // internal: the socket launch() bound for master_port 0
  std::vector<std::string> argv;  // program and arguments every rank runs (argv[0]: the executable, found in PATH)
  // Ranks as forks of the launcher (`train --fork-ranks`): when set, each rank starts as a fork of this process that
  // calls fork_entry(argc, argv) with `argv` above and the rank's environment, and exits with what it returns, instead
  // of exec'ing argv. A rank then skips the program's start-up (LibTorch's static initialization: about 0.5 s of CPU
  // and 500 MB of page faults per rank, at every start and restart). Set it only when argv runs this same program and
  // fork_entry does what its main would. The launcher falls back to exec, logging why, while it cannot fork safely
  // (it runs more than one thread, or has loaded the CUDA driver). A forked rank's /proc/PID/environ and cmdline show
  // the launcher's, not the rank's.
  std::function<int(int argc, char** argv)> fork_entry;
  // Binds local rank i, and every thread it starts, to the i-th of nproc_per_node equal slices of the CPUs this
  // process may run on, in order (`train --bind-cores`, as DeepSpeed's --bind_cores_to_rank): no rank's threads then
  // run on another rank's cores. Needs at least one CPU per local rank.
  bool bind_cores = false;
  double stop_grace_seconds = 5;  // seconds; after a failure: SIGTERM the other ranks, SIGKILL those left after this
  bool prefix_output = true;      // prefix each line a rank prints with "[rank R] "
  // Supervisor: restart the job (all local ranks) up to this many times after a rank fails or the job hangs (>= 0;
  // 0: never, as before). The ranks resume by themselves (the trainer's `autoresume: true`).
  int max_restarts = 0;
  // Watchdog: seconds without progress (no rank's heartbeat record changed, see util/heartbeat.h) after which the job
  // counts as hung (> 0; 0: no watchdog). Set it above the longest stretch a healthy job spends without a heartbeat
  // (a batch, an evaluation, a checkpoint save between collectives).
  double watchdog_timeout_seconds = 0;
  // Watchdog with a timeout derived from the job's own pace (> 0): the timeout is the larger of
  // watchdog_timeout_seconds (kDerivedWatchdogFloorSeconds when that is 0) and this multiple of the longest step the
  // ranks' "batch N" heartbeats have shown, so that it grows with the job's steps; 0: off.
  double watchdog_step_multiple = 0;
  // Signals the ranks treat as preemption (the recipe's preemption_signals, util/preemption.h): the launcher forwards
  // one to each rank and waits for them to save a checkpoint and exit util::kExitPreempted, with no deadline of its
  // own; a second signal stops them as any other. A rank exiting util::kExitPreempted (it received the signal
  // itself, e.g. from Slurm) is not a failure. Either way the launch returns util::kExitPreempted, without a restart.
  std::vector<int> preemption_signals;

  // Elastic job (torchrun's --nnodes MIN:MAX; docs/distributed.md#elastic-jobs): min_nodes > 0 makes the job
  // elastic. One launcher (rdzv_host) runs the rendezvous at rdzv_endpoint and is node 0; every other node's launcher
  // joins it there. Each attempt of the job runs on the nodes that joined (at most max_nodes), which get their node
  // ranks, nnodes and MASTER_ADDR (the endpoint's host) from the rendezvous; nnodes and node_rank are not used. A node
  // whose launcher is lost, or whose ranks exit util::kExitNodeBad, is excluded, and the job restarts without it (the
  // ranks resume from the latest checkpoint, resharded) while at least min_nodes remain.
  int min_nodes = 0;
  int max_nodes = 0;
  std::string rdzv_endpoint;          // "HOST:PORT" of the rendezvous
  bool rdzv_host = false;             // this launcher runs the rendezvous (on the endpoint's port)
  std::string node_id;                // this node's name in the job (default: the host name)
  double rdzv_timeout_seconds = 600;  // waiting for min_nodes nodes, or for the rendezvous host to answer
  double rdzv_last_call_seconds = 3;  // first attempt: once min_nodes have joined, wait this long for more
};

// The variable naming, in rank 0 of a launch with master_port 0, the descriptor of the rendezvous's bound listening
// socket (Communicator::connect takes it over for the store).
inline constexpr const char* kMasterListenFdEnv = "TESSERA_MASTER_LISTEN_FD";

// The timeout's floor under `watchdog_step_multiple` when no watchdog_timeout_seconds is given: long enough for a first
// checkpoint save or evaluation before the watchdog has seen one.
inline constexpr double kDerivedWatchdogFloorSeconds = 60;

// The exit code of a launch that ended because its watchdog found the job hung (as timeout(1)'s).
inline constexpr int kLaunchHangExitCode = 124;

// Spawns nproc_per_node processes running argv with RANK = node_rank * nproc_per_node + local rank, WORLD_SIZE =
// nnodes * nproc_per_node, LOCAL_RANK, LOCAL_WORLD_SIZE = nproc_per_node, GROUP_RANK = NODE_RANK = node_rank,
// MASTER_ADDR, MASTER_PORT, TESSERA_LAUNCHED=1, TORCHELASTIC_RESTART_COUNT (0 on the first start, k on the k-th
// restart), TORCHELASTIC_MAX_RESTARTS = max_restarts, with the watchdog TESSERA_HEARTBEAT_DIR, and, unless set,
// OMP_NUM_THREADS = online cores / nproc_per_node (at least 1), on top of our environment. Relays each rank's stdout to
// ours and its stderr to ours line by line, whole lines only (a line longer than 1 MiB goes out in pieces).
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
// Supervisor: when the job fails as above or hangs, and fewer than max_restarts restarts were made, the launcher
// waits until every process of every rank's process group is gone (so that the rendezvous port is free), logs one
// line with the count and the cause (e.g. "restart 1/3 after rank 1 (pid 1234) was killed by signal 9 (Killed)" or
// "restart 1/3 after a hang: no rank made progress for 30 s (suspect: rank 1)"), and spawns every rank again with the
// same environment but TORCHELASTIC_RESTART_COUNT. It returns 0 as soon as one attempt succeeds, and the last
// attempt's exit code once the restarts are used up. A forwarded signal stops the job without a restart (the return
// value is as above), and so does a program that cannot be executed (127).
//
// Watchdog (watchdog_timeout_seconds > 0 or watchdog_step_multiple > 0): the ranks get TESSERA_HEARTBEAT_DIR, a fresh
// directory under $TMPDIR (removed at the end), and write their progress there (util/heartbeat.h: the trainer after
// each batch, the communicator around each collective wait). About once a second the launcher reads the records. When
// none has changed for watchdog_timeout_seconds (counted from the last change of any rank's record; before any rank has
// written one, from the start of the attempt but with 10 times the timeout), it logs an error naming each rank's last
// status and its age and the suspects, the ranks not waiting in a collective (e.g. "hang: no rank made progress for
// 30 s; rank 1 is stuck outside any collective (last: "batch 12", 31 s ago); rank 0 is waiting in all_reduce of 1
// Double elements (31 s)"), stops every rank as after a failure, and restarts the job, or returns kLaunchHangExitCode
// (124) when no restarts are left. The watchdog sees this node's ranks only: with several nodes, a rank stuck on
// another node shows here as every local rank waiting in a collective.
//
// Thread-safety: call from one thread at a time. While it runs, it owns the process's SIGINT, SIGTERM and SIGHUP
// handlers (a signal ignored on entry, e.g. SIGHUP under nohup, stays ignored and is not forwarded) and ignores
// SIGPIPE (a closed stdout drops the ranks' output instead of killing the launcher); the previous dispositions are
// restored when it returns, and the ranks start with them.
//
// Elastic (min_nodes > 0): as above on every node, with a rendezvous between attempts. The rendezvous host waits until
// max_nodes launchers have joined, or min_nodes have and the last call has passed, then starts an attempt on them
// (node ranks in joining order, the host first; nodes beyond max_nodes wait as spares). When a node fails (a rank
// fails or hangs, or the node's launcher is lost), the host tells every other node to stop its ranks, excludes the
// lost nodes and those whose ranks exited util::kExitNodeBad (logging the list), and, within max_restarts, starts the
// next attempt at once on the nodes left and any that joined meanwhile, on the new world size (the last call is for
// the first attempt only). With fewer than min_nodes it
// waits up to rdzv_timeout_seconds for more, then gives up naming the excluded nodes. When the job ends, every
// launcher returns the job's exit code; an excluded node's returns util::kExitNodeBad. The host is not excluded: if
// it is lost the job is (as with torchrun's c10d rendezvous), and the other launchers return 1.
int launch(const LaunchOptions& options);

// A TCP port on 127.0.0.1 that nobody listens on now (the kernel's choice), for a local job's master_port. Another
// process may take it before the job binds it; for tests and benchmarks on one machine.
int free_local_port();

}  // namespace tessera::dist
