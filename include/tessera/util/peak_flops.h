// Measures this machine's matrix-multiply throughput, the denominator of MFU when no vendor peak is known (CPUs).
#pragma once

#include <ATen/ATen.h>

namespace tessera::util {

// FLOP/s of at::mm on two n x n matrices of `dtype` on `device`, best of the repetitions run within about `seconds`
// after one warm-up. Deterministic inputs; not thread-safe with other work on the same cores (it measures them).
double measure_matmul_flops(at::ScalarType dtype, const at::Device& device = at::kCPU, int64_t n = 2048,
                            double seconds = 1.0);

}  // namespace tessera::util
