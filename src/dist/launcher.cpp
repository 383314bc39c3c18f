// Rank launcher: fork/exec of the local ranks (each in its own session, as torchrun does), line-by-line output relay
// through poll(), signal forwarding, and stopping the job when a rank fails.
#include "tessera/dist/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "tessera/util/error.h"

extern char** environ;

namespace tessera::dist {
namespace {

using Clock = std::chrono::steady_clock;

// How long to keep reading output after every rank has exited (a process a rank left behind may hold its pipes).
constexpr auto kDrainTime = std::chrono::seconds(1);
// Upper bound of the grace period actually waited (keeps the time arithmetic finite), in seconds: a week.
constexpr double kMaxGraceSeconds = 7 * 24 * 3600;
// How often the ranks are checked for exits and our pending signals handled (poll() also wakes on output).
constexpr auto kPollInterval = std::chrono::milliseconds(50);
// Longest line kept whole; a longer one (binary output, a progress bar without newlines) is relayed in pieces.
constexpr size_t kMaxLineBytes = size_t{1} << 20;
// Signals forwarded to the ranks, and SIGPIPE, ignored while we run so that a closed stdout cannot kill the launcher
// and orphan the ranks.
constexpr std::array<int, 4> kHandledSignals = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};

volatile sig_atomic_t g_pending_signal = 0;
void remember_signal(int sig) {
  g_pending_signal = sig;
}

// Installs the launcher's signal handling for its lifetime; restores the previous dispositions after. A forwarded
// signal that was ignored on entry stays ignored (as in shells and Python): under nohup, a hangup must not stop the
// job.
class SignalGuard {
 public:
  SignalGuard() {
    g_pending_signal = 0;
    for (size_t i = 0; i < kHandledSignals.size(); ++i) {
      ::sigaction(kHandledSignals[i], nullptr, &old_[i]);
      struct sigaction sa {};
      sigemptyset(&sa.sa_mask);
      if (kHandledSignals[i] == SIGPIPE) {
        sa.sa_handler = SIG_IGN;
      } else if (old_[i].sa_handler != SIG_IGN) {
        sa.sa_handler = remember_signal;
      } else {
        continue;
      }
      ::sigaction(kHandledSignals[i], &sa, nullptr);
    }
  }
  ~SignalGuard() { restore(); }
  SignalGuard(const SignalGuard&) = delete;
  SignalGuard& operator=(const SignalGuard&) = delete;

  // Puts back the caller's dispositions (also in a forked child, before exec: async-signal-safe).
  void restore() const {
    for (size_t i = 0; i < kHandledSignals.size(); ++i) ::sigaction(kHandledSignals[i], &old_[i], nullptr);
  }

 private:
  std::array<struct sigaction, kHandledSignals.size()> old_{};
};

// One of a rank's output pipes and the part of a line read from it so far.
struct Stream {
  int fd = -1;
  int to = 1;  // our stdout or stderr
  std::string pending;
};

struct Rank {
  int rank = 0;
  pid_t pid = -1;  // also its process group id (the rank calls setsid)
  // Set once the rank has exited. It stays a zombie (observed with WNOWAIT) until the launch ends, so its pid, which is
  // its process group's id, cannot be reused and signalling the group never reaches a stranger.
  bool exited = false;
  bool signaled = false;  // killed by a signal (code: the signal) rather than exited (code: the exit code)
  int code = 0;
  int exec_errno = 0;  // non-zero: execvp failed with this error and the rank exited 127
  std::string prefix;  // "[rank R] " or ""
  Stream out, err;
};

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Writes everything (our stdout may be a slow pipe or even non-blocking); gives up if it is gone.
void write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 100);
      continue;
    }
    if (n <= 0) return;  // EPIPE and the like: nobody reads our output any more
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// Reads what is available and writes the complete lines, each prefixed, in one write. At end of file, also the
// unterminated rest (with a newline added), then closes the pipe.
void relay(Stream& s, const std::string& prefix) {
  char buf[65536];
  const ssize_t n = ::read(s.fd, buf, sizeof(buf));
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n > 0) s.pending.append(buf, static_cast<size_t>(n));
  std::string lines;
  size_t start = 0;
  for (size_t nl = s.pending.find('\n'); nl != std::string::npos; nl = s.pending.find('\n', start)) {
    lines += prefix;
    lines.append(s.pending, start, nl + 1 - start);
    start = nl + 1;
  }
  s.pending.erase(0, start);
  const bool eof = n <= 0;  // end of file, or an error that ends the stream just the same
  if (!s.pending.empty() && (eof || s.pending.size() >= kMaxLineBytes)) {
    lines += prefix + s.pending + "\n";
    s.pending.clear();
  }
  if (eof) close_fd(s.fd);
  if (!lines.empty()) write_all(s.to, lines.data(), lines.size());
}

