// Starting a rank as a fork of the launcher, and binding it to its CPUs (rank_start.h).
#include "rank_start.h"

#include <ATen/Parallel.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>

namespace tessera::dist::detail {
namespace {

// What exec would do to a forked rank that does not exec: closes every descriptor above 2 marked close-on-exec, but
// `keep`. (Its status pipe is among them: the launcher then knows the rank runs.)
void close_on_exec_descriptors(int keep) {
  std::vector<int> fds;
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.find_first_not_of("0123456789") == std::string::npos) fds.push_back(std::stoi(name));
  }
  for (const int fd : fds) {
    const int flags = ::fcntl(fd, F_GETFD);
    if (fd > 2 && fd != keep && flags >= 0 && (flags & FD_CLOEXEC) != 0) ::close(fd);
  }
}

}  // namespace

// Why this process cannot start a rank as a fork without exec (LaunchOptions::fork_entry), or "" when it can: a forked
// child has only the forking thread, so a lock another thread held stays held in it forever; and a child of a process
// that has initialized CUDA cannot use CUDA. The background threads of a jemalloc (Arrow's, loaded with it) are no
// hazard: jemalloc takes its locks around fork itself and restarts the threads in the child when asked to.
std::string fork_hazard() {
  std::vector<std::string> others;
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/proc/self/task", ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename() == std::to_string(::gettid())) continue;
    std::ifstream comm_file(it->path() / "comm");
    std::string comm;
    std::getline(comm_file, comm);
    if (comm != "jemalloc_bg_thd") others.push_back(comm.empty() ? it->path().filename().string() : comm);
  }
  if (ec) return "/proc/self/task cannot be read: " + ec.message();
  if (!others.empty()) return fmt::format("the launcher runs other threads ({})", fmt::join(others, ", "));
  std::ifstream maps("/proc/self/maps");
  if (!maps) return "/proc/self/maps cannot be read";
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/libcuda.so") != std::string::npos) return "the launcher has loaded the CUDA driver";
  }
  return "";
}

// A forked rank after its setup in start_rank: takes the rank's environment, sets the thread count a fresh process
// takes from OMP_NUM_THREADS when OpenMP loads, runs the entry and exits with its code. Single-threaded, so free to
// allocate (fork_hazard checked that the launcher was).
[[noreturn]] void run_forked_rank(const std::function<int(int, char**)>& entry, char* const* argv, char* const* envp,
                                  int keep_fd) {
  close_on_exec_descriptors(keep_fd);
  environ = const_cast<char**>(envp);
  if (const char* n = std::getenv("OMP_NUM_THREADS")) {
    // "8" or a list ("8,2": the first level's); a fresh process ignores what it cannot parse, and so does this.
    char* end = nullptr;
    const long threads = std::strtol(n, &end, 10);
    if (end != n && threads > 0 && threads <= INT_MAX) at::set_num_threads(static_cast<int>(threads));
  }
  int argc = 0;
  while (argv[argc] != nullptr) ++argc;
  const int code = entry(argc, const_cast<char**>(argv));
  // No static destructors: the objects the launcher left in this copy of its memory are not the rank's to destroy.
  spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->flush(); });
  std::fflush(nullptr);
  ::_exit(code);
}

// The CPUs this process may run on, in order.
std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

// --bind-cores: local rank `local`'s slice of `cpus` (LaunchOptions::bind_cores).
std::vector<int> rank_cpus(const std::vector<int>& cpus, int local, int nproc) {
  const size_t n = cpus.size(), first = n * static_cast<size_t>(local) / static_cast<size_t>(nproc);
  const size_t last = n * static_cast<size_t>(local + 1) / static_cast<size_t>(nproc);
  return {cpus.begin() + static_cast<std::ptrdiff_t>(first), cpus.begin() + static_cast<std::ptrdiff_t>(last)};
}

// "0-3,8" for {0, 1, 2, 3, 8}.
std::string cpu_list(const std::vector<int>& cpus) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    parts.push_back(j == i ? std::to_string(cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]));
    i = j + 1;
  }
  return fmt::format("{}", fmt::join(parts, ","));
}

}  // namespace tessera::dist::detail
