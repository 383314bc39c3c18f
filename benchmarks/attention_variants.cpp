// Attention kernel variants on the CPU, forward+backward, at MPT-125m's head shape (12 heads of 64), with an ALiBi
// (float) mask as MPT uses. Prints milliseconds per call for each variant and sequence length; the winner per shape
// is what src/models/attention.cpp uses.
//
//   variant 1: at::scaled_dot_product_attention with the additive mask (fused flash kernel on CPU)
//   variant 2: explicit softmax(Q K^T * scale + mask) V (matmuls; softmax in fp32 under autocast)
//
//   bench_attention_variants [--reps 10] [--threads N]
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <vector>

namespace {

at::Tensor explicit_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                              double scale) {
  at::Tensor scores = at::matmul(q, k.transpose(-1, -2)) * scale + mask;
  return at::matmul(at::softmax(scores, -1, at::kFloat).to(v.scalar_type()), v);
}

double time_ms(int variant, int64_t s, at::ScalarType dtype, int reps) {
  const int64_t h = 12, d = 64;
  auto opts = at::TensorOptions().dtype(dtype);
  at::Tensor q = at::randn({1, h, s, d}, opts).requires_grad_(), k = at::randn({1, h, s, d}, opts).requires_grad_(),
             v = at::randn({1, h, s, d}, opts).requires_grad_();
  const at::Tensor blocked = at::ones({s, s}, at::kBool).triu(1);
  const at::Tensor mask = (at::arange(s, at::kFloat) - (s - 1)).view({1, 1, 1, s}) * 0.5;
  const at::Tensor full =
      mask.expand({1, h, s, s}).masked_fill(blocked, std::numeric_limits<float>::lowest()).to(dtype);
  const double scale = 0.125;
  std::vector<double> times;
  for (int r = 0; r < reps + 1; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    at::Tensor out = variant == 1 ? at::scaled_dot_product_attention(q, k, v, full, 0.0, false, scale)
                                  : explicit_attention(q, k, v, full, scale);
    out.sum().backward();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"attention variants"};
  int reps = 10;
  int threads = 0;
  app.add_option("--reps", reps);
  app.add_option("--threads", threads);
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) at::set_num_threads(threads);
  fmt::print("attention fwd+bwd, 12 heads x 64, ALiBi mask, {} threads; median ms of {} calls\n", at::get_num_threads(),
             reps);
  fmt::print("{:<7}{:>8}{:>14}{:>14}\n", "dtype", "seq", "1: sdpa", "2: explicit");
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (int64_t s : {128, 256, 512, 1024, 2048}) {
      fmt::print("{:<7}{:>8}{:>14.2f}{:>14.2f}\n", dtype == at::kFloat ? "fp32" : "bf16", s, time_ms(1, s, dtype, reps),
                 time_ms(2, s, dtype, reps));
    }
  }
}
