// Preemption signals: the signals a scheduler sends before it stops a job (SIGTERM from Slurm and Kubernetes, or the
// one chosen with Slurm's `--signal`, often SIGUSR1). While a PreemptionHandler lives, those signals only set a flag
// that the trainer reads between batches: every rank finishes its current batch, the ranks agree, save a
// checkpoint and exit with kExitPreempted, and a requeued job resumes from that checkpoint (docs/training.md).
#pragma once

#include <csignal>
#include <string>
#include <vector>

namespace tessera::util {

// The exit code of a run that stopped for a preemption signal after saving its checkpoint: sysexits.h's EX_TEMPFAIL
// ("a temporary failure; the user is invited to retry"). The launcher treats it as the end of the job, not a failure.
inline constexpr int kExitPreempted = 75;
// `train`'s exit code after the health monitor (response: stop) found a straggler or a silent failure and the job
// saved a checkpoint: a failure to the supervisor, which restarts the job.
inline constexpr int kExitUnhealthy = 76;
// A rank's exit code that marks its node bad (the health monitor's `response: exclude_node`): an elastic job's
// launcher excludes the node and the job restarts without it (distributed/launcher.h).
inline constexpr int kExitNodeBad = 77;

// The signal number for a name: "SIGTERM", "TERM", "sigusr1" (TERM, INT, HUP, USR1, USR2 and QUIT are accepted).
// Throws ConfigError naming the value otherwise.
int parse_signal_name(const std::string& name);
// "SIGTERM" for SIGTERM.
std::string signal_name(int signal);

// Installs handlers for `signals` that record the first one received (async-signal-safe), and restores the previous
// dispositions on destruction. A signal ignored on entry (SIG_IGN, e.g. SIGHUP under nohup) stays ignored. One
// installation per process: a handler made while another lives installs nothing and shares the first's flag.
// Thread-safe to query from any thread.
class PreemptionHandler {
 public:
  explicit PreemptionHandler(std::vector<int> signals);
  ~PreemptionHandler();
  PreemptionHandler(const PreemptionHandler&) = delete;
  PreemptionHandler& operator=(const PreemptionHandler&) = delete;

  // The first preemption signal received since construction; 0 for none.
  static int received();
  const std::vector<int>& signals() const { return signals_; }

 private:
  std::vector<int> signals_;
  std::vector<struct sigaction> previous_;
  bool owner_ = false;  // this one installed the handlers
};

}  // namespace tessera::util
