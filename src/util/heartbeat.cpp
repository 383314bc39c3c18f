// Progress heartbeats: this rank's status line in $TESSERA_HEARTBEAT_DIR/rank{R}, rewritten in place (pwrite of the
// new line at offset 0, then ftruncate to its length) through a file descriptor kept open.
#include "tessera/util/heartbeat.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace tessera::util {
namespace {

constexpr size_t kMaxStatusBytes = 1000;
constexpr std::string_view kWaitingIn = "waiting in ";

// The process's record. Created on first use and never destroyed (a heartbeat may come from a thread that outlives
// static destruction).
class Recorder {
 public:
  Recorder() { configure(); }

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  void reload() {
    std::lock_guard<std::mutex> lock(mu_);
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    status_.clear();
    configure();
  }

  void record(std::string_view status) {
    std::lock_guard<std::mutex> lock(mu_);
    write_locked(status);
  }

  // Records "waiting in <what>"; returns the status it replaced, and the new one.
  std::pair<std::string, std::string> enter(std::string_view what) {
    std::string status = fmt::format("{}{}", kWaitingIn, what);
    std::lock_guard<std::mutex> lock(mu_);
    std::string previous = status_;
    write_locked(status);
    return {std::move(previous), status_};
  }

  // Restores `previous` if the record still says `status` (no other heartbeat came in between).
  void leave(const std::string& status, const std::string& previous) {
    std::lock_guard<std::mutex> lock(mu_);
    if (status_ == status) write_locked(previous.empty() ? std::string_view("running") : std::string_view(previous));
  }

  std::string status() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }

 private:
  // Under mu_ (or from the constructor).
  void configure() {
    enabled_ = false;
    const char* dir = std::getenv(kHeartbeatDirEnv);
    if (dir == nullptr || *dir == '\0') return;
    long rank = 0;
    if (const char* r = std::getenv("RANK"); r != nullptr && *r != '\0') rank = std::strtol(r, nullptr, 10);
    path_ = fmt::format("{}/rank{}", dir, rank);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      spdlog::warn("[heartbeat] cannot open {}: {}; no heartbeats from this process", path_, std::strerror(errno));
      return;
    }
    enabled_ = true;
  }

  void write_locked(std::string_view status) {
    status_.assign(status.substr(0, kMaxStatusBytes));
    std::replace(status_.begin(), status_.end(), '\n', ' ');
    std::replace(status_.begin(), status_.end(), '\r', ' ');
    if (fd_ < 0) return;
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    const std::string line = fmt::format("{}.{:03d} {}\n", ms / 1000, ms % 1000, status_);
    // The new line first, then the cut: a reader sees the old line, the new one, or the new one followed by the rest
    // of the old; the first line is complete in every case but a torn write, which has no newline yet.
    if (::pwrite(fd_, line.data(), line.size(), 0) == static_cast<ssize_t>(line.size())) {
      (void)!::ftruncate(fd_, static_cast<off_t>(line.size()));
    }
  }

  std::mutex mu_;
  std::atomic<bool> enabled_{false};
  int fd_ = -1;
  std::string path_;
  std::string status_;
};

Recorder& recorder() {
  static Recorder* r = new Recorder();
  return *r;
}

}  // namespace

void heartbeat(std::string_view status) {
  Recorder& r = recorder();
  if (r.enabled()) r.record(status);
}

HeartbeatScope::HeartbeatScope(std::string_view what) {
  Recorder& r = recorder();
  if (!r.enabled()) return;
  std::tie(previous_, status_) = r.enter(what);
  active_ = true;
}

HeartbeatScope::~HeartbeatScope() {
  if (active_) recorder().leave(status_, previous_);
}

namespace detail {

void reload_heartbeat_env() {
  recorder().reload();
}

std::string heartbeat_status() {
  return recorder().status();
}

}  // namespace detail
}  // namespace tessera::util
