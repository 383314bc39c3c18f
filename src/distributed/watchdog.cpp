// The launcher's watchdog: polls the ranks' heartbeat records, notices when none changes for the timeout, and
// describes what each rank was last doing.
#include "watchdog.h"

#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string_view>
#include <system_error>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessera/util/error.h"
#include "tessera/util/nvml.h"

namespace tessera::dist::detail {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kWaitingIn = "waiting in ";
// While no rank has written a record, the watchdog waits this many timeouts (start-up: loading, building, rendezvous).
constexpr double kFirstBeatAllowance = 10;

double seconds(Watchdog::Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

std::string format_seconds(double s) {
  return s < 10 ? fmt::format("{:.1f} s", s) : fmt::format("{:.0f} s", s);
}

// The record's first line when it is complete (a rewrite in progress, or a missing file, gives nothing).
std::optional<std::string> read_record(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  char buf[4096];
  in.read(buf, sizeof(buf));
  const std::string_view text(buf, static_cast<size_t>(in.gcount()));
  const size_t nl = text.find('\n');
  if (nl == std::string_view::npos) return std::nullopt;
  return std::string(text.substr(0, nl));
}

// The status part of "<time> <status>" (the whole line if it does not start with a number).
std::string_view status_of(std::string_view line) {
  const size_t space = line.find(' ');
  if (space == std::string_view::npos) return line;
  const std::string time(line.substr(0, space));
  char* end = nullptr;
  std::strtod(time.c_str(), &end);
  return end != time.c_str() && *end == '\0' ? line.substr(space + 1) : line;
}

}  // namespace

// The state letter of /proc/<pid>/stat ('R', 'S', 'D', 'T' stopped, 't' traced, 'Z', ...), or '?' when unreadable.
char process_state(pid_t pid) {
  if (pid <= 0) return '?';
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(in, line)) return '?';
  const size_t close = line.rfind(')');  // the command name, in parentheses, may hold spaces
  return close != std::string::npos && close + 2 < line.size() ? line[close + 2] : '?';
}

Watchdog::Watchdog(double timeout_seconds, bool other_nodes, double step_multiple)
    : timeout_(timeout_seconds), other_nodes_(other_nodes), step_multiple_(step_multiple) {
  std::error_code ec;
  fs::path tmp = fs::temp_directory_path(ec);
  if (ec) tmp = "/tmp";
  std::string tmpl = (tmp / "tessera-heartbeat-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) {
    throw Error("launch",
                fmt::format("cannot create the watchdog's heartbeat directory {}: {}", tmpl, std::strerror(errno)));
  }
  dir_ = tmpl;
  nvml_ = util::Nvml::open(nullptr);  // a GPU node's utilisation goes into hang reports; none on other machines
}

Watchdog::~Watchdog() {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

void Watchdog::start(const std::vector<int>& ranks, Clock::time_point now) {
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) fs::remove(it->path(), ec);
  seen_.clear();
  for (int r : ranks) seen_.push_back({r, false, {}, now, -1, 0});
  started_at_ = now;
  next_check_ = now;
  last_progress_.reset();
}

std::optional<Hang> Watchdog::check(Clock::time_point now, const std::vector<bool>& exited,
                                    const std::vector<pid_t>& pids) {
  if (now < next_check_) return std::nullopt;
  const double interval = std::clamp(timeout_ / 4, 0.1, 1.0);
  next_check_ = now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(interval));
  for (Seen& s : seen_) {
    std::optional<std::string> line = read_record(fmt::format("{}/rank{}", dir_, s.rank));
    if (!line || (s.written && *line == s.line)) continue;
    s.written = true;
    s.line = std::move(*line);
    s.changed_at = now;
    last_progress_ = now;
    note_step(s);
  }
  // Ranks that are all done are not hanging (the launcher is only reading their last output).
  if (std::all_of(exited.begin(), exited.end(), [](bool e) { return e; })) return std::nullopt;
  if (last_progress_) {
    const double idle = seconds(now - *last_progress_);
    if (idle >= timeout()) return describe(now, exited, pids, idle, false);
  } else {
    const double idle = seconds(now - started_at_);
    if (idle >= kFirstBeatAllowance * timeout_) return describe(now, exited, pids, idle, true);
  }
  return std::nullopt;
}

double Watchdog::timeout() const {
  return std::max(timeout_, step_multiple_ * longest_step_);
}

