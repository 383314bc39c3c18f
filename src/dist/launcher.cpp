// Rank launcher: fork/exec of the local ranks, line-by-line output relay through poll(), signal forwarding, and
// stopping the job when a rank fails.
#include "tessera/dist/launcher.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "tessera/util/error.h"

namespace tessera::dist {
namespace {

using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_pending_signal = 0;
void remember_signal(int sig) {
  g_pending_signal = sig;
}

struct Stream {
  int fd = -1;
  int to = 1;  // our stdout or stderr
  std::string pending;
};

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  bool running = true;
  int status = 0;
  Stream out, err;
};

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

// Reads what is available; writes whole lines (prefixed). At end of file, also the unterminated rest.
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
  if (n <= 0) {  // end of file (or error): flush the rest and stop reading
    if (!s.pending.empty()) lines += prefix + s.pending + "\n";
    s.pending.clear();
    ::close(s.fd);
    s.fd = -1;
  }
  if (!lines.empty()) write_all(s.to, lines);
}

std::string describe_exit(const Rank& r) {
  if (WIFSIGNALED(r.status)) {
    const int sig = WTERMSIG(r.status);
    return fmt::format("rank {} (pid {}) was killed by signal {} ({})", r.rank, r.pid, sig, strsignal(sig));
  }
  return fmt::format("rank {} (pid {}) exited with code {}", r.rank, r.pid, WEXITSTATUS(r.status));
}

int exit_code_of(int status) {
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

bool failed(int status) {
  return WIFSIGNALED(status) || WEXITSTATUS(status) != 0;
}

// Restores the previous handlers of the forwarded signals when the launch ends.
class SignalForwarding {
 public:
  SignalForwarding() {
    struct sigaction sa {};
    sa.sa_handler = remember_signal;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &sa, &old_[i]);
    g_pending_signal = 0;
  }
  ~SignalForwarding() {
    for (size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &old_[i], nullptr);
  }
  SignalForwarding(const SignalForwarding&) = delete;
  SignalForwarding& operator=(const SignalForwarding&) = delete;

 private:
  static constexpr std::array<int, 3> kSignals = {SIGINT, SIGTERM, SIGHUP};
  std::array<struct sigaction, 3> old_{};
};

[[noreturn]] void exec_rank(const LaunchOptions& o, int local_rank, int out_fd, int err_fd) {
  ::dup2(out_fd, 1);
  ::dup2(err_fd, 2);
  const int rank = o.node_rank * o.nproc_per_node + local_rank;
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(o.nnodes * o.nproc_per_node).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(local_rank).c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node).c_str(), 1);
  setenv("GROUP_RANK", std::to_string(o.node_rank).c_str(), 1);
  setenv("NODE_RANK", std::to_string(o.node_rank).c_str(), 1);
  setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
  setenv("MASTER_PORT", std::to_string(o.master_port).c_str(), 1);
  setenv("TESSERA_LAUNCHED", "1", 1);
  // Ranks share this machine's cores (torchrun sets 1; an even split keeps a small job from idling cores).
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
    setenv("OMP_NUM_THREADS", std::to_string(std::max<long>(1, cores / o.nproc_per_node)).c_str(), 1);
  }
  std::vector<char*> args;
  for (const std::string& a : o.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execvp(args[0], args.data());
  const std::string msg = fmt::format("cannot run {}: {}\n", o.argv[0], std::strerror(errno));
  write_all(2, msg);
  _exit(127);
}

}  // namespace

