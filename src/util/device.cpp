// Device discovery through LibTorch.
#include "tessera/util/device.h"

#include <fmt/format.h>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/version.h>

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

}  // namespace tessera::util