// A "batch N" record after the same rank's "batch M" (M < N): the time per batch between them (the records' own
// times, so the poll's granularity does not count) may be the longest step yet. A record of anything else than a
// batch or a collective wait within one (an evaluation batch, say) starts the next measurement afresh, so that an
// evaluation does not count as a step.
void Watchdog::note_step(Seen& s) {
  const std::string_view status = status_of(s.line);
  constexpr std::string_view kBatch = "batch ";
  if (status.substr(0, kWaitingIn.size()) == kWaitingIn) return;
  int64_t batch = -1;
  if (status.size() < s.line.size() && status.substr(0, kBatch.size()) == kBatch) {
    const std::string number(status.substr(kBatch.size()));
    char* end = nullptr;
    batch = std::strtoll(number.c_str(), &end, 10);
    if (end == number.c_str()) batch = -1;
  }
  if (batch < 0) {
    s.batch = -1;
    return;
  }
  if (batch == s.batch) return;  // the same batch's status restored after a collective wait
  const double time = std::strtod(s.line.c_str(), nullptr);
  if (s.batch >= 0 && batch > s.batch && time >= s.batch_time) {
    longest_step_ = std::max(longest_step_, (time - s.batch_time) / static_cast<double>(batch - s.batch));
  }
  s.batch = batch;
  s.batch_time = time;
}

Hang Watchdog::describe(Clock::time_point now, const std::vector<bool>& exited, const std::vector<pid_t>& pids,
                        double stalled_seconds, bool never) {
  std::vector<std::string> suspects, others;
  std::vector<int> suspect_ranks;
  bool waiting = false;
  for (size_t i = 0; i < seen_.size(); ++i) {
    const Seen& s = seen_[i];
    const std::string age = format_seconds(seconds(now - s.changed_at));
    const char state = i < pids.size() ? process_state(pids[i]) : '?';
    if (i < exited.size() && exited[i]) {
      others.push_back(fmt::format("rank {} has exited", s.rank));
    } else if (state == 'T' || state == 't') {  // its record cannot change: the process does not run
      suspects.push_back(fmt::format(
          "rank {} (pid {}) is stopped (process state {}: SIGSTOP or a debugger), last {}", s.rank, pids[i], state,
          s.written ? fmt::format("\"{}\" ({} ago)", status_of(s.line), age) : std::string("without a heartbeat")));
      suspect_ranks.push_back(s.rank);
    } else if (!s.written) {
      suspects.push_back(fmt::format("rank {} has not written a heartbeat ({} since the start)", s.rank, age));
      suspect_ranks.push_back(s.rank);
    } else if (const std::string_view status = status_of(s.line); status.substr(0, kWaitingIn.size()) == kWaitingIn) {
      others.push_back(fmt::format("rank {} is {} ({})", s.rank, status, age));
      waiting = true;
    } else {
      suspects.push_back(
          fmt::format("rank {} is stuck outside any collective (last: \"{}\", {} ago)", s.rank, status, age));
      suspect_ranks.push_back(s.rank);
    }
  }
  Hang h;
  const std::string head =
      never ? fmt::format("no rank wrote a heartbeat within {} of starting ({} x the {} timeout)",
                          format_seconds(stalled_seconds), kFirstBeatAllowance, format_seconds(timeout_))
            : fmt::format("no rank made progress for {}{}", format_seconds(stalled_seconds),
                          step_multiple_ * longest_step_ > timeout_
                              ? fmt::format(" (timeout {}: {:g} x the longest step seen, {:.2f} s)",
                                            format_seconds(timeout()), step_multiple_, longest_step_)
                              : std::string());
  const std::string elsewhere = other_nodes_ ? " (the stuck rank may be on another node)" : "";
  h.report = head;
  if (suspects.empty() && waiting) {
    h.report +=
        fmt::format("; every rank{} is waiting in a collective{}", other_nodes_ ? " on this node" : "", elsewhere);
  }
  for (const std::string& part : suspects) h.report += "; " + part;
  for (const std::string& part : others) h.report += "; " + part;
  if (nvml_) {
    try {
      std::vector<double> utilization;
      for (int i = 0, n = nvml_->device_count(); i < n; ++i)
        utilization.push_back(nvml_->read_index(i).utilization_percent);
      if (const std::string gpus = util::describe_gpu_hang(utilization); !gpus.empty()) h.report += "; " + gpus;
    } catch (const Error& e) {
      h.report += fmt::format("; no GPU utilisation: {}", e.what());
    }
  }
  if (!suspect_ranks.empty()) {
    h.summary = fmt::format("{} (suspect: rank {})", head, fmt::join(suspect_ranks, ", "));
  } else {
    h.summary = fmt::format("{} (every rank waiting in a collective{})", head, elsewhere);
  }
  return h;
}

}  // namespace tessera::dist::detail
