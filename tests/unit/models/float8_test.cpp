// Float8 GEMMs (models/float8.h, precision: amp_fp8) on the CPU, where ATen's _scaled_mm runs them exactly: the casts
// fill the formats' ranges and round as the formats do; float8_linear's output and gradients are the GEMMs of the
// dequantised operands (to bf16 rounding) and near the full-precision layer's; a model with float8 layers trains
// forward and backward near its bf16 self. The trainer's GPU check is in trainer_test.cpp and gpu_test.cpp.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>

#include "models/mpt/mpt.h"
#include "tessera/models/blocks/float8.h"
#include "tessera/models/blocks/layers.h"
#include "tessera/models/causal_lm.h"

namespace float8_test {

using namespace tessera;

at::Tensor randn(std::vector<int64_t> shape, uint64_t seed, double std = 1.0) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::empty(shape).normal_(0, std, gen);
}

// ||a - b|| / ||b||.
double relative_error(const at::Tensor& a, const at::Tensor& b) {
  return ((a.to(at::kFloat) - b.to(at::kFloat)).norm() / b.to(at::kFloat).norm()).item<double>();
}

TEST(Float8, CastsFillTheFormatsRangeAndRoundAsTheFormatDoes) {
  const at::Tensor x = randn({64, 48}, 1, 0.02);
  for (const auto& [dtype, top, mantissa] : std::vector<std::tuple<at::ScalarType, double, int>>{
           {at::kFloat8_e4m3fn, 448.0, 3}, {at::kFloat8_e5m2, 57344.0, 2}}) {
    const auto [q, inverse] = models::to_float8(x, dtype);
    ASSERT_EQ(q.scalar_type(), dtype);
    ASSERT_EQ(inverse.dim(), 0);
    // The largest magnitude lands on the format's largest value.
    EXPECT_EQ(q.to(at::kFloat).abs().max().item<double>(), top);
    EXPECT_NEAR(inverse.item<double>(), x.abs().max().item<double>() / top, 1e-6 * inverse.item<double>());
    // Dequantised, each value is within half a step of the format (2^-(mantissa + 1) relative) of the original, or
    // within the subnormal step where it is tiny.
    const at::Tensor back = q.to(at::kFloat) * inverse;
    const double tiny = std::ldexp(inverse.item<double>(), dtype == at::kFloat8_e4m3fn ? -9 : -16);
    EXPECT_TRUE((back - x).abs().le(x.abs() * std::ldexp(1.0, -(mantissa + 1)) + tiny).all().item<bool>());
  }
  // All zeros: the scale stays finite, the values zero.
  const auto [zq, zinv] = models::to_float8(at::zeros({16, 16}), at::kFloat8_e4m3fn);
  EXPECT_TRUE(std::isfinite(zinv.item<double>()));
  EXPECT_EQ(zq.to(at::kFloat).abs().max().item<double>(), 0.0);
}

