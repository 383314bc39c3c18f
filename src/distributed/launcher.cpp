// Rank launcher: fork/exec of the local ranks (each in its own session, as torchrun does), line-by-line output relay
// through poll(), signal forwarding, stopping the job when a rank fails or its watchdog finds it hung, and restarting
// it.
#include "tessera/distributed/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
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
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "launch_attempt.h"
#include "rank_start.h"
#include "rendezvous.h"
#include "tessera/util/error.h"
#include "tessera/util/heartbeat.h"
#include "tessera/util/preemption.h"
#include "tessera/util/subprocess.h"
#include "watchdog.h"

namespace tessera::dist {
namespace detail {

// Signals forwarded to the ranks (with the options' preemption signals), and SIGPIPE, ignored while we run so that a
// closed stdout cannot kill the launcher and orphan the ranks.
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
  explicit SignalGuard(const std::vector<int>& preemption_signals)
      : handled_(kHandledSignals.begin(), kHandledSignals.end()) {
    for (const int sig : preemption_signals) {
      if (std::find(handled_.begin(), handled_.end(), sig) == handled_.end()) handled_.push_back(sig);
    }
    old_.resize(handled_.size());
    g_pending_signal = 0;
    for (size_t i = 0; i < handled_.size(); ++i) {
      ::sigaction(handled_[i], nullptr, &old_[i]);
      struct sigaction sa {};
      sigemptyset(&sa.sa_mask);
      if (handled_[i] == SIGPIPE) {
        sa.sa_handler = SIG_IGN;
      } else if (old_[i].sa_handler != SIG_IGN) {
        sa.sa_handler = remember_signal;
      } else {
        continue;
      }
      ::sigaction(handled_[i], &sa, nullptr);
    }
  }
  ~SignalGuard() { restore(); }
  SignalGuard(const SignalGuard&) = delete;
  SignalGuard& operator=(const SignalGuard&) = delete;

  // Puts back the caller's dispositions (also in a forked child, before exec: async-signal-safe).
  void restore() const {
    for (size_t i = 0; i < handled_.size(); ++i) ::sigaction(handled_[i], &old_[i], nullptr);
  }

 private:
  std::vector<int> handled_;
  std::vector<struct sigaction> old_;
};

}  // namespace detail

namespace {

using detail::Ending;
using detail::g_pending_signal;
using detail::kMaxGraceSeconds;
using detail::SignalGuard;

using Clock = std::chrono::steady_clock;
using detail::allowed_cpus;
using detail::cpu_list;
using detail::fork_hazard;
using detail::rank_cpus;
using detail::run_forked_rank;
using detail::Watchdog;

// How long to wait, after killing the ranks, for the last process of their process groups to go.
constexpr auto kGroupExitTime = std::chrono::seconds(5);
// How long to keep reading output after every rank has exited (a process a rank left behind may hold its pipes).
constexpr auto kDrainTime = std::chrono::seconds(1);
// How often the ranks are checked for exits and our pending signals handled (poll() also wakes on output).
constexpr auto kPollInterval = std::chrono::milliseconds(50);
// Longest line kept whole; a longer one (binary output, a progress bar without newlines) is relayed in pieces.
constexpr size_t kMaxLineBytes = size_t{1} << 20;

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

// Whether a process other than a zombie is left in process group pgid. (A zombie holds no port; an orphan's zombie
// waits for init, which may be slow to reap it.)
bool group_has_live_process(pid_t pgid) {
  if (::kill(-pgid, 0) != 0) return false;  // the group is empty
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/proc", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(it->path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so parse after the last ')'.
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    long ppid = 0, pgrp = 0;
    if (std::sscanf(line.c_str() + close + 1, " %c %ld %ld", &state, &ppid, &pgrp) != 3) continue;
    if (pgrp == pgid && state != 'Z' && state != 'X') return true;
  }
  return false;
}

using Environment = std::vector<std::pair<std::string, std::string>>;

