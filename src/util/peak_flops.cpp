// GEMM throughput probe.
#include "tessera/util/peak_flops.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>

namespace tessera::util {

double measure_matmul_flops(at::ScalarType dtype, const at::Device& device, int64_t n, double seconds) {
  at::NoGradGuard no_grad;
  const auto opts = at::TensorOptions().dtype(dtype).device(device);
  const at::Tensor a = at::ones({n, n}, opts) / static_cast<double>(n), b = at::ones({n, n}, opts);
  at::Tensor c = at::mm(a, b);  // warm-up
  c.sum().item<double>();       // synchronises the device too
  using clock = std::chrono::steady_clock;
  const auto until = clock::now() + std::chrono::duration<double>(seconds);
  double best = 0;
  int reps = 0;
  while (reps < 2 || clock::now() < until) {
    const auto t0 = clock::now();
    c = at::mm(a, b);
    c.sum().item<double>();
    const double dt = std::chrono::duration<double>(clock::now() - t0).count();
    best = std::max(best, 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / dt);
    ++reps;
  }
  return best;
}

namespace {

// Whether a "flags" (x86) or "Features" (ARM) line of /proc/cpuinfo names bf16 instructions.
bool cpu_advertises_bf16() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0 && line.rfind("Features", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::string w;
    while (words >> w) {
      if (w == "avx512_bf16" || w == "amx_bf16" || w == "bf16") return true;
    }
    return false;  // the first CPU's line speaks for all
  }
  return false;
}

}  // namespace

std::string CpuBf16::rates() const {
  return fmt::format("bf16 {:.1f}, fp32 {:.1f} GFLOP/s", bf16_flops / 1e9, fp32_flops / 1e9);
}

CpuBf16 probe_cpu_bf16() {
  CpuBf16 r;
  r.flag = cpu_advertises_bf16();
  // 512: below ~384, call overheads dominate even native bf16 GEMMs (1-9 GFLOP/s at 128-256, noisy); from 512 on
  // native bf16 runs 2-3x fp32 and emulated bf16 ~50x slower. The two dtypes alternate, best of 5 each, so that
  // other work on the cores (ranks or tests side by side) slows both alike.
  constexpr int64_t n = 512;
  at::NoGradGuard no_grad;
  const at::Tensor a32 = at::ones({n, n}, at::kFloat) / static_cast<double>(n), b32 = at::ones({n, n}, at::kFloat);
  const at::Tensor a16 = a32.to(at::kBFloat16), b16 = b32.to(at::kBFloat16);
  const auto seconds_of = [](const at::Tensor& a, const at::Tensor& b) {
    const auto t0 = std::chrono::steady_clock::now();
    at::mm(a, b).sum().item<double>();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  seconds_of(a32, b32);  // warm-up
  seconds_of(a16, b16);
  double best32 = INFINITY, best16 = INFINITY;
  for (int rep = 0; rep < 5; ++rep) {
    best32 = std::min(best32, seconds_of(a32, b32));
    best16 = std::min(best16, seconds_of(a16, b16));
  }
  const double flop = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  r.fp32_flops = flop / best32;
  r.bf16_flops = flop / best16;
  return r;
}

}  // namespace tessera::util
