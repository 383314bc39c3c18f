// Precision names and dtypes.
#include "tessera/core/precision.h"

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

}  // namespace tessera::core