// Environment of a rank: ours, with the torchrun variables and `extra` replaced.
std::vector<std::string> rank_environment(const LaunchOptions& o, int local_rank, const Environment& extra) {
  Environment set = {
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
  if (o.min_nodes > 0) set.emplace_back("TESSERA_NODE_ID", o.node_id);
  if (o.master_listen_fd >= 0 && o.node_rank * o.nproc_per_node + local_rank == 0) {
    set.emplace_back(kMasterListenFdEnv, std::to_string(o.master_listen_fd));
  }
  set.insert(set.end(), extra.begin(), extra.end());
  // Ranks share this machine's cores (torchrun sets 1; an even split keeps a small job from idling cores).
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
    set.emplace_back("OMP_NUM_THREADS", std::to_string(std::max<long>(1, cores / o.nproc_per_node)));
  }
  return util::environment_with(set);
}

// The child between fork and exec: async-signal-safe calls only (the caller may have other threads, whose locks a
// forked child inherits held), unless `entry` is given (run_forked_rank). Signals are blocked on entry. On exec
// failure, reports errno through status_fd.
[[noreturn]] void start_rank(char* const* argv, char* const* envp, int out_fd, int err_fd, int status_fd,
                             pid_t launcher, const SignalGuard& signals, int inherit_fd,
                             const std::function<int(int, char**)>* entry, const cpu_set_t* cpus) {
  // The one descriptor this rank keeps across exec (rank 0: the rendezvous's listening socket), or -1.
  if (inherit_fd >= 0) ::fcntl(inherit_fd, F_SETFD, 0);
  // A session of its own (torchrun's start_new_session): the launcher signals the rank's whole process group, and
  // terminal job control never stops a rank that touches the terminal. In exchange terminal signals no longer reach it
  // directly: the launcher forwards them, and if the launcher itself is killed the rank gets SIGKILL.
  ::setsid();
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) ::_exit(127);  // the launcher died before prctl
  // Lift the pipe ends above 2 first so that dup2 cannot clobber one with the other.
  const int out = ::fcntl(out_fd, F_DUPFD_CLOEXEC, 3);
  const int err = ::fcntl(err_fd, F_DUPFD_CLOEXEC, 3);
  // --bind-cores: the rank and every thread it starts (the mask is inherited across exec and by new threads).
  if (out < 0 || err < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0 ||
      (cpus != nullptr && ::sched_setaffinity(0, sizeof(cpu_set_t), cpus) != 0)) {
    const int e = errno;
    (void)!::write(status_fd, &e, sizeof(e));
    ::_exit(127);
  }
  signals.restore();
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  if (entry != nullptr) run_forked_rank(*entry, argv, envp, inherit_fd);
  ::execvpe(argv[0], argv, envp);
  const int e = errno;
  (void)!::write(status_fd, &e, sizeof(e));
  ::_exit(127);
}

