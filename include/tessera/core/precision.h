// Training precision (Composer's Precision): what the forward and loss run in under autocast.
#pragma once

#include <c10/core/ScalarType.h>

#include <string>

namespace tessera::core {

// fp32: everything in fp32; amp_bf16 / amp_fp16: autocast of forward and loss to bf16 / fp16 with fp32 weights,
// gradients and optimizer state (amp_fp16 adds dynamic loss scaling and needs a GPU).
enum class Precision { kFp32, kAmpBf16, kAmpFp16 };

// "fp32", "amp_bf16", "amp_fp16".
std::string to_string(Precision p);

// The dtype autocast computes in: kFloat for fp32, kBFloat16, kHalf.
c10::ScalarType autocast_dtype(Precision p);

}  // namespace tessera::core