TEST(Float8, LinearIsTheGemmsOfItsDequantisedOperandsAndNearTheFullPrecisionLayer) {
  const at::Tensor x = randn({4, 8, 64}, 2).to(at::kBFloat16);
  const at::Tensor w = randn({48, 64}, 3, 0.1);
  const at::Tensor b = randn({48}, 4, 0.1);
  const at::Tensor g = randn({4, 8, 48}, 5).to(at::kBFloat16);  // the upstream gradient
  at::Tensor xl = x.clone().requires_grad_(true), wl = w.clone().requires_grad_(true),
             bl = b.clone().requires_grad_(true);
  const at::Tensor y = models::float8_linear(xl, wl, bl);
  ASSERT_EQ(y.scalar_type(), at::kBFloat16);  // x's dtype without autocast
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{4, 8, 48}));
  torch::autograd::backward({y}, {g});
  ASSERT_EQ(xl.grad().scalar_type(), at::kBFloat16);
  ASSERT_EQ(wl.grad().scalar_type(), at::kFloat);

  // The same GEMMs on the dequantised float8 operands, in fp32.
  const auto [x8, xi] = models::to_float8(x.reshape({-1, 64}), at::kFloat8_e4m3fn);
  const auto [w8, wi] = models::to_float8(w, at::kFloat8_e4m3fn);
  const auto [g8, gi] = models::to_float8(g.reshape({-1, 48}), at::kFloat8_e5m2);
  const at::Tensor xd = x8.to(at::kFloat) * xi, wd = w8.to(at::kFloat) * wi, gd = g8.to(at::kFloat) * gi;
  const at::Tensor y_ref = (at::matmul(xd, wd.t()).to(at::kBFloat16) + b.to(at::kBFloat16)).reshape({4, 8, 48});
  EXPECT_LE(relative_error(y, y_ref), 1.0 / 256);  // bf16 rounding of the GEMM and the bias add
  EXPECT_LE(relative_error(xl.grad().reshape({-1, 64}), at::matmul(gd, wd)), 1.0 / 256);
  EXPECT_LE(relative_error(wl.grad(), at::matmul(gd.t(), xd)), 1e-5);  // accumulated and returned in fp32
  EXPECT_LE(relative_error(bl.grad(), g.to(at::kFloat).sum(at::IntArrayRef{0, 1})), 1.0 / 256);

  // And near the exact layer in fp32, by float8's 3 (e4m3) and 2 (e5m2) mantissa bits: a rounding error of 1.6-3.1%
  // (e4m3) and 3.1-6.3% (e5m2) of each operand's value, which the GEMMs average but do not cancel.
  at::Tensor xe = x.to(at::kFloat).requires_grad_(true), we = w.clone().requires_grad_(true);
  const at::Tensor ye = at::linear(xe, we, b);
  torch::autograd::backward({ye}, {g.to(at::kFloat)});
  EXPECT_LT(relative_error(y, ye), 0.08);
  EXPECT_LT(relative_error(xl.grad(), xe.grad()), 0.15);
  EXPECT_LT(relative_error(wl.grad(), we.grad()), 0.15);
}

TEST(Float8, SizesThatDoNotDivideBy16FallBackToTheExactGemm) {
  const at::Tensor x = randn({3, 20}, 6), w = randn({16, 20}, 7);  // in_features 20
  EXPECT_TRUE(at::equal(models::float8_linear(x, w, at::Tensor()), at::linear(x, w)));
}

TEST(Float8, AModelsLinearLayersSwitchAndItTrainsNearItsBf16Self) {
  models::MPTOptions o;
  o.d_model = 64, o.n_heads = 4, o.n_layers = 2, o.vocab_size = 96, o.max_seq_len = 32;
  o.attn.kv_n_heads = 4;
  models::MPTForCausalLM fp8 = models::build_mpt(o, 11);
  models::MPTForCausalLM bf16 = models::build_mpt(o, 11);
  int64_t linears = 0;
  for (const auto& m : fp8->modules()) linears += m->as<models::LinearImpl>() != nullptr ? 1 : 0;
  // Every Linear of this model divides by 16 (Wqkv 64 -> 192, out_proj, up 64 -> 256, down).
  EXPECT_EQ(models::apply_float8(*fp8), linears);
  EXPECT_EQ(linears, 8);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(12);
  const at::Tensor ids = at::randint(96, {2, 32}, gen, at::kLong);
  auto step = [&](models::MPTForCausalLM& m) {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    const at::Tensor logits = m->forward(ids);
    const at::Tensor loss = models::causal_lm_loss(logits, ids);
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
    torch::autograd::backward({loss});
    return loss.item<double>();
  };
  const double loss8 = step(fp8), loss16 = step(bf16);
  EXPECT_TRUE(std::isfinite(loss8));
  EXPECT_NEAR(loss8, loss16, 0.02 * loss16);
  const auto p8 = fp8->named_parameters(), p16 = bf16->named_parameters();
  for (const auto& item : p16) {
    const at::Tensor& g16 = item.value().grad();
    const at::Tensor& g8 = p8[item.key()].grad();
    ASSERT_TRUE(g8.defined()) << item.key();
    EXPECT_GT(at::cosine_similarity(g8.flatten(), g16.flatten(), 0).item<double>(), 0.95) << item.key();
  }
}

}  // namespace float8_test
