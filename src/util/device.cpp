// Device discovery through LibTorch.
#include "tessera/util/device.h"

#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <algorithm>
#include <array>
#include <climits>
#include <string>
#include <string_view>

namespace tessera::util {

DeviceInfo device_info() {
  DeviceInfo info;
  info.cpu_threads = at::get_num_threads();
  info.cuda_devices = at::hasCUDA() ? static_cast<int>(at::detail::getCUDAHooks().deviceCount()) : 0;
  info.torch_version = TORCH_VERSION;
  if (at::detail::getCUDAHooks().hasCUDART()) {
    const int v = at::detail::getCUDAHooks().versionCUDART();
    info.cuda_version = fmt::format("{}.{}", v / 1000, (v % 1000) / 10);
  }
  return info;
}

std::string describe(const DeviceInfo& info) {
  std::string cuda = info.cuda_devices > 0 ? fmt::format("{} device(s)", info.cuda_devices) : "no device";
  std::string build = info.cuda_version.empty() ? "CPU-only build" : "CUDA " + info.cuda_version + " build";
  return fmt::format("cpu ({} threads); cuda: {} (LibTorch {}, {})", info.cpu_threads, cuda, info.torch_version, build);
}

std::string host_name() {
  std::array<char, HOST_NAME_MAX + 1> name{};
  if (::gethostname(name.data(), name.size() - 1) != 0 || name[0] == '\0') return "localhost";
  return name.data();
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return 1;
}

bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr) return true;  // the CUDA caching allocator
  // LibTorch's CPU allocator reports a failed allocation as a plain c10::Error (an enforce failure).
  return dynamic_cast<const c10::Error*>(&e) != nullptr &&
         std::string_view(e.what()).find("DefaultCPUAllocator: can't allocate memory") != std::string_view::npos;
}

}  // namespace tessera::util