// Sends sig to the rank's process group, which includes whatever it started. Before the child's setsid the group does
// not exist yet: then to the rank alone (the child blocks signals until setsid, so the signal waits for it).
void signal_rank(const Rank& r, int sig) {
  if (::kill(-r.pid, sig) != 0 && errno == ESRCH) ::kill(r.pid, sig);
}

std::string describe_exit(const Rank& r, const LaunchOptions& o) {
  if (r.exec_errno != 0) {
    return fmt::format("rank {} (pid {}) could not run {}: {} (exit code 127)", r.rank, r.pid, o.argv[0],
                       std::strerror(r.exec_errno));
  }
  if (r.signaled)
    return fmt::format("rank {} (pid {}) was killed by signal {} ({})", r.rank, r.pid, r.code, strsignal(r.code));
  return fmt::format("rank {} (pid {}) exited with code {}", r.rank, r.pid, r.code);
}

// Environment of a rank: ours, with the torchrun variables replaced.
std::vector<std::string> rank_environment(const LaunchOptions& o, int local_rank) {
  std::vector<std::pair<std::string, std::string>> set = {
      {"RANK", std::to_string(o.node_rank * o.nproc_per_node + local_rank)},
      {"WORLD_SIZE", std::to_string(o.nnodes * o.nproc_per_node)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"NODE_RANK", std::to_string(o.node_rank)},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(o.master_port)},
      {"TESSERA_LAUNCHED", "1"},
  };
  // Ranks share this machine's cores (torchrun sets 1; an even split keeps a small job from idling cores).
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
    set.emplace_back("OMP_NUM_THREADS", std::to_string(std::max<long>(1, cores / o.nproc_per_node)));
  }
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view kv(*e);
    const std::string_view name = kv.substr(0, kv.find('='));
    if (std::none_of(set.begin(), set.end(), [&](const auto& s) { return s.first == name; })) env.emplace_back(kv);
  }
  for (const auto& [name, value] : set) env.push_back(fmt::format("{}={}", name, value));
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// The child between fork and exec: async-signal-safe calls only (the caller may have other threads, whose locks a
// forked child inherits held). Signals are blocked on entry. On exec failure, reports errno through status_fd.
[[noreturn]] void exec_rank(char* const* argv, char* const* envp, int out_fd, int err_fd, int status_fd, pid_t launcher,
                            const SignalGuard& signals) {
  // A session of its own (torchrun's start_new_session): the launcher signals the rank's whole process group, and
  // terminal job control never stops a rank that touches the terminal. In exchange terminal signals no longer reach it
  // directly: the launcher forwards them, and if the launcher itself is killed the rank gets SIGKILL.
  ::setsid();
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) ::_exit(127);  // the launcher died before prctl
  // Lift the pipe ends above 2 first so that dup2 cannot clobber one with the other.
  const int out = ::fcntl(out_fd, F_DUPFD_CLOEXEC, 3);
  const int err = ::fcntl(err_fd, F_DUPFD_CLOEXEC, 3);
  if (out < 0 || err < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0) {
    const int e = errno;
    (void)!::write(status_fd, &e, sizeof(e));
    ::_exit(127);
  }
  signals.restore();
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execvpe(argv[0], argv, envp);
  const int e = errno;
  (void)!::write(status_fd, &e, sizeof(e));
  ::_exit(127);
}

