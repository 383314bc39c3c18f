// GEMM throughput probe.
#include "tessera/util/peak_flops.h"

#include <algorithm>
#include <chrono>

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

}  // namespace tessera::util
