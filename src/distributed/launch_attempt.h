// Internal: what the launcher's static and elastic paths share (launcher.cpp runs one attempt of the job on this
// node; elastic.cpp runs the rendezvous host and its agents around such attempts).
#pragma once

#include <csignal>
#include <functional>
#include <optional>
#include <string>

#include "tessera/distributed/launcher.h"

namespace tessera::dist::detail {

class Watchdog;
class SignalGuard;  // the launcher's signal handling while it runs (launcher.cpp)

// The last signal the launcher caught (0: none); its handler sets it.
extern volatile sig_atomic_t g_pending_signal;
// Upper bound of the grace period actually waited (keeps the time arithmetic finite), in seconds: a week.
inline constexpr double kMaxGraceSeconds = 7 * 24 * 3600;

// How one attempt of the job ended.
struct Ending {
  // kStopped: an elastic job's rendezvous stopped the ranks because another node failed.
  enum class Kind { kSuccess, kRankFailed, kCannotRun, kHang, kSignal, kPreempted, kStopped };
  Kind kind = Kind::kSuccess;
  int code = 0;              // the launch's exit code for it
  std::string cause;         // "rank 1 (pid 1234) exited with code 3", "a hang: ...", "signal 15 (Terminated)"
  bool interrupted = false;  // a signal was forwarded to the ranks (also while stopping them after a failure)
};

// Called about every poll interval while an attempt is undecided: a cause when the rendezvous says to stop (another
// node failed), which stops the ranks.
using PeerCheck = std::function<std::optional<std::string>()>;

// One attempt of the job on this node: spawns the ranks of `o` (its node_rank, nnodes and master) and runs them.
// Returns once every process of the ranks' groups is gone.
Ending run_attempt(const LaunchOptions& o, int restarts, const SignalGuard& signals, Watchdog* watchdog,
                   const PeerCheck& peers);

// Elastic jobs (elastic.cpp): the launcher with --rdzv-host, and every other node's. Each returns the launch's exit
// code (distributed/launcher.h).
int run_rendezvous_host(const LaunchOptions& o, const SignalGuard& signals, Watchdog* watchdog);
int run_agent(const LaunchOptions& o, const SignalGuard& signals, Watchdog* watchdog);

}  // namespace tessera::dist::detail