// The ranks of this launch. Whatever way the launch ends (a return or an exception), the destructor kills what is left
// of each rank's process group, reaps the ranks and closes their pipes.
class Job {
 public:
  explicit Job(const LaunchOptions& o) : o_(o) { ranks_.reserve(static_cast<size_t>(o.nproc_per_node)); }
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
  ~Job() {
    for (Rank& r : ranks_) {
      signal_rank(r, SIGKILL);
      int status = 0;
      while (::waitpid(r.pid, &status, 0) < 0 && errno == EINTR) {
      }
      close_fd(r.out.fd);
      close_fd(r.err.fd);
    }
  }

  // Forks and execs one rank; returns once it runs the program or has failed to. Throws Error if it cannot fork.
  Rank& spawn(int local_rank, const SignalGuard& signals) {
    const int rank = o_.node_rank * o_.nproc_per_node + local_rank;
    std::string prefix = o_.prefix_output ? fmt::format("[rank {}] ", rank) : "";
    std::vector<std::string> env = rank_environment(o_, local_rank);
    std::vector<std::string> args = o_.argv;
    const std::vector<char*> envp = c_strings(env), argv = c_strings(args);
    int out[2], err[2], status[2];
    if (::pipe2(out, O_CLOEXEC) != 0) throw Error("launch", fmt::format("pipe: {}", std::strerror(errno)));
    if (::pipe2(err, O_CLOEXEC) != 0) {
      const int e = errno;
      for (int fd : out) ::close(fd);
      throw Error("launch", fmt::format("pipe: {}", std::strerror(e)));
    }
    if (::pipe2(status, O_CLOEXEC) != 0) {
      const int e = errno;
      for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
      throw Error("launch", fmt::format("pipe: {}", std::strerror(e)));
    }
    std::fflush(nullptr);
    const pid_t launcher = ::getpid();
    sigset_t all, before;
    sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &before);
    const pid_t pid = ::fork();
    if (pid == 0) exec_rank(argv.data(), envp.data(), out[1], err[1], status[1], launcher, signals);
    const int fork_errno = errno;
    ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
    for (int fd : {out[1], err[1], status[1]}) ::close(fd);
    if (pid < 0) {
      for (int fd : {out[0], err[0], status[0]}) ::close(fd);
      throw Error("launch", fmt::format("fork for rank {}: {}", rank, std::strerror(fork_errno)));
    }
    // From here on nothing throws (ranks_ has room reserved), so the Job always knows the child to clean it up.
    Rank& r = ranks_.emplace_back();
    r.rank = rank;
    r.pid = pid;
    r.prefix = std::move(prefix);
    r.out = {out[0], 1, {}};
    r.err = {err[0], 2, {}};
    ::fcntl(out[0], F_SETFL, O_NONBLOCK);
    ::fcntl(err[0], F_SETFL, O_NONBLOCK);
    // The status pipe closes on exec (success: nothing to read) or carries errno (failure).
    ssize_t n;
    while ((n = ::read(status[0], &r.exec_errno, sizeof(r.exec_errno))) < 0 && errno == EINTR) {
    }
    if (n != static_cast<ssize_t>(sizeof(r.exec_errno))) r.exec_errno = 0;
    ::close(status[0]);
    return r;
  }

  // Relays output, forwards signals and watches the ranks until all have exited; returns the launch's exit code.
  int run() {
    std::optional<int> result;                 // decided by the first failure or the first forwarded signal
    std::optional<Clock::time_point> kill_at;  // while stopping: SIGKILL whatever is left at this time
    std::optional<Clock::time_point> drain_until;
    auto stop = [&](int sig) {
      for (const Rank& r : ranks_) signal_rank(r, sig);  // exited ranks too: what they started may still run
      if (!kill_at) {
        kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(std::min(o_.stop_grace_seconds, kMaxGraceSeconds)));
      }
    };
    while (true) {
      // Observe exits without reaping (see Rank::exited).
      for (Rank& r : ranks_) {
        if (r.exited) continue;
        siginfo_t info{};
        if (::waitid(P_PID, static_cast<id_t>(r.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
            info.si_pid != r.pid) {
          continue;
        }
        r.exited = true;
        r.signaled = info.si_code == CLD_KILLED || info.si_code == CLD_DUMPED;
        r.code = info.si_status;
        if ((r.signaled || r.code != 0) && !result) {
          spdlog::error("[launch] {}; stopping the other ranks", describe_exit(r, o_));
          result = r.signaled ? 128 + r.code : r.code;
          stop(SIGTERM);
        }
      }
      if (const int sig = g_pending_signal; sig != 0) {
        g_pending_signal = 0;
        spdlog::warn("[launch] forwarding signal {} ({}) to the ranks", sig, strsignal(sig));
        if (!result) result = 128 + sig;
        stop(sig);
      }
      if (kill_at && Clock::now() >= *kill_at) {
        for (const Rank& r : ranks_) {
          if (!r.exited) {
            spdlog::warn("[launch] rank {} (pid {}) did not stop within {} s; killing it", r.rank, r.pid,
                         o_.stop_grace_seconds);
          }
          signal_rank(r, SIGKILL);
        }
        kill_at = Clock::time_point::max();
      }
      const bool all_exited = std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.exited; });
      if (all_exited && !drain_until) drain_until = Clock::now() + kDrainTime;
      if (all_exited && Clock::now() >= *drain_until) break;
      if (!poll_output(kPollInterval)) {  // every pipe is closed
        if (all_exited) break;
        std::this_thread::sleep_for(kPollInterval);
      }
    }
    // Kill what the ranks left behind (torchrun's closing killpg), then read their last words.
    for (const Rank& r : ranks_) signal_rank(r, SIGKILL);
    const auto end = Clock::now() + std::chrono::milliseconds(500);
    while (Clock::now() < end && poll_output(kPollInterval)) {
    }
    return result.value_or(0);
  }

 private:
  // Waits up to timeout for output and relays it; returns whether any pipe is still open.
  bool poll_output(std::chrono::milliseconds timeout) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Stream*, const std::string*>> streams;
    for (Rank& r : ranks_) {
      for (Stream* s : {&r.out, &r.err}) {
        if (s->fd < 0) continue;
        fds.push_back({s->fd, POLLIN, 0});
        streams.emplace_back(s, &r.prefix);
      }
    }
    if (fds.empty()) return false;
    if (::poll(fds.data(), fds.size(), static_cast<int>(timeout.count())) > 0) {
      for (size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents != 0) relay(*streams[i].first, *streams[i].second);
      }
    }
    return true;
  }

  const LaunchOptions& o_;
  std::vector<Rank> ranks_;
};

