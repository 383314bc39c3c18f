// Child processes: fork, then in the child only async-signal-safe calls up to exec.
#include "tessera/util/subprocess.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "tessera/util/error.h"

extern char** environ;

namespace tessera::util {
namespace {

ExitStatus from_wait(int status, const rusage& usage) {
  ExitStatus s;
  if (WIFSIGNALED(status)) {
    s.signal = WTERMSIG(status);
    s.code = 128 + s.signal;
  } else {
    s.code = WEXITSTATUS(status);
  }
  s.max_rss_bytes = static_cast<double>(usage.ru_maxrss) * 1024.0;  // kilobytes on Linux
  return s;
}

}  // namespace

std::vector<std::string> environment_with(const std::vector<std::pair<std::string, std::string>>& set) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view kv(*e);
    const std::string_view name = kv.substr(0, kv.find('='));
    if (std::none_of(set.begin(), set.end(), [&](const auto& s) { return s.first == name; })) env.emplace_back(kv);
  }
  for (const auto& [name, value] : set) env.push_back(name + "=" + value);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

std::string ExitStatus::describe() const {
  if (signal != 0) return fmt::format("was killed by signal {} ({})", signal, strsignal(signal));
  return fmt::format("exited with code {}", code);
}

pid_t spawn(const SpawnOptions& o) {
  if (o.argv.empty()) throw Error("process", "spawn: no program given");
  std::vector<std::string> env = environment_with(o.env);
  std::vector<std::string> args = o.argv;
  const std::vector<char*> envp = c_strings(env), argv = c_strings(args);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int c : o.cpus) CPU_SET(c, &cpus);
  int out_fd = -1;
  if (!o.output_path.empty()) {
    out_fd = ::open(o.output_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (out_fd < 0) {
      throw Error("process",
                  fmt::format("{}: cannot open {} for its output: {}", o.argv[0], o.output_path, std::strerror(errno)));
    }
  }
  int status[2];
  if (::pipe2(status, O_CLOEXEC) != 0) {
    const int e = errno;
    if (out_fd >= 0) ::close(out_fd);
    throw Error("process", fmt::format("pipe: {}", std::strerror(e)));
  }
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setsid();
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    int e = 0;
    if (!o.cpus.empty() && ::sched_setaffinity(0, sizeof(cpus), &cpus) != 0) e = errno;
    if (e == 0 && out_fd >= 0 && (::dup2(out_fd, 1) < 0 || ::dup2(out_fd, 2) < 0)) e = errno;
    if (e == 0) {
      ::execvpe(argv[0], argv.data(), envp.data());
      e = errno;
    }
    (void)!::write(status[1], &e, sizeof(e));
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::close(status[1]);
  if (out_fd >= 0) ::close(out_fd);
  if (pid < 0) {
    ::close(status[0]);
    throw Error("process", fmt::format("fork for {}: {}", o.argv[0], std::strerror(fork_errno)));
  }
  int child_errno = 0;
  ssize_t n;
  while ((n = ::read(status[0], &child_errno, sizeof(child_errno))) < 0 && errno == EINTR) {
  }
  ::close(status[0]);
  if (n == static_cast<ssize_t>(sizeof(child_errno))) {
    int ignored = 0;
    while (::waitpid(pid, &ignored, 0) < 0 && errno == EINTR) {
    }
    throw Error("process", fmt::format("cannot run {}: {}", o.argv[0], std::strerror(child_errno)));
  }
  return pid;
}

std::optional<ExitStatus> poll_exit(pid_t pid) {
  int status = 0;
  rusage usage{};
  pid_t r;
  while ((r = ::wait4(pid, &status, WNOHANG, &usage)) < 0 && errno == EINTR) {
  }
  if (r == 0) return std::nullopt;
  if (r < 0) throw Error("process", fmt::format("waiting for pid {}: {}", pid, std::strerror(errno)));
  return from_wait(status, usage);
}

ExitStatus wait_exit(pid_t pid) {
  int status = 0;
  rusage usage{};
  pid_t r;
  while ((r = ::wait4(pid, &status, 0, &usage)) < 0 && errno == EINTR) {
  }
  if (r < 0) throw Error("process", fmt::format("waiting for pid {}: {}", pid, std::strerror(errno)));
  return from_wait(status, usage);
}

void signal_group(pid_t pid, int sig) {
  if (::kill(-pid, sig) != 0) ::kill(pid, sig);
}

}  // namespace tessera::util
