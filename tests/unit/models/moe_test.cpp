// Mixture-of-experts MPT: ffn_config parsing, parameter counts, the layer against a token-by-token reference (grouped
// and per-expert GEMMs, dropless and capacity routing), its auxiliary losses, and training through `train`.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/mpt/mpt.h"
#include "tessera/config/value.h"
#include "tessera/util/error.h"
#include "test_util.h"
#include "tiny_data.h"

namespace fs = std::filesystem;

namespace tessera::models {
namespace moe_test {  // named: the sanitizer trees' unity batches join this file with mpt_config_test's helpers

MPTOptions parse(const std::string& yaml) {
  config::Origin origin;
  origin.file = "model.yaml";
  config::Value v = config::parse_yaml(yaml, origin);
  config::ParseContext ctx("model.yaml");
  config::Section s(&v, "model", ctx);
  MPTOptions o = parse_mpt_options(s);
  ctx.throw_if_unsupported();
  return o;
}

std::string message(const std::string& yaml) {
  try {
    parse(yaml);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

const std::string kBase = "d_model: 32\nn_heads: 4\nn_layers: 2\nvocab_size: 50\nmax_seq_len: 16\nno_bias: true\n";

TEST(MoEConfig, LlmFoundryAndMegaBlocksKeysWithTheirDefaults) {
  const MPTOptions t =
      parse(kBase +
            "ffn_config: {ffn_type: torch_dmoe, moe_num_experts: 4, moe_top_k: 2, mlp_type: glu, "
            "moe_jitter_eps: null, moe_normalize_expert_weights: 1, uniform_expert_assignment: false}");
  ASSERT_TRUE(t.ffn.moe.has_value());
  EXPECT_EQ(t.ffn.moe->num_experts, 4);
  EXPECT_EQ(t.ffn.moe->top_k, 2);
  EXPECT_TRUE(t.ffn.moe->glu);
  EXPECT_DOUBLE_EQ(t.ffn.moe->normalize_expert_weights.value(), 1.0);
  EXPECT_EQ(t.ffn.moe->loss_weight, 0.0) << "LLM Foundry's torch_dmoe has no load-balancing loss";
  EXPECT_EQ(t.ffn.ffn_act_fn, "gelu") << "torch_dmoe resolves ffn_act_fn as LLM Foundry does: the exact GELU";
  EXPECT_FALSE(t.moe_layer().capacity_factor.has_value()) << "dropless";

  // LLM Foundry's testing-moe.yaml ffn_config, verbatim.
  const MPTOptions mb = parse(kBase +
                              "ffn_config: {ffn_type: mb_dmoe, memory_optimized_mlp: true, moe_lbl_in_fp32: false, "
                              "moe_loss_weight: 0.01, moe_num_experts: 4, moe_top_k: 2, moe_world_size: 1, "
                              "moe_weight_parallelism: false, uniform_expert_assignment: false}");
  EXPECT_DOUBLE_EQ(mb.ffn.moe->loss_weight, 0.01);
  EXPECT_EQ(mb.ffn.ffn_act_fn, "gelu_pytorch_tanh") << "MegaBlocks' default activation";
  EXPECT_DOUBLE_EQ(parse(kBase + "ffn_config: {ffn_type: mb_moe, moe_num_experts: 2}").ffn.moe->loss_weight, 0.1)
      << "MegaBlocks' default moe_loss_weight";
  EXPECT_DOUBLE_EQ(
      parse(kBase + "ffn_config: {ffn_type: mb_moe, moe_num_experts: 2}").moe_layer().capacity_factor.value(), 1.0)
      << "mb_moe routes with MegaBlocks' capacity factor";
  EXPECT_TRUE(parse("d_model: 32\nn_heads: 4\nn_layers: 2\nffn_config: {ffn_type: mb_dmoe, moe_num_experts: 2}")
                  .moe_layer()
                  .output_bias)
      << "MegaBlocks adds an output bias unless no_bias";
}

TEST(MoEConfig, WrongValuesAndMissingFeaturesNameTheirKeys) {
  EXPECT_NE(message(kBase + "ffn_config: {ffn_type: torch_dmoe, moe_num_experts: 4, moe_top_k: 5}")
                .find("model.ffn_config.moe_top_k"),
            std::string::npos);
  EXPECT_NE(message(kBase + "ffn_config: {ffn_type: torch_dmoe, moe_num_experts: 4, mlp_type: swiglu}")
                .find("model.ffn_config.mlp_type"),
            std::string::npos);
  // Each rank of an expert-parallel group holds as many experts (DistTrainingMoe.ExpertParallel* train with it).
  const std::string ep = message(kBase + "ffn_config: {ffn_type: mb_dmoe, moe_num_experts: 4, moe_world_size: 3}");
  EXPECT_NE(ep.find("model.ffn_config.moe_world_size"), std::string::npos) << ep;
  EXPECT_NE(ep.find("must divide moe_num_experts (4)"), std::string::npos) << ep;
  EXPECT_NE(message(kBase + "ffn_config: {ffn_type: mb_dmoe, moe_num_expert: 4}").find("moe_num_expert"),
            std::string::npos)
      << "a misspelt key is an error";
}

TEST(MoEConfig, TotalAndActiveParameterCounts) {
  // d 32, F 64 (expansion 2), E 4, k 2, GLU: per layer router 4*32, experts 4 * 3 * 64 * 32.
  const MPTOptions o = parse(kBase +
                             "expansion_ratio: 2\nffn_config: {ffn_type: torch_dmoe, moe_num_experts: 4, "
                             "moe_top_k: 2, mlp_type: glu}");
  MPTForCausalLM model = build_mpt(o, 1);
  EXPECT_EQ(mpt_param_count(o), model->num_params());
  const int64_t per_expert = 3 * 64 * 32;
  EXPECT_EQ(mpt_active_param_count(o), mpt_param_count(o) - 2 * (4 - 2) * per_expert);
  EXPECT_EQ(model->num_active_params(), mpt_active_param_count(o));
  // FLOPs follow the active parameters (6 N_active + 12 L d S).
  EXPECT_DOUBLE_EQ(mpt_flops_per_token(o, 16), 6.0 * mpt_active_param_count(o) + 12.0 * 2 * 32 * 16);
  // MegaBlocks' layers carry an output bias unless no_bias.
  const MPTOptions biased = parse(
      "d_model: 32\nn_heads: 4\nn_layers: 2\nvocab_size: 50\nmax_seq_len: 16\n"
      "ffn_config: {ffn_type: mb_dmoe, moe_num_experts: 4}");
  EXPECT_EQ(mpt_param_count(biased), build_mpt(biased, 1)->num_params());
}

// The layer computed token by token: each token's top-k experts' MLPs, weighted, in the order LLM Foundry adds them.
at::Tensor reference_moe(MoEImpl& moe, const at::Tensor& x) {
  const MoEOptions& o = moe.options();
  const at::Tensor flat = x.reshape({-1, o.hidden_size});
  const int64_t tokens = flat.size(0);
  const at::Tensor scores = moe.router->layer(flat).softmax(-1);
  auto [weights, chosen] = scores.topk(o.top_k, -1);
  if (o.normalize_expert_weights) {
    weights = weights / at::norm(weights, at::Scalar(*o.normalize_expert_weights), {-1}, true);
  }
  const int64_t f = o.ffn_hidden, d = o.hidden_size;
  const at::Tensor w1 = moe.experts->mlp->w1.view({o.num_experts, f, d});
  const at::Tensor w2 = moe.experts->mlp->w2.view({o.num_experts, f, d});
  at::Tensor out = at::zeros_like(flat);
  std::vector<int64_t> taken(static_cast<size_t>(o.num_experts * o.top_k), 0);
  const int64_t capacity =
      o.capacity_factor ? static_cast<int64_t>(*o.capacity_factor * tokens / static_cast<double>(o.num_experts)) : 0;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < o.top_k; ++j) {
      const int64_t e = chosen[t][j].item<int64_t>();
      if (capacity > 0 && taken[static_cast<size_t>(j * o.num_experts + e)]++ >= capacity) continue;  // dropped
      at::Tensor h = hf_activation(o.activation, at::mv(w1[e], flat[t]));
      if (o.glu) h = h * at::mv(moe.experts->mlp->v1.view({o.num_experts, f, d})[e], flat[t]);
      out[t] += at::mv(w2[e].t(), h) * weights[t][j];
    }
  }
  if (moe.experts->bias.defined()) out = out + moe.experts->bias;
  return out.view(x.sizes());
}

MoEOptions layer_options(int64_t d, int64_t f, int64_t experts, int64_t k) {
  MoEOptions o;
  o.hidden_size = d;
  o.ffn_hidden = f;
  o.num_experts = experts;
  o.top_k = k;
  o.activation = "gelu";
  return o;
}

MoE random_layer(const MoEOptions& o) {
  MoE moe(o, at::TensorOptions().dtype(at::kFloat), std::make_shared<AuxLossScale>());
  at::NoGradGuard no_grad;
  for (auto& p : moe->parameters()) p.normal_(0, 0.3);
  return moe;
}

TEST(MoELayer, EqualsTheTokenByTokenReferenceOnGroupedAndPerExpertGemms) {
  at::manual_seed(3);
  struct Case {
    int64_t d, f, experts, k;
    bool glu;
    std::optional<double> normalize;
    bool bias;
  };
  // d and F multiples of 4 take at::_grouped_mm; 30 / 36 (strides not 16-byte aligned) one GEMM per expert.
  for (const Case& c : {Case{32, 64, 4, 2, false, std::nullopt, false}, Case{32, 48, 8, 1, true, 1.0, true},
                        Case{30, 36, 4, 3, true, 2.0, false}, Case{30, 36, 6, 2, false, std::nullopt, true}}) {
    MoEOptions o = layer_options(c.d, c.f, c.experts, c.k);
    o.glu = c.glu;
    o.normalize_expert_weights = c.normalize;
    o.output_bias = c.bias;
    MoE moe = random_layer(o);
    moe->eval();
    const at::Tensor x = at::randn({3, 7, c.d});
    const at::Tensor got = moe(x), want = reference_moe(*moe, x);
    EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-5)) << fmt::format(
        "d {} F {} E {} k {}: max diff {}", c.d, c.f, c.experts, c.k, (got - want).abs().max().item<double>());
  }
}

