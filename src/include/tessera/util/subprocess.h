// Child processes for tools that run other Tessera programs (the planner's trials and jobs): one process started
// with given arguments, environment, CPU affinity and output file, in a session of its own so that a signal reaches
// everything it started; and its exit status with its peak memory.
//
// Not thread-safe for concurrent spawns from several threads (the environment is read while forking).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tessera::util {

struct SpawnOptions {
  std::vector<std::string> argv;                         // argv[0]: a path, or a name found in PATH
  std::vector<std::pair<std::string, std::string>> env;  // set on top of this process's environment
  std::vector<int> cpus;                                 // CPU affinity of the child (empty: inherited)
  std::string output_path;                               // stdout and stderr appended here (empty: inherited)
};

// This process's environment ("NAME=value" entries) with `set` added, replacing variables of the same names.
std::vector<std::string> environment_with(const std::vector<std::pair<std::string, std::string>>& set);
// Pointers to the strings' characters, null-terminated, for execve (valid while `strings` is unchanged).
std::vector<char*> c_strings(std::vector<std::string>& strings);

// Starts the process (setsid: its pid is its process group; it gets SIGKILL if this process dies). Throws Error naming
// the program when it cannot be started (fork fails, the output file cannot be opened, exec fails).
pid_t spawn(const SpawnOptions& options);

struct ExitStatus {
  int code = 0;              // the exit code, or 128 + the signal for a process killed by one (the shell's form)
  int signal = 0;            // the signal that killed it; 0 when it exited
  double max_rss_bytes = 0;  // the largest resident set of the process or any descendant it waited for
  // "exited with code 1", "was killed by signal 9 (Killed)".
  std::string describe() const;
};

// The status of a child that has exited, reaping it; nullopt while it runs.
std::optional<ExitStatus> poll_exit(pid_t pid);
// Waits for the child to exit and reaps it.
ExitStatus wait_exit(pid_t pid);
// Sends `sig` to the child's process group (the child and whatever it started).
void signal_group(pid_t pid, int sig);

}  // namespace tessera::util
