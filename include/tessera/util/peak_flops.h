// Measures this machine's matrix-multiply throughput, the denominator of MFU when no vendor peak is known (CPUs).
#pragma once

#include <ATen/ATen.h>

#include <string>

namespace tessera::util {

// FLOP/s of at::mm on two n x n matrices of `dtype` on `device`, best of the repetitions run within about `seconds`
// after one warm-up. Deterministic inputs; not thread-safe with other work on the same cores (it measures them).
double measure_matmul_flops(at::ScalarType dtype, const at::Device& device = at::kCPU, int64_t n = 2048,
                            double seconds = 1.0);

// Whether this CPU computes bf16 matrix products natively, and how fast, for `precision: auto` and the speed
// monitor's warning. Without native support (x86 CPUs without AVX512-BF16 or AMX, ARM without BF16) LibTorch emulates
// bf16 GEMMs, about 50x slower than fp32; ONEDNN_MAX_CPU_ISA below the CPU's own ISA has the same effect, which only a
// measurement sees.
struct CpuBf16 {
  bool flag = false;      // the CPU advertises bf16 instructions (/proc/cpuinfo: avx512_bf16, amx_bf16; ARM: bf16)
  double bf16_flops = 0;  // measured GEMM FLOP/s in bf16 and in fp32, on this process's intra-op threads
  double fp32_flops = 0;
  // Native: advertised, and not measured at emulation speed. Native bf16 measures 1-3x fp32 here (2-core AVX512-BF16
  // host, two processes side by side included), emulated bf16 about 1/50 of it; a quarter separates them with room
  // for noise, which a "faster than fp32" rule would not have at these sizes.
  bool native() const { return flag && bf16_flops >= fp32_flops / 4; }
  // "0.9 GFLOP/s in bf16 against 116 GFLOP/s in fp32".
  std::string rates() const;
};

// Reads the flags and measures both dtypes on 512 x 512 matrices: about 0.05 s with native bf16, 0.8 s without.
// Not thread-safe with other work on the same cores (it measures them).
CpuBf16 probe_cpu_bf16();

}  // namespace tessera::util