void validate(const LaunchOptions& o) {
  if (o.nproc_per_node < 1) {
    throw ConfigError("launch", fmt::format("--nproc-per-node {} must be at least 1", o.nproc_per_node));
  }
  if (o.nnodes < 1) throw ConfigError("launch", fmt::format("--nnodes {} must be at least 1", o.nnodes));
  if (o.node_rank < 0 || o.node_rank >= o.nnodes) {
    throw ConfigError("launch", fmt::format("--node-rank {} is not in [0, --nnodes {})", o.node_rank, o.nnodes));
  }
  if (o.argv.empty() || o.argv[0].empty()) throw ConfigError("launch", "no program to run");
  if (o.master_addr.empty()) throw ConfigError("launch", "--master-addr is empty");
  if (o.master_port < 1 || o.master_port > 65535) {
    throw ConfigError("launch", fmt::format("--master-port {} is not a TCP port", o.master_port));
  }
  if (!std::isfinite(o.stop_grace_seconds) || o.stop_grace_seconds < 0) {
    throw ConfigError(
        "launch", fmt::format("stop_grace_seconds {} must be a finite number of seconds >= 0", o.stop_grace_seconds));
  }
}

}  // namespace

int launch(const LaunchOptions& o) {
  validate(o);
  SignalGuard signals;  // before Job: the ranks are gone by the time the caller's handlers return
  spdlog::info("[launch] {} ranks on node {} of {} (ranks {}..{} of {}), rendezvous at {}:{}", o.nproc_per_node,
               o.node_rank, o.nnodes, o.node_rank * o.nproc_per_node, (o.node_rank + 1) * o.nproc_per_node - 1,
               o.nnodes * o.nproc_per_node, o.master_addr, o.master_port);
  Job job(o);
  for (int local = 0; local < o.nproc_per_node; ++local) {
    // A program that one rank cannot run, the next cannot either: start no more.
    if (job.spawn(local, signals).exec_errno != 0) break;
  }
  return job.run();
}

}  // namespace tessera::dist