// The ranks of this launch. Whatever way the launch ends (a return or an exception), the destructor kills what is left
// of each rank's process group, reaps the ranks and closes their pipes.
class Job {
 public:
  // `env`: variables every rank gets on top of the torchrun ones (the restart count, the heartbeat directory).
  Job(const LaunchOptions& o, Environment env)
      : o_(o), env_(std::move(env)), cpus_(o.bind_cores ? allowed_cpus() : std::vector<int>()) {
    ranks_.reserve(static_cast<size_t>(o.nproc_per_node));
  }
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
  // Returns once every process of every rank's group is gone (or after kGroupExitTime): a restart must find the
  // rendezvous port, and anything else a rank held, free.
  ~Job() {
    for (Rank& r : ranks_) {
      signal_rank(r, SIGKILL);
      int status = 0;
      while (::waitpid(r.pid, &status, 0) < 0 && errno == EINTR) {
      }
      close_fd(r.out.fd);
      close_fd(r.err.fd);
    }
    // The ranks are reaped, but the processes they left in their groups (SIGKILLed, reparented) may not be gone yet.
    // While such a process lives, its group's id cannot be reused by a new process, so signalling it is safe.
    const auto deadline = Clock::now() + kGroupExitTime;
    for (const Rank& r : ranks_) {
      while (group_has_live_process(r.pid) && Clock::now() < deadline) {
        ::kill(-r.pid, SIGKILL);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  }

  // Forks and execs one rank (`forked`: forks and calls o.fork_entry instead); returns once it runs the program or has
  // failed to. Throws Error if it cannot fork.
  Rank& spawn(int local_rank, const SignalGuard& signals, bool forked) {
    const int rank = o_.node_rank * o_.nproc_per_node + local_rank;
    std::string prefix = o_.prefix_output ? fmt::format("[rank {}] ", rank) : "";
    std::vector<std::string> env = rank_environment(o_, local_rank, env_);
    std::vector<std::string> args = o_.argv;
    const std::vector<char*> envp = util::c_strings(env), argv = util::c_strings(args);
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
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    if (o_.bind_cores) {
      for (const int c : rank_cpus(cpus_, local_rank, o_.nproc_per_node)) CPU_SET(c, &cpus);
    }
    sigset_t all, before;
    sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &before);
    const pid_t pid = ::fork();
    const int inherit_fd = rank == 0 ? o_.master_listen_fd : -1;
    if (pid == 0) {
      start_rank(argv.data(), envp.data(), out[1], err[1], status[1], launcher, signals, inherit_fd,
                 forked ? &o_.fork_entry : nullptr, o_.bind_cores ? &cpus : nullptr);
    }
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

  // Relays output, forwards signals and watches the ranks (and, with a watchdog, their heartbeats) until all have
  // exited; returns how the attempt ended. `peers` (elastic jobs), called about every kPollInterval until the attempt
  // is decided: a cause when the rendezvous says to stop (another node failed), which stops the ranks.
  Ending run(Watchdog* watchdog, const std::function<std::optional<std::string>()>& peers) {
    std::optional<Ending> result;  // decided by the first failure, hang or forwarded signal
    bool interrupted = false;
    std::optional<Clock::time_point> kill_at;  // while stopping: SIGKILL whatever is left at this time
    std::optional<Clock::time_point> drain_until;
    bool preempting = false;  // a preemption signal was forwarded: the ranks save, then exit kExitPreempted
    bool preempted = false;   // a rank exited kExitPreempted
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
        if (!r.signaled && r.code == util::kExitPreempted) {
          // Not a failure: the ranks agreed to stop after saving a checkpoint; the others are stopping too.
          if (!preempted) {
            spdlog::warn("[launch] rank {} (pid {}) stopped for a preemption after saving a checkpoint", r.rank, r.pid);
          }
          preempted = true;
          continue;
        }
        if ((r.signaled || r.code != 0) && !result) {
          const std::string what = describe_exit(r, o_);
          spdlog::error("[launch] {}; stopping the other ranks", what);
          result = Ending{r.exec_errno != 0 ? Ending::Kind::kCannotRun : Ending::Kind::kRankFailed,
                          r.signaled ? 128 + r.code : r.code, what};
          stop(SIGTERM);
        }
      }
      if (const int sig = g_pending_signal; sig != 0) {
        g_pending_signal = 0;
        interrupted = true;
        const bool preemption =
            std::find(o_.preemption_signals.begin(), o_.preemption_signals.end(), sig) != o_.preemption_signals.end();
        if (preemption && !preempting && !result) {
          // The ranks finish their batch, save and exit: no deadline here (the scheduler's own kill is the limit).
          preempting = true;
          spdlog::warn(
              "[launch] forwarding {} to the ranks: a preemption; waiting for them to save a checkpoint and "
              "exit (a second signal stops them at once)",
              util::signal_name(sig));
          for (const Rank& r : ranks_) {
            if (!r.exited) ::kill(r.pid, sig);  // the rank itself: what it started keeps the default disposition
          }
          continue;
        }
        spdlog::warn("[launch] forwarding signal {} ({}) to the ranks", sig, strsignal(sig));
        if (!result) {
          result = Ending{Ending::Kind::kSignal, 128 + sig, fmt::format("signal {} ({})", sig, strsignal(sig))};
        }
        stop(sig);
      }
      if (watchdog != nullptr && !result) {
        std::vector<bool> exited;
        std::vector<pid_t> pids;
        for (const Rank& r : ranks_) {
          exited.push_back(r.exited);
          pids.push_back(r.pid);
        }
        if (std::optional<detail::Hang> hang = watchdog->check(Clock::now(), exited, pids)) {
          spdlog::error("[launch] hang: {}; stopping the ranks", hang->report);
          result = Ending{Ending::Kind::kHang, kLaunchHangExitCode, "a hang: " + hang->summary};
          // A stopped rank cannot act on SIGTERM, and the others wait for it in a collective: killing it at once
          // fails their collective now rather than after the grace period.
          for (const Rank& r : ranks_) {
            const char state = r.exited ? '?' : detail::process_state(r.pid);
            if (state == 'T' || state == 't') signal_rank(r, SIGKILL);
          }
          stop(SIGTERM);
        }
      }
      if (peers && !result) {
        if (std::optional<std::string> cause = peers()) {
          spdlog::warn("[launch] stopping the ranks: {}", *cause);
          result = Ending{Ending::Kind::kStopped, 128 + SIGTERM, *cause};
          stop(SIGTERM);
        }
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
    if (!result && preempted) {
      result = Ending{Ending::Kind::kPreempted, util::kExitPreempted, "a preemption"};
    }
    Ending ending = result.value_or(Ending{});
    ending.interrupted = interrupted;
    return ending;
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
  const Environment env_;
  const std::vector<int> cpus_;  // --bind-cores: the CPUs the ranks' slices are cut from, read once per attempt
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
  if (o.master_port < 0 || o.master_port > 65535) {
    throw ConfigError("launch", fmt::format("--master-port {} is not a TCP port", o.master_port));
  }
  if (o.master_port == 0 && (o.nnodes > 1 || o.min_nodes > 0)) {
    throw ConfigError("launch",
                      "--master-port 0 (a port the launcher picks) works for one node only: the other nodes "
                      "need to know the port; give every node the same --master-port");
  }
  if (!std::isfinite(o.stop_grace_seconds) || o.stop_grace_seconds < 0) {
    throw ConfigError(
        "launch", fmt::format("stop_grace_seconds {} must be a finite number of seconds >= 0", o.stop_grace_seconds));
  }
  if (o.max_restarts < 0) {
    throw ConfigError("launch", fmt::format("--max-restarts {} must be at least 0", o.max_restarts));
  }
  if (const std::vector<int> cpus = o.bind_cores ? allowed_cpus() : std::vector<int>();
      o.bind_cores && std::ssize(cpus) < o.nproc_per_node) {
    throw ConfigError("launch",
                      fmt::format("--bind-cores: {} local ranks, but this process may run on {} CPU{} ({}); "
                                  "give each rank at least one",
                                  o.nproc_per_node, cpus.size(), cpus.size() == 1 ? "" : "s", cpu_list(cpus)));
  }
  if (!std::isfinite(o.watchdog_timeout_seconds) || o.watchdog_timeout_seconds < 0) {
    throw ConfigError("launch", fmt::format("--watchdog-timeout {} must be a finite number of seconds >= 0",
                                            o.watchdog_timeout_seconds));
  }
  if (!std::isfinite(o.watchdog_step_multiple) || (o.watchdog_step_multiple != 0 && o.watchdog_step_multiple < 1)) {
    throw ConfigError("launch", fmt::format("--watchdog-step-multiple {} must be 0 (off) or a number >= 1",
                                            o.watchdog_step_multiple));
  }
  if (o.min_nodes == 0 && o.max_nodes == 0) return;
  if (o.min_nodes < 1 || o.max_nodes < o.min_nodes) {
    throw ConfigError("launch",
                      fmt::format("--nnodes {}:{} must be MIN:MAX with 1 <= MIN <= MAX", o.min_nodes, o.max_nodes));
  }
  if (o.rdzv_endpoint.empty()) {
    throw ConfigError("launch", fmt::format("--nnodes {}:{} (an elastic job) needs --rdzv-endpoint HOST:PORT",
                                            o.min_nodes, o.max_nodes));
  }
  detail::parse_endpoint(o.rdzv_endpoint);
  if (o.node_id.empty() || o.node_id.find_first_of(" \t\r\n") != std::string::npos) {
    throw ConfigError("launch", fmt::format("--node-id '{}' must be a non-empty name without spaces", o.node_id));
  }
  for (const auto& [value, flag] :
       {std::pair{o.rdzv_timeout_seconds, "--rdzv-timeout"}, std::pair{o.rdzv_last_call_seconds, "--rdzv-last-call"}}) {
    if (!std::isfinite(value) || value < 0) {
      throw ConfigError("launch", fmt::format("{} {} must be a finite number of seconds >= 0", flag, value));
    }
  }
}

// The watchdog's timeout, or its floor under --watchdog-step-multiple (0: no watchdog).
double watchdog_seconds(const LaunchOptions& o) {
  if (o.watchdog_step_multiple > 0 && o.watchdog_timeout_seconds <= 0) return kDerivedWatchdogFloorSeconds;
  return o.watchdog_timeout_seconds;
}

void log_supervisor(const LaunchOptions& o) {
  if (o.max_restarts > 0 || watchdog_seconds(o) > 0) {
    std::string watchdog = "no watchdog";
    if (o.watchdog_step_multiple > 0) {
      watchdog = fmt::format("watchdog after {:g} x the longest step without progress (at least {:g} s)",
                             o.watchdog_step_multiple, watchdog_seconds(o));
    } else if (o.watchdog_timeout_seconds > 0) {
      watchdog = fmt::format("watchdog after {} s without progress", o.watchdog_timeout_seconds);
    }
    spdlog::info("[launch] supervisor: {}, {}",
                 o.max_restarts > 0 ? fmt::format("up to {} restart{}", o.max_restarts, o.max_restarts == 1 ? "" : "s")
                                    : std::string("no restarts"),
                 watchdog);
  }
}

}  // namespace

namespace detail {

// One attempt of the job on this node: spawns the ranks of `o` (its node_rank, nnodes and master) and runs them.
// Returns once every process of the ranks' groups is gone.
Ending run_attempt(const LaunchOptions& o, int restarts, const SignalGuard& signals, Watchdog* watchdog,
                   const PeerCheck& peers) {
  Environment env = {{"TORCHELASTIC_RESTART_COUNT", std::to_string(restarts)},
                     {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)}};
  if (watchdog != nullptr) {
    std::vector<int> ranks;
    for (int local = 0; local < o.nproc_per_node; ++local) ranks.push_back(o.node_rank * o.nproc_per_node + local);
    env.emplace_back(util::kHeartbeatDirEnv, watchdog->dir());
    watchdog->start(ranks, Clock::now());
  }
  bool forked = false;
  if (o.fork_entry) {
    const std::string hazard = fork_hazard();
    forked = hazard.empty();
    if (!forked) {
      spdlog::warn("[launch] starting the ranks with exec rather than as forks of the launcher: {}", hazard);
    } else if (restarts == 0) {
      spdlog::info("[launch] the ranks start as forks of the launcher (--fork-ranks)");
    }
  }
  if (o.bind_cores && restarts == 0) {
    const std::vector<int> cpus = allowed_cpus();
    std::vector<std::string> each;
    for (int local = 0; local < o.nproc_per_node; ++local) {
      each.push_back(fmt::format("rank {} on CPU {}", o.node_rank * o.nproc_per_node + local,
                                 cpu_list(rank_cpus(cpus, local, o.nproc_per_node))));
    }
    spdlog::info("[launch] --bind-cores: {}", fmt::join(each, ", "));
  }
  Job job(o, std::move(env));
  for (int local = 0; local < o.nproc_per_node; ++local) {
    // A program that one rank cannot run, the next cannot either: start no more.
    if (job.spawn(local, signals, forked).exec_errno != 0) break;
  }
  return job.run(watchdog, peers);
}

}  // namespace detail

namespace {

// A listening TCP socket (detail::listen_at) that closes with the object: the rendezvous port of `--master-port 0`
// (MASTER_ADDR's interface; rank 0 inherits it through start_rank) and free_local_port's probe (loopback).
struct ListeningSocket {
  int fd = -1;
  int port = 0;
  explicit ListeningSocket(detail::Listener bound) : fd(bound.fd), port(bound.port) {}
  ListeningSocket(const ListeningSocket&) = delete;
  ListeningSocket& operator=(const ListeningSocket&) = delete;
  ~ListeningSocket() { ::close(fd); }
};

// One node's launch, not elastic: attempts until one succeeds, stops for good, or the restarts run out.
int launch_one_node(const LaunchOptions& o, const SignalGuard& signals, std::optional<Watchdog>& watchdog) {
  spdlog::info("[launch] {} ranks on node {} of {} (ranks {}..{} of {}), rendezvous at {}:{}", o.nproc_per_node,
               o.node_rank, o.nnodes, o.node_rank * o.nproc_per_node, (o.node_rank + 1) * o.nproc_per_node - 1,
               o.nnodes * o.nproc_per_node, o.master_addr, o.master_port);
  log_supervisor(o);
  if (watchdog_seconds(o) > 0) watchdog.emplace(watchdog_seconds(o), o.nnodes > 1, o.watchdog_step_multiple);
  for (int restarts = 0;; ++restarts) {
    const Ending end = detail::run_attempt(o, restarts, signals, watchdog ? &*watchdog : nullptr, nullptr);
    switch (end.kind) {
      case Ending::Kind::kSuccess:
        if (restarts > 0)
          spdlog::info("[launch] the job succeeded after {} restart{}", restarts, restarts == 1 ? "" : "s");
        return 0;
      case Ending::Kind::kPreempted:
        spdlog::warn(
            "[launch] the job stopped for a preemption after saving a checkpoint (exit {}); run it again to "
            "resume",
            end.code);
        return end.code;
      case Ending::Kind::kSignal:
      case Ending::Kind::kCannotRun:
        return end.code;
      case Ending::Kind::kRankFailed:
      case Ending::Kind::kHang:
      case Ending::Kind::kStopped:
        break;
    }
    if (end.interrupted || g_pending_signal != 0) {
      if (o.max_restarts > 0) spdlog::warn("[launch] not restarting: stopped by a signal");
      return end.code;
    }
    if (restarts >= o.max_restarts) {
      if (o.max_restarts > 0) {
        spdlog::error("[launch] giving up after {} restart{} (--max-restarts {}); last failure: {}", restarts,
                      restarts == 1 ? "" : "s", o.max_restarts, end.cause);
      }
      return end.code;
    }
    spdlog::warn("[launch] restart {}/{} after {}", restarts + 1, o.max_restarts, end.cause);
  }
}

}  // namespace

int launch(const LaunchOptions& o) {
  validate(o);
  SignalGuard signals(o.preemption_signals);  // before Job: the ranks are gone by the time the caller's handlers return
  std::optional<Watchdog> watchdog;
  if (o.min_nodes > 0) {
    log_supervisor(o);
    if (watchdog_seconds(o) > 0) watchdog.emplace(watchdog_seconds(o), o.max_nodes > 1, o.watchdog_step_multiple);
    if (o.rdzv_host) return detail::run_rendezvous_host(o, signals, watchdog ? &*watchdog : nullptr);
    return detail::run_agent(o, signals, watchdog ? &*watchdog : nullptr);
  }
  if (o.master_port != 0) return launch_one_node(o, signals, watchdog);
  // --master-port 0: bind the port here and keep it bound for every attempt; rank 0's store takes the socket over.
  const ListeningSocket bound(detail::listen_at(o.master_addr, 0, "--master-port 0", o.nnodes > 1, "launch"));
  LaunchOptions with_port = o;
  with_port.master_port = bound.port;
  with_port.master_listen_fd = bound.fd;
  return launch_one_node(with_port, signals, watchdog);
}

int free_local_port() {
  return ListeningSocket(detail::listen_at("127.0.0.1", 0, "free_local_port", false, "launch")).port;
}

}  // namespace tessera::dist