TEST(MoELayer, CapacityRoutingDropsTheLateTokensOfEachBusyExpertPerSlot) {
  at::manual_seed(4);
  MoEOptions o = layer_options(16, 32, 4, 2);
  o.capacity_factor = 0.5;  // int(0.5 * 21 / 4) = 2 tokens per expert and slot
  MoE moe = random_layer(o);
  moe->eval();
  const at::Tensor x = at::randn({3, 7, 16});
  const at::Tensor got = moe(x), want = reference_moe(*moe, x);
  EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-5)) << (got - want).abs().max().item<double>();
  o.capacity_factor.reset();
  MoE dropless(o, at::TensorOptions().dtype(at::kFloat), std::make_shared<AuxLossScale>());
  {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < moe->parameters().size(); ++i) dropless->parameters()[i].copy_(moe->parameters()[i]);
  }
  dropless->eval();
  EXPECT_FALSE(at::allclose(dropless(x), got, 1e-3, 1e-3)) << "some slots were dropped";
}

TEST(MoELayer, AuxiliaryLossesAreMegaBlocksFormulasAndTheirGradientsFlowThroughTheOutput) {
  at::manual_seed(5);
  MoEOptions o = layer_options(16, 32, 4, 2);
  o.loss_weight = 0.1;
  o.zloss_weight = 0.01;
  o.num_layers = 3;
  auto scale = std::make_shared<AuxLossScale>();
  MoE moe(o, at::TensorOptions().dtype(at::kFloat), scale);
  {
    at::NoGradGuard no_grad;
    for (auto& p : moe->parameters()) p.normal_(0, 0.3);
  }
  moe->train();
  const at::Tensor x = at::randn({2, 5, 16});
  const at::Tensor y = moe(x);
  ASSERT_EQ(moe->records.size(), 1u);
  const MoERecord& r = moe->records[0];
  // By hand from the router's scores and choices.
  const at::Tensor logits = moe->router->layer(x.reshape({-1, 16}));
  const at::Tensor scores = logits.softmax(-1);
  const at::Tensor counts = at::bincount(std::get<1>(scores.topk(2, -1)).reshape({-1}), {}, 4);
  EXPECT_TRUE(at::equal(r.tokens_per_expert, counts));
  const at::Tensor lbl = 0.1 * 4 / (3.0 * 10 * 2) * at::dot(counts.to(at::kFloat), scores.mean(0));
  const at::Tensor zloss = 0.01 * at::logsumexp(logits, {1}).square().mean();
  EXPECT_NEAR(r.lbl.item<double>(), lbl.item<double>(), 1e-7);
  EXPECT_NEAR(r.zloss.item<double>(), zloss.item<double>(), 1e-7);

  // d/d(router) of sum(y * g) + aux * s, with the scale set to s: as autograd computes it on the explicit sum.
  const at::Tensor g = at::randn_like(y);
  for (const double s : {1.0, 0.25}) {
    scale->set(s);
    moe->zero_grad();
    moe->records.clear();
    (moe(x) * g).sum().backward();
    const at::Tensor got = moe->router->layer->weight.grad().clone();
    moe->zero_grad();
    moe->records.clear();
    const at::Tensor y2 = moe(x);
    const at::Tensor l2 = moe->router->layer(x.reshape({-1, 16}));
    const at::Tensor s2 = l2.softmax(-1);
    const at::Tensor explicit_aux = 0.1 * 4 / (3.0 * 10 * 2) * at::dot(counts.to(at::kFloat), s2.mean(0)) +
                                    0.01 * at::logsumexp(l2, {1}).square().mean();
    scale->set(0.0);  // only the explicit copy's gradient counts here
    ((y2 * g).sum() + explicit_aux * s).backward();
    const at::Tensor want = moe->router->layer->weight.grad();
    EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-6))
        << "scale " << s << ": " << (got - want).abs().max().item<double>();
  }
  // Evaluation records nothing and jitter is off: the same output twice.
  moe->eval();
  moe->records.clear();
  EXPECT_TRUE(at::equal(moe(x), moe(x)));
  EXPECT_TRUE(moe->records.empty());
}

