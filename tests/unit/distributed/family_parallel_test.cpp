// Tensor, sequence and context parallelism reach every dense family from outside its code (models/parallel_plan.h,
// distributed/parallel_styles.h): on 4 Gloo ranks, TP 2 x FSDP 2 and CP 2 x FSDP 2 train 8 fp32 steps with the
// losses and final weights of one process, for each family whose tests do not already pin it (MPT's and Llama's are in
// mesh_training_test.cpp); so do EP 2 x FSDP 2 for the MoE families whose experts are modules of their own (Mixtral,
// Qwen2-MoE; MPT's dMoE is in dist_training_test.cpp). Ranks are the `train` tool, spawned through dist::launch
// (dist_training_fixture.h).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <ATen/ATen.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "dist_training_fixture.h"
#include "tessera/checkpoint/safetensors.h"

namespace tessera::testing::family_parallel {
namespace {

using namespace tessera::testing::dist_training;

// Each family's tiny configuration: 4 heads (2 per rank under TP 2), the features that meet a split or a shard.
// Without attention biases where a family has the option: a key bias's gradient is exactly zero (softmax ignores a
// constant added to every key's score), so it is rounding noise that Adam amplifies to full-size steps, and no two
// summation orders agree on it (as for TinyMpt's no_bias).
struct TinyNeoX {  // head-major fused q/k/v, partial rotary, parallel residual, untied head
  static constexpr const char* kDir = "family_parallel_neox";
  static constexpr const char* kModel =
      "{name: gpt_neox, hidden_size: 32, num_attention_heads: 4, num_hidden_layers: 2, intermediate_size: 64,\n"
      "        vocab_size: 64, max_position_embeddings: 32, rotary_pct: 0.5, use_parallel_residual: true,\n"
      "        tie_word_embeddings: false, attention_bias: false}";
};
struct TinyOpt {  // learned positions, tied head, biases on every projection
  static constexpr const char* kDir = "family_parallel_opt";
  static constexpr const char* kModel =
      "{name: opt, hidden_size: 32, num_attention_heads: 4, num_hidden_layers: 2, ffn_dim: 64, vocab_size: 64,\n"
      "        max_position_embeddings: 32, word_embed_proj_dim: 32, dropout: 0.0, pad_token_id: null}";
};
struct TinyNeo {  // global and local (windowed) layers, learned positions, tied head
  static constexpr const char* kDir = "family_parallel_neo";
  static constexpr const char* kModel =
      "{name: gpt_neo, hidden_size: 32, num_heads: 4, num_layers: 2, attention_types: [[[global, local], 1]],\n"
      "        window_size: 8, intermediate_size: 64, vocab_size: 64, max_position_embeddings: 32}";
};
struct TinyGemma3 {  // q/k norms over each head, sliding and full layers, offset RMSNorms, tied head
  static constexpr const char* kDir = "family_parallel_gemma3";
  static constexpr const char* kModel =
      "{name: gemma3_text, hidden_size: 32, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 8,\n"
      "        query_pre_attn_scalar: 8, num_hidden_layers: 2, sliding_window_pattern: 2, sliding_window: 8,\n"
      "        intermediate_size: 64, vocab_size: 64, max_position_embeddings: 32, pad_token_id: null}";
};
struct TinyPhi3 {  // fused qkv_proj in three blocks (grouped K/V), fused gate_up_proj, untied head
  static constexpr const char* kDir = "family_parallel_phi3";
  static constexpr const char* kModel =
      "{name: phi3, hidden_size: 32, num_attention_heads: 4, num_key_value_heads: 2, num_hidden_layers: 2,\n"
      "        intermediate_size: 64, vocab_size: 64, max_position_embeddings: 32, tie_word_embeddings: false,\n"
      "        pad_token_id: null}";
};
struct TinyOlmo2 {  // norms after attention and MLP, q/k norms over the whole projection (split with its features)
  static constexpr const char* kDir = "family_parallel_olmo2";
  static constexpr const char* kModel =
      "{name: olmo2, hidden_size: 32, num_attention_heads: 4, num_key_value_heads: 2, num_hidden_layers: 2,\n"
      "        intermediate_size: 64, vocab_size: 64, max_position_embeddings: 32, pad_token_id: null,\n"
      "        eos_token_id: null}";
};
struct TinyGranite {  // embedding, attention, residual and logits multipliers; grouped K/V; tied head
  static constexpr const char* kDir = "family_parallel_granite";
  static constexpr const char* kModel =
      "{name: granite, hidden_size: 32, num_attention_heads: 4, num_key_value_heads: 2, num_hidden_layers: 2,\n"
      "        intermediate_size: 64, vocab_size: 64, max_position_embeddings: 32, tie_word_embeddings: true,\n"
      "        embedding_multiplier: 3.0, attention_multiplier: 0.2, residual_multiplier: 0.5, logits_scaling: 4.0}";
};
struct TinyStarcoder2 {  // LayerNorms and projections with biases, a GELU MLP, a sliding window, tied head
  static constexpr const char* kDir = "family_parallel_starcoder2";
  static constexpr const char* kModel =
      "{name: starcoder2, hidden_size: 32, num_attention_heads: 4, num_key_value_heads: 2, num_hidden_layers: 2,\n"
      "        intermediate_size: 64, vocab_size: 64, max_position_embeddings: 32, sliding_window: 8}";
};
struct TinyNemotron {  // LayerNorm1P, rotary on half of each head, explicit head_dim, squared-ReLU MLP, untied head
  static constexpr const char* kDir = "family_parallel_nemotron";
  static constexpr const char* kModel =
      "{name: nemotron, hidden_size: 32, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 12,\n"
      "        num_hidden_layers: 2, intermediate_size: 64, vocab_size: 64, max_position_embeddings: 32}";
};
struct TinySmolLM3 {  // layers without rotary (NoPE), windowed NoPE layers, tied head
  static constexpr const char* kDir = "family_parallel_smollm3";
  static constexpr const char* kModel =
      "{name: smollm3, hidden_size: 32, num_attention_heads: 4, num_key_value_heads: 2, num_hidden_layers: 2,\n"
      "        no_rope_layer_interval: 2, use_sliding_window: true, sliding_window: 8, intermediate_size: 64,\n"
      "        vocab_size: 64, max_position_embeddings: 32, pad_token_id: null}";
};
struct TinyGPTBigCode {  // head-major fused c_attn (multi-head: multi-query's one key/value head does not split)
  static constexpr const char* kDir = "family_parallel_gpt_bigcode";
  static constexpr const char* kModel =
      "{name: gpt_bigcode, n_embd: 32, n_head: 4, n_layer: 2, n_inner: 64, multi_query: false, vocab_size: 64,\n"
      "        n_positions: 32, attn_pdrop: 0.0, embd_pdrop: 0.0, resid_pdrop: 0.0}";
};
struct TinyGlm4 {  // four norms a layer, interleaved partial rotary, q/k/v biases, fused gate_up_proj in two blocks
  static constexpr const char* kDir = "family_parallel_glm4";
  static constexpr const char* kModel =
      "{name: glm4, hidden_size: 32, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 8,\n"
      "        num_hidden_layers: 2, intermediate_size: 64, vocab_size: 64, max_position_embeddings: 32,\n"
      "        attention_bias: false, pad_token_id: null, eos_token_id: null}";
};

// Transformers' sparse MoE blocks, each expert a module of its own (experts.{e}.…): 4 experts, top 2.
struct TinyMixtral {
  static constexpr const char* kDir = "family_parallel_mixtral";
  static constexpr const char* kModel =
      "{name: llama, model_type: mixtral, hidden_size: 32, num_attention_heads: 4, num_key_value_heads: 2,\n"
      "        num_hidden_layers: 2, intermediate_size: 48, num_local_experts: 4, num_experts_per_tok: 2,\n"
      "        vocab_size: 64, max_position_embeddings: 32}";
};
struct TinyQwen2Moe {  // a shared expert beside the routed ones, q/k/v biases, top-k probabilities not normalised
  static constexpr const char* kDir = "family_parallel_qwen2_moe";
  static constexpr const char* kModel =
      "{name: llama, model_type: qwen2_moe, hidden_size: 32, num_attention_heads: 4, num_key_value_heads: 2,\n"
      "        num_hidden_layers: 2, intermediate_size: 48, num_experts: 4, num_experts_per_tok: 2,\n"
      "        moe_intermediate_size: 24, shared_expert_intermediate_size: 32, vocab_size: 64,\n"
      "        max_position_embeddings: 32}";
};
struct TinyDeepseekV3 {  // latent attention, sigmoid routing within expert groups, a shared expert, YaRN
  static constexpr const char* kDir = "family_parallel_deepseek_v3";
  static constexpr const char* kModel =
      "{name: deepseek_v3, hidden_size: 32, num_attention_heads: 4, num_key_value_heads: 4, num_hidden_layers: 2,\n"
      "        first_k_dense_replace: 0, intermediate_size: 48, moe_intermediate_size: 16, n_routed_experts: 4,\n"
      "        n_group: 2, topk_group: 1, num_experts_per_tok: 2, kv_lora_rank: 8, q_lora_rank: 12,\n"
      "        qk_rope_head_dim: 4, qk_nope_head_dim: 8, v_head_dim: 8, vocab_size: 64, max_position_embeddings: 32,\n"
      "        rope_scaling: {type: yarn, factor: 2.0, original_max_position_embeddings: 16}}";
};
struct TinyGptOss {  // attention sinks, sliding and full layers, stacked experts with biases and clamped SwiGLU, YaRN
  static constexpr const char* kDir = "family_parallel_gpt_oss";
  static constexpr const char* kModel =
      "{name: gpt_oss, hidden_size: 32, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 8,\n"
      "        num_hidden_layers: 2, intermediate_size: 16, num_local_experts: 4, num_experts_per_tok: 2,\n"
      "        sliding_window: 5, vocab_size: 64, max_position_embeddings: 32,\n"
      "        rope_scaling: {rope_type: yarn, factor: 2.0, original_max_position_embeddings: 16, truncate: false}}";
};

constexpr int kSteps = 8;
// SGD with momentum rather than the fixture's AdamW: Adam's steps do not change when a gradient is scaled, so a
// parameter whose gradient a layout failed to sum over the tensor-parallel group (a norm on sequence shards, a norm
// over this rank's heads) would still train alike; SGD's steps scale with it.
const char* const kSgd = "'optimizer={name: decoupled_sgdw, lr: 0.05, momentum: 0.9}'";

struct TinyQwen35Moe {  // Qwen3.5-MoE: a Gated DeltaNet layer and a gated full-attention layer, experts and a gated
                        // shared expert in both
  static constexpr const char* kDir = "family_parallel_qwen3_5_moe";
  static constexpr const char* kModel =
      "{name: qwen3_5, model_type: qwen3_5_moe_text, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4,\n"
      "        num_key_value_heads: 2, head_dim: 8, linear_num_key_heads: 2, linear_num_value_heads: 4,\n"
      "        linear_key_head_dim: 8, linear_value_head_dim: 8, layer_types: [linear_attention, full_attention],\n"
      "        num_experts: 4, num_experts_per_tok: 2, moe_intermediate_size: 16, shared_expert_intermediate_size: "
      "24,\n"
      "        vocab_size: 64, max_position_embeddings: 32}";
};

template <class Model>
class FamilyParallel : public DistTrainingOf<Model> {
 protected:
  using Base = DistTrainingOf<Model>;

