// MPT modules: initialisation statistics, ALiBi slopes, KV-cache decoding, padding, generation, meta construction.
#include <gtest/gtest.h>

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "models/mpt/mpt.h"
#include "tessera/models/generate.h"
#include "tessera/util/error.h"

namespace tessera::models {
namespace {

MPTOptions small(bool alibi = true) {
  MPTOptions o;
  o.d_model = 64;
  o.n_heads = 4;
  o.n_layers = 2;
  o.vocab_size = 97;
  o.max_seq_len = 64;
  o.attn.kv_n_heads = 4;
  o.attn.alibi = alibi;
  o.learned_pos_emb = !alibi;
  o.init.init_div_is_residual = std::sqrt(2.0 * o.n_layers);
  return o;
}

double stddev(const at::Tensor& t) {
  return t.to(at::kDouble).std().item<double>();
}

TEST(MPTInit, KaimingNormalStatisticsFollowLlmFoundry) {
  // LLM Foundry's default: kaiming_normal_(fan_in, relu) -> std sqrt(2 / fan_in); residual projections divided by
  // sqrt(2 n_layers); embeddings by the same scheme (fan_in = d_model); biases 0; norms 1.
  MPTOptions o = small(false);
  o.d_model = 256, o.n_heads = 8, o.n_layers = 4, o.vocab_size = 4000, o.attn.kv_n_heads = 8;
  o.init.init_div_is_residual = std::sqrt(8.0);
  MPTForCausalLM m = build_mpt(o, 1234);
  const double d = 256, f = 1024, div = std::sqrt(8.0);
  for (const auto& p : m->named_parameters()) {
    const std::string& n = p.key();
    const at::Tensor& t = p.value();
    double expected = -1;
    if (n.ends_with("Wqkv.weight") || n.ends_with("up_proj.weight") || n.ends_with("wte.weight") ||
        n.ends_with("wpe.weight")) {
      expected = std::sqrt(2.0 / d);
    } else if (n.ends_with("out_proj.weight")) {
      expected = std::sqrt(2.0 / d) / div;
    } else if (n.ends_with("down_proj.weight")) {
      expected = std::sqrt(2.0 / f) / div;
    }
    if (expected > 0) {
      EXPECT_NEAR(stddev(t), expected, expected * 0.03) << n;
      EXPECT_NEAR(t.mean().item<double>(), 0.0, expected * 0.03) << n;
    } else if (n.ends_with(".bias")) {
      EXPECT_EQ(t.abs().max().item<float>(), 0.0f) << n;
    } else {
      EXPECT_TRUE(at::all(t == 1).item<bool>()) << n;  // norm weights
    }
  }
  // Same seed, same weights; other seed, other weights.
  EXPECT_TRUE(at::equal(build_mpt(o, 1234)->transformer->wte->weight, m->transformer->wte->weight));
  EXPECT_FALSE(at::equal(build_mpt(o, 99)->transformer->wte->weight, m->transformer->wte->weight));
  // Options built in code without setting the divisor (its default, 0) get LLM Foundry's default, true: the same
  // weights, not a division by zero.
  MPTOptions unset = o;
  unset.init.init_div_is_residual = MPTOptions{}.init.init_div_is_residual;
  const MPTForCausalLM u = build_mpt(unset, 1234);
  const auto expected = m->named_parameters();
  for (const auto& p : u->named_parameters()) EXPECT_TRUE(at::equal(p.value(), expected[p.key()])) << p.key();
}

TEST(MPTInit, OtherSchemes) {
  MPTOptions o = small(false);
  o.d_model = 256, o.n_heads = 8, o.attn.kv_n_heads = 8, o.vocab_size = 2000;
  o.init.name = "baseline_";
  o.init.init_std = 0.02;
  o.init.emb_init_std = 0.5;
  MPTForCausalLM m = build_mpt(o);
  EXPECT_NEAR(stddev(m->transformer->wte->weight), 0.5, 0.02);
  auto* block = m->transformer->blocks[0]->as<MPTBlockImpl>();
  EXPECT_NEAR(stddev(block->attn->Wqkv->weight), 0.02, 0.001);
  EXPECT_NEAR(stddev(block->attn->out_proj->weight), 0.02 / o.init.init_div_is_residual, 0.001);
  o.init.name = "small_init_";
  o.init.emb_init_std.reset();
  m = build_mpt(o);
  EXPECT_NEAR(stddev(m->transformer->wte->weight), std::sqrt(2.0 / (5 * 256)), 0.002);
}

TEST(Alibi, SlopesMatchLlmFoundrysExamples) {
  // n_heads=12: _n = 16, base 2^(-k/2); k in {2,4,...,16} then {1,3,5,7}.
  const at::Tensor s = alibi_slopes(12, 8);
  const int ks[12] = {2, 4, 6, 8, 10, 12, 14, 16, 1, 3, 5, 7};
  for (int i = 0; i < 12; ++i) EXPECT_FLOAT_EQ(s[i].item<float>(), std::pow(2.0f, -ks[i] / 2.0f)) << i;
  const at::Tensor s32 = alibi_slopes(32, 8);
  EXPECT_NEAR(s32[0].item<float>(), 0.8409, 1e-4);
  EXPECT_FLOAT_EQ(s32[31].item<float>(), 0.00390625f);
}

class Decoding : public ::testing::TestWithParam<bool> {};

TEST_P(Decoding, KVCacheGivesTheFullForwardLogits) {
  MPTOptions o = small(GetParam());
  if (!GetParam()) o.attn.rope = false;
  MPTForCausalLM m = build_mpt(o, 3);
  m->eval();
  at::NoGradGuard ng;
  const at::Tensor ids = at::randint(0, o.vocab_size, {2, 11}, at::kLong);
  const at::Tensor full = m->forward(ids);
  KVCache cache;
  ForwardOptions fo;
  fo.cache = &cache;
  at::Tensor step = m->forward(ids.narrow(1, 0, 6), fo);  // prefill 6, then 2, then one at a time
  EXPECT_TRUE(at::allclose(step, full.narrow(1, 0, 6), 1e-5, 1e-5));
  step = m->forward(ids.narrow(1, 6, 2), fo);
  EXPECT_TRUE(at::allclose(step, full.narrow(1, 6, 2), 1e-5, 1e-5));
  for (int64_t t = 8; t < 11; ++t) {
    step = m->forward(ids.narrow(1, t, 1), fo);
    EXPECT_TRUE(at::allclose(step.squeeze(1), full.select(1, t), 1e-5, 1e-5)) << t;
  }
  EXPECT_EQ(cache.length, 11);
}

TEST_P(Decoding, LeftPaddedBatchGeneratesWhatEachPromptGeneratesAlone) {
  MPTOptions o = small(GetParam());
  MPTForCausalLM m = build_mpt(o, 5);
  GenerationOptions g;
  g.max_new_tokens = 6;
  const std::vector<std::vector<int64_t>> prompts = {{5, 9, 2, 44, 7, 1}, {3, 8}, {60, 61, 62, 63}};
  const auto batched = models::generate(*m, prompts, g);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(batched[i], models::generate(*m, {prompts[i]}, g)[0]) << i;
}

INSTANTIATE_TEST_SUITE_P(AlibiAndLearnedPositions, Decoding, ::testing::Bool());

TEST(Generate, StopsAndSamples) {
  MPTForCausalLM m = build_mpt(small(), 8);
  GenerationOptions g;
  g.max_new_tokens = 8;
  const std::vector<int64_t> greedy = models::generate(*m, {{1, 2, 3}}, g)[0];
  ASSERT_EQ(greedy.size(), 8u);
  // The first position whose token did not occur before it can serve as an end-of-sequence token.
  size_t first_new = 1;
  while (first_new < greedy.size() && std::find(greedy.begin(), greedy.begin() + static_cast<long>(first_new),
                                                greedy[first_new]) != greedy.begin() + static_cast<long>(first_new)) {
    ++first_new;
  }
  if (first_new < greedy.size()) {
    g.eos_token_id = greedy[first_new];
    auto out = models::generate(*m, {{1, 2, 3}}, g)[0];
    EXPECT_EQ(out, std::vector<int64_t>(greedy.begin(), greedy.begin() + static_cast<long>(first_new) + 1))
        << "stops after emitting EOS";
    g.eos_token_id.reset();
  }
  // A stop sequence ending at the last token (and nowhere earlier) stops exactly there.
  g.stop_sequences = {{greedy[6], greedy[7], -5}};  // never completes
  EXPECT_EQ(models::generate(*m, {{1, 2, 3}}, g)[0], greedy);
  g.stop_sequences = {std::vector<int64_t>(greedy.begin(), greedy.end())};
  EXPECT_EQ(models::generate(*m, {{1, 2, 3}}, g)[0], greedy);
  g.max_new_tokens = 20;
  EXPECT_EQ(models::generate(*m, {{1, 2, 3}}, g)[0], greedy) << "stops once the output ends with the stop sequence";
  g.max_new_tokens = 8;
  g.stop_sequences.clear();
  g.do_sample = true;
  g.top_k = 1;
  EXPECT_EQ(models::generate(*m, {{1, 2, 3}}, g)[0], greedy) << "top-k 1 is greedy";
  g.top_k = 0;
  g.top_p = 1e-6;
  EXPECT_EQ(models::generate(*m, {{1, 2, 3}}, g)[0], greedy) << "a tiny nucleus is greedy";
  g.top_p = 1.0;
  g.temperature = 5.0;
  g.seed = 11;
  const auto a = models::generate(*m, {{1, 2, 3}}, g)[0], b = models::generate(*m, {{1, 2, 3}}, g)[0];
  EXPECT_EQ(a, b) << "sampling is reproducible for a seed";
  g.seed = 12;
  EXPECT_NE(models::generate(*m, {{1, 2, 3}}, g)[0], a);
  g.temperature = 0;
  EXPECT_THROW(models::generate(*m, {{1}}, g), ConfigError);
}

TEST(MPT, MetaConstructionAllocatesNothingUntilMaterialized) {
  MPTOptions o = small(false);
  o.init_device = "meta";
  MPTForCausalLM meta = build_mpt(o, 4);
  for (const auto& p : meta->parameters()) EXPECT_TRUE(p.device().is_meta());
  EXPECT_EQ(meta->named_parameters().size(), 2u + 2 * 12 + 2);  // shapes and names are all there
  MPTForCausalLM m = materialize(meta, at::kCPU, 4);
  o.init_device = "cpu";
  MPTForCausalLM direct = build_mpt(o, 4);
  auto a = m->named_parameters(), b = direct->named_parameters();
  for (const auto& p : a) EXPECT_TRUE(at::equal(p.value(), b[p.key()])) << p.key();
}

TEST(MPT, LearnedPositionsRejectSequencesBeyondMaxSeqLen) {
  MPTOptions o = small(false);
  o.max_seq_len = 8;
  MPTForCausalLM m = build_mpt(o);
  EXPECT_THROW(m->forward(at::zeros({1, 9}, at::kLong)), Error);
  EXPECT_NO_THROW(m->forward(at::zeros({1, 8}, at::kLong)));
}

TEST(MPT, LowPrecisionLayerNormRunsInTheAutocastDtype) {
  MPTForCausalLM m = build_mpt(small(), 2);
  at::autocast::set_autocast_enabled(at::kCPU, true);
  at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  const at::Tensor h = m->transformer->norm_f(at::randn({2, 3, 64}));
  const at::Tensor logits = m->forward(at::zeros({1, 5}, at::kLong));
  at::autocast::set_autocast_enabled(at::kCPU, false);
  at::autocast::clear_cache();
  EXPECT_EQ(h.scalar_type(), at::kBFloat16);
  EXPECT_EQ(logits.scalar_type(), at::kBFloat16);
}

// RMSNorm in fp32 goes through ATen's rms_norm (one fused kernel on a GPU); its value and gradients are the formula's.
// A bf16 input keeps LLM Foundry's formula computed in bf16 (ATen's would compute it in fp32).
TEST(Norms, RmsNormIsTheFormulaInFp32AndLlmFoundrysInBf16) {
  at::manual_seed(3);
  Norm norm(64, NormType::kRMSNorm, 1e-5, false, at::TensorOptions());
  {
    at::NoGradGuard no_grad;
    norm->weight.copy_(at::randn({64}) * 0.5 + 1);
  }
  const at::Tensor x = (at::randn({3, 5, 64}) * 2).requires_grad_(true);
  const at::Tensor grad_out = at::randn({3, 5, 64});
  const at::Tensor y = norm(x);
  const std::vector<at::Tensor> g = torch::autograd::grad({y}, {x, norm->weight}, {grad_out});
  const at::Tensor xd = x.detach().to(at::kDouble).requires_grad_(true);
  const at::Tensor wd = norm->weight.detach().to(at::kDouble).requires_grad_(true);
  const at::Tensor yd = xd * at::rsqrt(xd.pow(2).mean(-1, true) + 1e-5) * wd;
  const std::vector<at::Tensor> gd = torch::autograd::grad({yd}, {xd, wd}, {grad_out.to(at::kDouble)});
  auto rel = [](const at::Tensor& a, const at::Tensor& ref) {
    return (a.to(at::kDouble) - ref).abs().max().item<double>() / ref.abs().max().item<double>();
  };
  EXPECT_EQ(y.scalar_type(), at::kFloat);
  EXPECT_LT(rel(y, yd.detach()), 1e-6);
  EXPECT_LT(rel(g[0], gd[0]), 1e-5);
  EXPECT_LT(rel(g[1], gd[1]), 1e-5);

  at::NoGradGuard no_grad;
  const at::Tensor xb = x.detach().to(at::kBFloat16), wb = norm->weight.detach().to(at::kBFloat16);
  const at::Tensor yb = norm->forward_with(xb, wb, at::Tensor());
  EXPECT_EQ(yb.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(yb, xb * at::rsqrt(xb.pow(2).mean(-1, true) + 1e-5) * wb));
}

TEST(MPT, CausalLmLossIgnoresMaskedLabels) {
  const at::Tensor logits = at::randn({1, 4, 10});
  at::Tensor labels = at::tensor({1, 2, 3, 4}, at::kLong).view({1, 4});
  const at::Tensor expected = at::cross_entropy_loss(logits[0].narrow(0, 0, 3), labels[0].narrow(0, 1, 3));
  EXPECT_TRUE(at::allclose(causal_lm_loss(logits, labels), expected));
  labels[0][2] = -100;
  const at::Tensor kept = at::cross_entropy_loss(logits[0].index({at::tensor({0, 2})}), at::tensor({2, 4}, at::kLong));
  EXPECT_TRUE(at::allclose(causal_lm_loss(logits, labels), kept));
  const at::Tensor kept_sum = at::cross_entropy_loss(logits[0].index({at::tensor({0, 2})}),
                                                     at::tensor({2, 4}, at::kLong), {}, at::Reduction::Sum);
  EXPECT_TRUE(at::allclose(causal_lm_loss(logits, labels, -100, at::Reduction::Sum), kept_sum));
  // Only the scored positions get a gradient: the last one (no next token) and the one before a masked label not.
  const at::Tensor leaf = logits.clone().requires_grad_(true);
  causal_lm_loss(leaf, labels).backward();
  const at::Tensor row_has_grad = leaf.grad()[0].abs().sum(-1).gt(0).to(at::kLong);
  EXPECT_TRUE(at::equal(row_has_grad, at::tensor({1, 0, 1, 0}, at::kLong)));
}

}  // namespace
}  // namespace tessera::models

