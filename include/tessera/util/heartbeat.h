// Progress heartbeats for the launcher's watchdog (distributed/launcher.h, `train --watchdog-timeout`): each rank
// records what it is doing now (e.g. "batch 12", or "waiting in all_reduce of 4096 Float elements" while it blocks in a
// collective), so that when the job stops making progress the launcher can say which rank is stuck, and where.
//
// The record of rank R (the RANK environment variable, default 0) is the file $TESSERA_HEARTBEAT_DIR/rank{R}, one
// line, rewritten in place on every heartbeat:
//
//   <time> <status>\n      e.g. "1718000000.123 batch 12\n" or "1718000000.456 waiting in barrier\n"
//
// <time> is the Unix time in seconds (decimal; the fraction is optional), <status> the text given (newlines replaced
// by spaces, at most 1000 bytes). A status beginning with "waiting in " means the rank is blocked in a collective (or
// the rendezvous); anything else means it was last seen running on its own. The watchdog counts any change of the
// line as progress and ignores a read without a complete line (a rewrite in progress), so other writers (tests, shell
// scripts) may write the file with `echo "$(date +%s) step 3" > $TESSERA_HEARTBEAT_DIR/rank$RANK`.
//
// Without TESSERA_HEARTBEAT_DIR (read once, with RANK, on first use) every function here does nothing beyond checking
// a flag. With it, a heartbeat costs one small pwrite and ftruncate of a file kept open. Thread-safe: the record is
// per process, and the last writer wins.
#pragma once

#include <string>
#include <string_view>

namespace tessera::util {

// The environment variable naming the directory of the records (set by the launcher when its watchdog is on).
inline constexpr const char* kHeartbeatDirEnv = "TESSERA_HEARTBEAT_DIR";

// Records `status` and the time as this rank's heartbeat. Never throws; a record that cannot be written is skipped
// (the first failure to open it is logged once).
void heartbeat(std::string_view status);

// Marks a blocking wait: records "waiting in <what>" on construction and, on destruction, restores the status that
// was current before (or "running" if there was none) unless another heartbeat replaced "waiting in <what>" in the
// meantime (another thread's, which then stands). Nests.
class HeartbeatScope {
 public:
  explicit HeartbeatScope(std::string_view what);
  ~HeartbeatScope();
  HeartbeatScope(const HeartbeatScope&) = delete;
  HeartbeatScope& operator=(const HeartbeatScope&) = delete;

 private:
  bool active_ = false;
  std::string status_;    // "waiting in <what>"
  std::string previous_;  // the status to restore
};

namespace detail {
// Reads TESSERA_HEARTBEAT_DIR and RANK again (they are otherwise read once) and forgets the current status. For tests.
void reload_heartbeat_env();
// The status this process last recorded ("" when none, or when heartbeats are off). For tests.
std::string heartbeat_status();
}  // namespace detail

}  // namespace tessera::util
