// File and folder patterns that also name the batch (the profiler's traces, oom_observer's snapshots).
#pragma once

#include <cstdint>
#include <string>

namespace tessera::util {

// util::fill_path_pattern (every {run_name} and {rank}) and every {batch} replaced by `batch`.
std::string fill_path_pattern(std::string pattern, const std::string& run_name, int64_t rank, int64_t batch);

}  // namespace tessera::util
