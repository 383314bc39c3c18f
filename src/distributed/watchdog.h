// Internal: the launcher's watchdog. Reads the heartbeat records this node's ranks write (util/heartbeat.h) and
// decides when the job has stopped making progress, naming the rank that looks stuck and what every rank last did.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tessera::util {
class Nvml;
}

namespace tessera::dist::detail {

// The state letter of /proc/<pid>/stat ('R', 'S', 'D', 'T' stopped, 't' traced, 'Z', ...), or '?' when unreadable.
char process_state(pid_t pid);

// A hang the watchdog found.
struct Hang {
  std::string report;   // every rank's last status and its age, the suspects first
  std::string summary;  // one clause for the restart log: "no rank made progress for 30 s (suspect: rank 1)"
};

// Used by launch() from one thread. Not copyable (owns its directory).
class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;

  // Creates a fresh directory for the records under $TMPDIR (else /tmp); removes it, with the records, in the
  // destructor. `other_nodes`: the job has ranks on other nodes, which this watchdog does not see. `step_multiple`
  // > 0: the timeout is the larger of `timeout_seconds` and step_multiple x the longest step seen (from the times
  // and batch numbers of the ranks' "batch N" records, over every attempt). Throws Error when the directory cannot
  // be created.
  Watchdog(double timeout_seconds, bool other_nodes, double step_multiple = 0);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // The directory the ranks write to (their TESSERA_HEARTBEAT_DIR).
  const std::string& dir() const { return dir_; }

  // Starts watching a new attempt of the job whose local ranks are `ranks` (global rank numbers), started at `now`:
  // removes the previous attempt's records and forgets what was seen.
  void start(const std::vector<int>& ranks, Clock::time_point now);

  // Reads the records when a check is due (about once a second; more often for timeouts under 4 s). A rank makes
  // progress when its record changes. Returns the hang once no rank has made progress for the timeout since the last
  // change of any record, or, while no rank has written one yet, for 10 times `timeout_seconds` since the start.
  // `exited[i]`: ranks[i] (from start()) has exited; an exited rank is not stuck. `pids[i]` (optional): its process,
  // whose state the report gives when it is stopped (SIGSTOP, or a debugger): such a rank is the suspect whatever its
  // record says.
  std::optional<Hang> check(Clock::time_point now, const std::vector<bool>& exited,
                            const std::vector<pid_t>& pids = {});

  // The timeout now, in seconds: `timeout_seconds`, or step_multiple x the longest step seen when that is longer.
  double timeout() const;
  // The longest step seen so far, in seconds (0 before any rank has recorded two batches).
  double longest_step() const { return longest_step_; }

 private:
  struct Seen {
    int rank = 0;
    bool written = false;
    std::string line;  // the record's last complete line: "<time> <status>"
    Clock::time_point changed_at;
    int64_t batch = -1;  // the last "batch N" record's N, and its time (Unix seconds)
    double batch_time = 0;
  };
  void note_step(Seen& s);
  Hang describe(Clock::time_point now, const std::vector<bool>& exited, const std::vector<pid_t>& pids,
                double stalled_seconds, bool never);

  double timeout_;  // seconds: the timeout, or its floor with step_multiple_
  bool other_nodes_;
  double step_multiple_;
  double longest_step_ = 0;  // seconds
  std::string dir_;
  std::vector<Seen> seen_;
  Clock::time_point started_at_, next_check_;
  std::optional<Clock::time_point> last_progress_;
  std::unique_ptr<util::Nvml> nvml_;  // this node's GPUs, when it has an NVIDIA driver
};

}  // namespace tessera::dist::detail
