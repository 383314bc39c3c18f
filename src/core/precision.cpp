// Precision names and dtypes.
#include "tessera/core/precision.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "tessera/util/device.h"
#include "tessera/util/error.h"
#include "tessera/util/peak_flops.h"

namespace tessera::core {

std::string to_string(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kAmpBf16:
      return "amp_bf16";
    case Precision::kAmpFp16:
      return "amp_fp16";
    case Precision::kAmpFp8:
      return "amp_fp8";
  }
  return "?";
}

c10::ScalarType autocast_dtype(Precision p) {
  switch (p) {
    case Precision::kAmpBf16:
    case Precision::kAmpFp8:
      return c10::kBFloat16;
    case Precision::kAmpFp16:
      return c10::kHalf;
    case Precision::kFp32:
      break;
  }
  return c10::kFloat;
}

Precision auto_precision(const c10::Device& device) {
  if (device.is_cuda()) {
    spdlog::info("precision: auto -> amp_bf16 (GPU)");
    return Precision::kAmpBf16;
  }
  const util::CpuBf16 bf16 = util::probe_cpu_bf16();
  if (bf16.native()) {
    spdlog::info("precision: auto -> amp_bf16 (bf16 is native on this CPU: {})", bf16.rates());
    return Precision::kAmpBf16;
  }
  spdlog::info("precision: auto -> fp32 (bf16 is {} on this CPU: {})", bf16.flag ? "slower than fp32" : "emulated",
               bf16.rates());
  return Precision::kFp32;
}

c10::Device device_from_flag(const std::string& name, int local_rank, const std::string& tool) {
  const util::DeviceInfo dev = util::device_info();
  if (name != "auto" && name != "cpu" && name != "gpu") {
    throw ConfigError(tool, fmt::format("--device {}: expected auto, cpu or gpu", name));
  }
  if (name == "gpu" && dev.cuda_devices == 0) {
    throw ConfigError(tool, fmt::format("--device gpu, but {}", util::describe(dev)));
  }
  if (name == "gpu" || (name == "auto" && dev.cuda_devices > 0)) {
    return {c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank % std::max(1, dev.cuda_devices))};
  }
  return c10::Device(c10::kCPU);
}

Precision precision_from_flag(const std::string& name, const c10::Device& device, const std::string& tool) {
  Precision p = Precision::kFp32;
  if (name == "auto") {
    p = auto_precision(device);
  } else if (name == "amp_bf16") {
    p = Precision::kAmpBf16;
  } else if (name == "amp_fp16") {
    p = Precision::kAmpFp16;
  } else if (name != "fp32") {
    throw ConfigError(tool, fmt::format("--precision {}: expected auto, fp32, amp_bf16 or amp_fp16", name));
  }
  if (p == Precision::kAmpFp16 && !device.is_cuda()) {
    throw ConfigError(tool, "--precision amp_fp16 needs a GPU; use amp_bf16 or fp32 on the CPU");
  }
  return p;
}

}  // namespace tessera::core
