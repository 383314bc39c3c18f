// What compute this process sees: CPU threads and CUDA devices, as LibTorch reports them.
#pragma once

#include <exception>
#include <string>

namespace tessera::util {

struct DeviceInfo {
  int cpu_threads = 0;        // LibTorch intra-op threads (at::get_num_threads())
  int cuda_devices = 0;       // 0 when the CUDA build runs without a GPU or driver
  std::string torch_version;  // e.g. "2.11.0"
  std::string cuda_version;   // CUDA version LibTorch was built with, e.g. "13.0"; empty for CPU-only builds
};

// Thread-safe; cheap after the first call (LibTorch caches device discovery).
DeviceInfo device_info();

// One line for logs and plans: "cpu (2 threads); cuda: no device (LibTorch 2.11.0, CUDA 13.0 build)".
std::string describe(const DeviceInfo& info);

// Number of CPU cores this process may run on (sched_getaffinity), at least 1.
int available_cores();

// This machine's host name (gethostname), "localhost" when it has none.
std::string host_name();

// Whether `e` is an out-of-memory error: CUDA's (c10::OutOfMemoryError) or LibTorch's CPU allocator failing.
bool is_out_of_memory(const std::exception& e);

}  // namespace tessera::util
