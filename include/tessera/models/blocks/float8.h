// Float8 training GEMMs (`precision: amp_fp8`): the Linear layers' three GEMMs -- output, input gradient and weight
// gradient -- in float8 through ATen's _scaled_mm with dynamic per-tensor scaling, as torchao's float8 training does
// with its tensorwise recipe (torchao/float8/float8_linear.py): the input and the weight cast to e4m3, the output's
// gradient to e5m2, each scaled by 448 (e4m3) or 57344 (e5m2) over its largest magnitude so that it fills the format's
// range; the output GEMM with fast accumulation. Everything else (norms, attention, the head, the loss) runs in the
// autocast dtype; weights, gradients and optimizer state stay as they are, so checkpoints are those of amp_bf16.
//
//   models::apply_float8(*model);   // every Linear layer whose sizes divide by 16
//
// Thread-compatible (stateless functions over the tensors given).
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <utility>

namespace tessera::models {

// `x` scaled and saturated into `fp8` (at::kFloat8_e4m3fn or at::kFloat8_e5m2): {x * s in fp8, 1 / s as an fp32
// scalar}, with s = the format's largest value / max|x| (max|x| at least 1e-12). On the device: no host sync.
std::pair<at::Tensor, at::Tensor> to_float8(const at::Tensor& x, at::ScalarType fp8);

// y = x W^T + b with the three GEMMs in float8 (above). x: (..., in), weight: (out, in), bias: (out) or undefined.
// The output is in the autocast dtype when autocast is on for x's device, else in x's dtype; the gradients in their
// tensors' dtypes. Falls back to at::linear when a GEMM's sizes do not divide by 16 (what _scaled_mm takes).
at::Tensor float8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

// Sets LinearImpl::float8 on every Linear layer of `model` whose in and out features divide by 16; returns how many.
// Layers computed elsewhere (a head that reuses the embedding table, tensor-parallel shards) are not affected.
int64_t apply_float8(torch::nn::Module& model);

// Empty when `device` runs float8 GEMMs (an NVIDIA GPU of compute capability 8.9 or newer: Ada, Hopper, Blackwell),
// else why not, in a sentence. Probed by one small _scaled_mm on the device.
std::string float8_unsupported_reason(const at::Device& device);

}  // namespace tessera::models
