// Training precision (Composer's Precision): what the forward and loss run in under autocast.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <string>

namespace tessera::core {

// fp32: everything in fp32; amp_bf16 / amp_fp16: autocast of forward and loss to bf16 / fp16 with fp32 weights,
// gradients and optimizer state (amp_fp16 adds dynamic loss scaling and needs a GPU); amp_fp8: amp_bf16 with the
// Linear layers' GEMMs in float8 (models/float8.h; a GPU of compute capability 8.9 or newer).
enum class Precision { kFp32, kAmpBf16, kAmpFp16, kAmpFp8 };

// "fp32", "amp_bf16", "amp_fp16", "amp_fp8".
std::string to_string(Precision p);

// The dtype autocast computes in: kFloat for fp32, kBFloat16 (amp_bf16 and amp_fp8), kHalf.
c10::ScalarType autocast_dtype(Precision p);

// `precision: auto` (training and evaluation): amp_bf16 on a GPU, and on a CPU that computes bf16 natively
// (util::CpuBf16::native); fp32 where bf16 would be emulated, about 50x slower (docs/training.md#precision). Logs the
// choice and why.
Precision auto_precision(const c10::Device& device);

// What a command that runs a model (eval, serve) runs it on and in, from its flags: --device "auto" (a GPU when there
// is one: local rank i on GPU i), "cpu" or "gpu"; --precision "auto" (auto_precision()), "fp32", "amp_bf16" or
// "amp_fp16" (a GPU's). ConfigError naming `tool` when they ask for what this machine lacks.
c10::Device device_from_flag(const std::string& name, int local_rank, const std::string& tool);
Precision precision_from_flag(const std::string& name, const c10::Device& device, const std::string& tool);

}  // namespace tessera::core