namespace tessera::models {
namespace {

// The analytic count used by `train --dry-run` must equal the parameters the module really has.
TEST(MPT, DryRunParameterCountEqualsTheModule) {
  std::vector<MPTOptions> variants;
  for (int v = 0; v < 8; ++v) {
    MPTOptions o = small(v % 2 == 0);
    o.init_device = "meta";
    o.no_bias = v & 2;
    o.tie_word_embeddings = !(v & 4);
    if (v == 1) o.norm_type = NormType::kRMSNorm;
    if (v == 3) o.attn.qk_ln = true, o.ffn.type = FfnType::kGLU;
    if (v == 5) o.attn.attn_type = "grouped_query_attention", o.attn.kv_n_heads = 2, o.attn.qk_gn = true;
    if (v == 6) o.attention_bias = true, o.expansion_ratio = 2.5;
    if (v == 7)
      o.attn.attn_type = "multiquery_attention", o.attn.kv_n_heads = 1, o.norm_type = NormType::kLowPrecisionRMSNorm;
    variants.push_back(o);
  }
  for (size_t i = 0; i < variants.size(); ++i) {
    MPTForCausalLM m(variants[i]);
    int64_t n = 0;
    for (const auto& p : m->parameters()) n += p.numel();
    EXPECT_EQ(n, mpt_param_count(variants[i])) << "variant " << i;
  }
}

}  // namespace
}  // namespace tessera::models