  // Run `name` for kSteps batches on `nproc` ranks: its losses, and its final weights (hf_checkpointer's).
  static TrainRun steps(const std::string& name, int nproc, std::vector<std::string> o) {
    o.push_back(fmt::format("max_duration={}ba", kSteps));
    o.push_back(kSgd);
    TrainRun r = Base::run(name, nproc, o);
    const fs::path w = Base::root_ / "runs" / name / "huggingface" / fmt::format("ba{}", kSteps) / "model.safetensors";
    EXPECT_TRUE(fs::exists(w)) << w;
    if (fs::exists(w)) {
      checkpoint::SafetensorsFile file(w.string());
      for (const auto& n : file.names()) r.weights[n] = file.load(n);
    }
    return r;
  }

  static const TrainRun& one() {
    static const TrainRun r = steps("single", 1, {});
    return r;
  }

  static void expect_matches(const TrainRun& mesh, const std::string& what) {
    const TrainRun& single = one();
    ASSERT_EQ(single.losses.size(), static_cast<size_t>(kSteps)) << what;
    ASSERT_EQ(mesh.losses.size(), single.losses.size()) << what;
    for (size_t i = 0; i < single.losses.size(); ++i) {
      EXPECT_NEAR(mesh.losses[i], single.losses[i], 1e-5 * std::abs(single.losses[i])) << what << " step " << i;
    }
    ASSERT_FALSE(single.weights.empty()) << what;
    ASSERT_EQ(mesh.weights.size(), single.weights.size()) << what;
    for (const auto& [name, w] : single.weights) {
      const at::Tensor& v = mesh.weights.at(name);
      EXPECT_TRUE(at::allclose(v, w, 1e-4, 1e-5))
          << what << " " << name << ": max diff " << (v - w).abs().max().template item<double>();
    }
  }
};

using Families = ::testing::Types<TinyNeoX, TinyOpt, TinyNeo, TinyGemma3, TinyPhi3, TinyFalcon, TinyOlmo2, TinyGranite,
                                  TinyStarcoder2, TinyNemotron, TinySmolLM3, TinyGPTBigCode, TinyGlm4>;
TYPED_TEST_SUITE(FamilyParallel, Families);

TYPED_TEST(FamilyParallel, TensorAndContextParallelTimesFullShardMatchOneProcess) {
  if (is_worker()) GTEST_SKIP();
  // TP 2 x FSDP 2: the family's plan splits its heads, MLP and vocabulary; its layers' norms run on sequence shards.
  const TrainRun tp = this->steps("tp2_fs2", 4, {"'parallelism={tensor_parallel_degree: 2}'"});
  this->expect_matches(tp, "TP 2 x FSDP 2");
  const std::string tp_log = read_dist_log(this->root_ / "tp2_fs2.log");
  EXPECT_NE(tp_log.find("tensor parallelism over groups of 2 ranks"), std::string::npos) << tp_log;
  EXPECT_NE(tp_log.find("sequence parallelism on"), std::string::npos) << tp_log;
  // CP 2 x FSDP 2: each rank runs half the positions, the keys and values gathered in every layer.
  this->expect_matches(this->steps("cp2_fs2", 4, {"'parallelism={context_parallel_degree: 2}'"}), "CP 2 x FSDP 2");
  const std::string cp_log = read_dist_log(this->root_ / "cp2_fs2.log");
  EXPECT_NE(cp_log.find("context parallelism over groups of 2 ranks"), std::string::npos) << cp_log;
}

template <class Model>
class FamilyExpertParallel : public FamilyParallel<Model> {};
using MoeFamilies = ::testing::Types<TinyMixtral, TinyQwen2Moe, TinyDeepseekV3, TinyGptOss, TinyQwen35Moe>;
TYPED_TEST_SUITE(FamilyExpertParallel, MoeFamilies);

TYPED_TEST(FamilyExpertParallel, ExpertParallelTimesFullShardMatchesOneProcess) {
  if (is_worker()) GTEST_SKIP();
  // EP 2 x FSDP 2: each rank keeps 2 of each layer's 4 experts whole, sends every token row to the rank of its expert
  // and back; the final weights (every expert, gathered from the rank that holds it) are one process's.
  this->expect_matches(this->steps("ep2_fs2", 4, {"'parallelism={expert_parallel_degree: 2}'"}), "EP 2 x FSDP 2");
  const std::string log = read_dist_log(this->root_ / "ep2_fs2.log");
  EXPECT_NE(log.find("expert parallelism over groups of 2 ranks (2 MoE layers, 2 experts each per rank)"),
            std::string::npos)
      << log;
  // Its sharded checkpoint (each expert stored by the ranks that hold it) resumes under FSDP 4 with the uninterrupted
  // run's next loss.
  const fs::path ckpt = this->root_ / "ckpt";
  fs::remove_all(ckpt);
  this->run("ep2_save", 4,
            {"'parallelism={expert_parallel_degree: 2}'", "max_duration=4ba", "scheduler.t_max=8ba",
             "save_interval=4ba", "save_folder=" + (ckpt / "ep2").string(), kSgd});
  const TrainRun resumed =
      this->run("fs4_resumed", 4,
                {"max_duration=5ba", "scheduler.t_max=8ba", "load_path=" + (ckpt / "ep2" / "ep0-ba4").string(), kSgd});
  ASSERT_EQ(resumed.losses.size(), 1u) << "resumed at batch 4, so one step";
  const double want = this->one().losses.at(4);
  EXPECT_NEAR(resumed.losses[0], want, 1e-5 * std::abs(want));
}

using DeepseekV3Parallel = FamilyParallel<TinyDeepseekV3>;

TEST_F(DeepseekV3Parallel, ContextParallelTimesFullShardMatchesOneProcessAndTensorParallelIsRefusedByName) {
  if (is_worker()) GTEST_SKIP();
  // Latent attention on half the positions per rank (the keys and values gathered per layer), the routers' choices
  // per token as in one process.
  expect_matches(steps("cp2_fs2", 4, {"'parallelism={context_parallel_degree: 2}'"}), "CP 2 x FSDP 2");
  const std::string cp_log = read_dist_log(root_ / "cp2_fs2.log");
  EXPECT_NE(cp_log.find("context parallelism over groups of 2 ranks"), std::string::npos) << cp_log;
  const fs::path log = root_ / "tp2_plan.log";
  const std::string cmd = fmt::format(
      "{} --recipe {} --dry-run --world-size 4 'parallelism={{tensor_parallel_degree: "
      "2}}' > {} 2>&1",
      ::tessera::testing::train_bin(), (root_ / "tiny.yaml").string(), log.string());
  EXPECT_NE(std::system(cmd.c_str()), 0);
  const std::string out = read_dist_log(log);
  EXPECT_NE(out.find("tensor_parallel_degree 2: DeepSeek-V3's latent attention projections"), std::string::npos) << out;
}

using GptOssParallel = FamilyParallel<TinyGptOss>;

TEST_F(GptOssParallel, ContextParallelTimesFullShardMatchesOneProcess) {
  if (is_worker()) GTEST_SKIP();
  // Sinks and sliding windows over the gathered keys, on half the positions per rank.
  expect_matches(steps("cp2_fs2", 4, {"'parallelism={context_parallel_degree: 2}'"}), "CP 2 x FSDP 2");
  const std::string cp_log = read_dist_log(root_ / "cp2_fs2.log");
  EXPECT_NE(cp_log.find("context parallelism over groups of 2 ranks"), std::string::npos) << cp_log;
}

using Phi3Parallel = FamilyParallel<TinyPhi3>;

TEST_F(Phi3Parallel, ATensorParallelCheckpointResumesUnderFullShardWithTheUninterruptedLoss) {
  if (is_worker()) GTEST_SKIP();
  // A family whose tensor parallelism comes from its plan alone: TP 2 x FSDP 2 saves at 4 of the 8 steps (the
  // schedule pinned to 8), FSDP 4 resumes from it, and its next loss is the uninterrupted one process's.
  const fs::path ckpt = root_ / "ckpt";
  fs::remove_all(ckpt);
  run("tp2_save", 4,
      {"'parallelism={tensor_parallel_degree: 2}'", "max_duration=4ba", "scheduler.t_max=8ba", "save_interval=4ba",
       "save_folder=" + (ckpt / "tp2").string(), kSgd});
  ASSERT_TRUE(fs::exists(ckpt / "tp2" / "ep0-ba4" / "metadata.json"));
  const TrainRun resumed =
      run("fs4_resumed", 4,
          {"max_duration=5ba", "scheduler.t_max=8ba", "load_path=" + (ckpt / "tp2" / "ep0-ba4").string(), kSgd});
  ASSERT_EQ(resumed.losses.size(), 1u) << "resumed at batch 4, so one step";
  const double want = one().losses.at(4);
  EXPECT_NEAR(resumed.losses[0], want, 1e-5 * std::abs(want));
}

}  // namespace
}  // namespace tessera::testing::family_parallel
