// What a rank's process gets beyond fork and exec (launcher.cpp): starting as a fork of the launcher that runs an
// entry in-process (LaunchOptions::fork_entry, `train --fork-ranks`), and its slice of the CPUs (`--bind-cores`).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace tessera::dist::detail {

// Why this process cannot start a rank as a fork without exec, or "" when it can.
std::string fork_hazard();

// A forked rank after its setup: takes the rank's environment and thread count, runs the entry, exits with its code.
[[noreturn]] void run_forked_rank(const std::function<int(int, char**)>& entry, char* const* argv, char* const* envp,
                                  int keep_fd);

// The CPUs this process may run on, in order.
std::vector<int> allowed_cpus();

// --bind-cores: local rank `local`'s slice of `cpus` (LaunchOptions::bind_cores).
std::vector<int> rank_cpus(const std::vector<int>& cpus, int local, int nproc);

// "0-3,8" for {0, 1, 2, 3, 8}.
std::string cpu_list(const std::vector<int>& cpus);

}  // namespace tessera::dist::detail
