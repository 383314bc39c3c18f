// Precision names and dtypes.
#include "tessera/core/precision.h"

#include <spdlog/spdlog.h>

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

}  // namespace tessera::core
