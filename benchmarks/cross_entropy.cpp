// The training loss's forward and backward on a batch of logits: torch's cross_entropy on the fp32 logits (what the
// trainer computed before, and what HF's models compute) against models::chunked_cross_entropy, each in its own
// process so that its peak memory is its own.
//
//   bench_cross_entropy --variant torch|chunked [--rows 8192] [--vocab 50368] [--dtype bf16|fp32] [--iters 5]
//                       [--device cpu|gpu]
//
// Prints one JSON object: milliseconds per forward + backward (after one untimed), the loss, and the peak memory: the
// process's resident high-water mark on the CPU (VmHWM, which includes the logits themselves and LibTorch's ~0.3 GB),
// the CUDA allocator's peak on a GPU. docs/performance.md quotes it.
#include <c10/cuda/CUDACachingAllocator.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "tessera/models/loss.h"

namespace {

double vm_hwm_gb() {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == "VmHWM:") {
      double kb = 0;
      in >> kb;
      return kb * 1024 / 1e9;
    }
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The training loss's forward and backward: torch's cross_entropy vs the chunked one"};
  std::string variant = "chunked", dtype = "bf16", device = "cpu";
  int64_t rows = 8192, vocab = 50368, iters = 5;
  app.add_option("--variant", variant)->check(CLI::IsMember({"torch", "chunked"}));
  app.add_option("--rows", rows, "positions (batch x sequence)");
  app.add_option("--vocab", vocab);
  app.add_option("--dtype", dtype, "the logits' dtype")->check(CLI::IsMember({"bf16", "fp32"}));
  app.add_option("--iters", iters);
  app.add_option("--device", device)->check(CLI::IsMember({"cpu", "gpu"}));
  CLI11_PARSE(app, argc, argv);
  const bool cuda = device == "gpu";
  const auto options = at::TensorOptions().device(cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU));
  at::manual_seed(0);
  // Drawn in their dtype (no fp32 copy on the way), so that the high-water mark is the loss's.
  const at::Tensor logits = at::randn({rows, vocab}, options.dtype(dtype == "bf16" ? at::kBFloat16 : at::kFloat))
                                .mul_(3)
                                .requires_grad_(true);
  const at::Tensor targets = at::randint(vocab, {rows}, options.dtype(at::kLong));
  auto step = [&] {
    logits.mutable_grad() = at::Tensor();
    const at::Tensor loss =
        variant == "torch" ? at::cross_entropy_loss(logits.to(at::kFloat), targets, {}, at::Reduction::Sum, -100, 0.0)
                           : tessera::models::chunked_cross_entropy(logits, targets);
    torch::autograd::backward({loss});
    return loss.item<double>();  // waits for the device
  };
  if (cuda) c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  double loss = step();
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iters; ++i) loss = step();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
                    static_cast<double>(iters);
  nlohmann::ordered_json out;
  out["variant"] = variant;
  out["device"] = device;
  out["rows"] = rows;
  out["vocab"] = vocab;
  out["dtype"] = dtype;
  out["ms"] = ms;
  out["loss"] = loss;
  out["logits_gb"] = static_cast<double>(logits.numel() * logits.element_size()) / 1e9;
  if (cuda) {
    const auto agg = static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE);
    out["peak_allocated_gb"] =
        static_cast<double>(c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[agg].peak) / 1e9;
  } else {
    out["peak_rss_gb"] = vm_hwm_gb();
  }
  std::cout << out.dump() << std::endl;
  return 0;
}