int launch(const LaunchOptions& o) {
  if (o.nproc_per_node < 1)
    throw ConfigError("launch", fmt::format("--nproc-per-node {} must be at least 1", o.nproc_per_node));
  if (o.nnodes < 1) throw ConfigError("launch", fmt::format("--nnodes {} must be at least 1", o.nnodes));
  if (o.node_rank < 0 || o.node_rank >= o.nnodes) {
    throw ConfigError("launch", fmt::format("--node-rank {} is not in [0, --nnodes {})", o.node_rank, o.nnodes));
  }
  if (o.argv.empty()) throw ConfigError("launch", "no program to run");
  if (o.master_port < 1 || o.master_port > 65535) {
    throw ConfigError("launch", fmt::format("--master-port {} is not a TCP port", o.master_port));
  }
  SignalForwarding forwarding;
  std::vector<Rank> ranks(static_cast<size_t>(o.nproc_per_node));
  for (int local = 0; local < o.nproc_per_node; ++local) {
    Rank& r = ranks[static_cast<size_t>(local)];
    r.rank = o.node_rank * o.nproc_per_node + local;
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
      throw Error("launch", fmt::format("pipe: {}", std::strerror(errno)));
    }
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) throw Error("launch", fmt::format("fork: {}", std::strerror(errno)));
    if (pid == 0) exec_rank(o, local, out[1], err[1]);
    ::close(out[1]);
    ::close(err[1]);
    r.pid = pid;
    r.out = {out[0], 1, {}};
    r.err = {err[0], 2, {}};
    ::fcntl(out[0], F_SETFL, O_NONBLOCK);
    ::fcntl(err[0], F_SETFL, O_NONBLOCK);
  }
  spdlog::info("launch: {} ranks on node {} of {} (ranks {}..{} of {}), rendezvous at {}:{}", o.nproc_per_node,
               o.node_rank, o.nnodes, ranks.front().rank, ranks.back().rank, o.nnodes * o.nproc_per_node, o.master_addr,
               o.master_port);

  std::optional<int> result;                 // exit code decided by the first failure or a forwarded signal
  std::optional<Clock::time_point> kill_at;  // when stopping: SIGKILL whoever is left at this time
  std::optional<Clock::time_point> drain_until;
  auto stop_others = [&](int sig) {
    for (Rank& r : ranks) {
      if (r.running) ::kill(r.pid, sig);
    }
    if (!kill_at) kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.stop_grace_seconds * 1000));
  };
  while (true) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Stream*, std::string>> streams;
    for (Rank& r : ranks) {
      const std::string prefix = o.prefix_output ? fmt::format("[rank {}] ", r.rank) : "";
      for (Stream* s : {&r.out, &r.err}) {
        if (s->fd < 0) continue;
        fds.push_back({s->fd, POLLIN, 0});
        streams.emplace_back(s, prefix);
      }
    }
    bool any_running = false;
    for (const Rank& r : ranks) any_running = any_running || r.running;
    if (!any_running && (fds.empty() || (drain_until && Clock::now() > *drain_until))) break;
    if (!fds.empty()) {
      ::poll(fds.data(), fds.size(), 100);
      for (size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents != 0) relay(*streams[i].first, streams[i].second);
      }
    } else {
      ::usleep(100000);
    }
    if (const int sig = g_pending_signal; sig != 0) {
      g_pending_signal = 0;
      spdlog::warn("launch: forwarding signal {} ({}) to the ranks", sig, strsignal(sig));
      stop_others(sig);
      if (!result) result = 128 + sig;
    }
    for (Rank& r : ranks) {
      if (!r.running) continue;
      const pid_t w = ::waitpid(r.pid, &r.status, WNOHANG);
      if (w != r.pid) continue;
      r.running = false;
      if (failed(r.status) && !result) {
        spdlog::error("launch: {}; stopping the other ranks", describe_exit(r));
        result = exit_code_of(r.status);
        stop_others(SIGTERM);
      }
    }
    if (kill_at && Clock::now() > *kill_at) {
      for (Rank& r : ranks) {
        if (r.running) {
          spdlog::warn("launch: rank {} (pid {}) did not stop within {} s; killing it", r.rank, r.pid,
                       o.stop_grace_seconds);
          ::kill(r.pid, SIGKILL);
        }
      }
      kill_at = Clock::now() + std::chrono::hours(1);
    }
    // Ranks gone but their output pipes still open (a grandchild holds them): read for one more second.
    any_running = false;
    for (const Rank& r : ranks) any_running = any_running || r.running;
    if (!any_running && !drain_until) drain_until = Clock::now() + std::chrono::seconds(1);
  }
  for (Rank& r : ranks) {
    for (Stream* s : {&r.out, &r.err}) {
      if (s->fd >= 0) ::close(s->fd);
    }
  }
  return result.value_or(0);
}

}  // namespace tessera::dist