TEST(MoELayer, JitterScalesTheRoutersInputOnlyInTraining) {
  at::manual_seed(6);
  MoEOptions o = layer_options(16, 32, 4, 1);
  o.jitter_eps = 0.5;
  MoE moe = random_layer(o);
  const at::Tensor x = at::randn({4, 8, 16});
  moe->eval();
  const at::Tensor a = moe(x);
  EXPECT_TRUE(at::equal(a, moe(x)));
  moe->train();
  EXPECT_FALSE(at::equal(moe(x), moe(x))) << "a new draw of U(1 - eps, 1 + eps) per call";
}

// ---- Training through `train` -----------------------------------------------------------------------------------

TEST(MoETraining, TheRecipeLogsItsAuxiliaryLossesAndExpertLoadsAndWarnsOfStarvedExperts) {
  const fs::path root = fs::temp_directory_path() / "moe_training";
  fs::remove_all(root);
  tessera::testing::write_token_split(root / "data" / "train", 64, 1);
  // A zero router (baseline_ init, std 0) scores every expert alike: every token's top 2 of 4 are the same two
  // experts (ties), and the other two starve at the first batch.
  std::ofstream(root / "moe.yaml") << fmt::format(R"(
max_seq_len: 32
seed: 3
model:
  name: mpt_causal_lm
  d_model: 32
  n_heads: 2
  n_layers: 2
  expansion_ratio: 2
  max_seq_len: 32
  vocab_size: 64
  no_bias: true
  attn_config: {{attn_impl: torch}}
  init_config: {{name: baseline_, init_std: 0.0, emb_init_std: 0.02}}
  ffn_config: {{ffn_type: mb_dmoe, moe_num_experts: 4, moe_top_k: 2, mlp_type: glu, moe_loss_weight: 0.1,
               moe_zloss_weight: 0.001}}
tokenizer: {{name: unused}}
train_loader: {{name: text, dataset: {{local: {0}, split: train, shuffle: true, max_seq_len: 32}}, drop_last: true}}
optimizer: {{name: decoupled_adamw, lr: 0.01}}
scheduler: {{name: constant_with_warmup, t_warmup: 0ba}}
max_duration: 3ba
global_train_batch_size: 8
device_train_microbatch_size: 4
eval_interval: 0
precision: fp32
device: cpu
loggers: {{jsonl: {{filename: "{1}/metrics.jsonl"}}}}
)",
                                                  (root / "data").string(), root.string());
  const std::string cmd = fmt::format("{} --recipe {} > {} 2>&1", ::tessera::testing::train_bin(),
                                      (root / "moe.yaml").string(), (root / "log.txt").string());
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_text(root / "log.txt");
  const std::string log = read_text(root / "log.txt");
  EXPECT_NE(log.find("batch 1: router layer_0 sent no tokens to experts "), std::string::npos) << log;
  EXPECT_EQ(log.find("batch 2: router layer_0 sent no tokens"), std::string::npos) << "warned once per expert";
  std::ifstream f(root / "metrics.jsonl");
  int batches = 0;
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("loss/train/total")) continue;
    ++batches;
    ASSERT_TRUE(j.contains("loss/train/lbl") && j.contains("loss/train/z_loss")) << line;
    // Uniform scores: the load-balancing loss is weight * E / (L T k) * sum over layers of T k / E = weight.
    if (batches == 1) {
      EXPECT_NEAR(j["loss/train/lbl"].get<double>(), 0.1, 1e-6) << line;
    }
    double share = 0;
    for (int e = 0; e < 4; ++e) share += j[fmt::format("moe/layer_1/expert_{}", e)].get<double>();
    EXPECT_NEAR(share, 1.0, 1e-9) << line;
    if (batches == 1) {
      int starved = 0;
      for (int e = 0; e < 4; ++e) starved += j[fmt::format("moe/layer_0/expert_{}", e)].get<double>() == 0.0;
      EXPECT_EQ(starved, 2) << line;
    }
  }
  EXPECT_EQ(batches, 3);
  fs::remove_all(root);
}

}  // namespace moe_test
}  // namespace tessera::models
