// The DeepSeek-V3 family (DeepSeek-V3, V3.1 and R1, and Moonshot's Kimi K2, all `model_type: deepseek_v3`) as LibTorch
// modules with transformers' module names, so named_parameters() gives the keys of DeepseekV3ForCausalLM folders:
// model.embed_tokens.weight; model.layers.{i}.self_attn.{q_a_proj,q_b_proj (or q_proj without q_lora_rank),
// kv_a_proj_with_mqa,kv_b_proj,o_proj}.weight, ....self_attn.{q_a_layernorm,kv_a_layernorm}.weight; the first
// first_k_dense_replace layers' ....mlp.{gate,up,down}_proj.weight, the others' ....mlp.gate.weight,
// ....mlp.gate.e_score_correction_bias, ....mlp.experts.{e}.{gate,up,down}_proj.weight and
// ....mlp.shared_experts.{gate,up,down}_proj.weight; ....{input,post_attention}_layernorm.weight; model.norm.weight;
// lm_head.weight (untied only). The function is transformers' DeepseekV3ForCausalLM (4.57): multi-head latent
// attention (queries through a low-rank q_a_proj -> RMSNorm -> q_b_proj, keys and values from one compressed
// kv_lora_rank latent plus a rotary key shared by every head; each head's query and key a qk_nope_head_dim part without
// rotary and a qk_rope_head_dim part with it, in the interleaved layout by default; values of v_head_dim), YaRN rotary
// scaling with its attention-scale correction, and mixture-of-experts layers routed by sigmoid scores within the best
// expert groups (SparseMoeOptions::deepseek_router) beside always-on shared experts. DeepseekV3ForCausalLM implements
// the model protocol (causal_lm.h); `model.name: deepseek_v3`. Not thread-safe.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/models/blocks/attention.h"
#include "tessera/models/blocks/hf_decoder.h"
#include "tessera/models/blocks/layers.h"
#include "tessera/models/blocks/moe.h"
#include "tessera/models/blocks/self_attention.h"
#include "tessera/models/capabilities.h"
#include "tessera/models/family_keys.h"

namespace tessera::models {

// transformers' DeepseekV3Config keys and defaults (DeepSeek-V3's 671B shape).
struct DeepseekV3Options {
  int64_t vocab_size = 129280;
  int64_t hidden_size = 7168;
  int64_t intermediate_size = 18432;     // the dense layers' MLP
  int64_t moe_intermediate_size = 2048;  // each expert's
  int64_t num_hidden_layers = 61;
  int64_t num_attention_heads = 128;
  int64_t num_key_value_heads = 128;  // must equal num_attention_heads: every head has its own keys
  int64_t n_shared_experts = 1;
  int64_t n_routed_experts = 256;
  double routed_scaling_factor = 2.5;
  int64_t kv_lora_rank = 512;
  std::optional<int64_t> q_lora_rank = 1536;  // null: one q_proj
  int64_t qk_rope_head_dim = 64;
  int64_t v_head_dim = 128;
  int64_t qk_nope_head_dim = 128;
  int64_t n_group = 8;
  int64_t topk_group = 4;
  int64_t num_experts_per_tok = 8;
  int64_t first_k_dense_replace = 3;  // layers before it are dense
  bool norm_topk_prob = true;
  std::string hidden_act = "silu";
  int64_t max_position_embeddings = 4096;
  double initializer_range = 0.02;
  double rms_norm_eps = 1e-6;
  std::optional<int64_t> bos_token_id = 0, eos_token_id = 1, pad_token_id;
  bool tie_word_embeddings = false;
  double rope_theta = 10000.0;
  std::optional<YarnRope> yarn;  // rope_scaling of type yarn; none: default rotary
  bool rope_interleave = true;
  bool attention_bias = false;  // q_a_proj, kv_a_proj_with_mqa and o_proj
  double attention_dropout = 0.0;
  std::string init_device = "cpu";  // cpu | cuda | meta

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int64_t head_dim() const { return qk_head_dim(); }  // each head's query and key width (describe())
  bool sparse(int64_t layer) const { return layer >= first_k_dense_replace; }
  int64_t sparse_layers() const;
  SparseMoeOptions moe() const;
};

// DeepseekV3Config's keys: the recipe reader, the config.json reader and writer.
const FamilyKeys<DeepseekV3Options>& deepseek_v3_keys();

// Multi-head latent attention (DeepseekV3Attention).
class DeepseekV3AttentionImpl : public torch::nn::Module {
 public:
  DeepseekV3AttentionImpl(const DeepseekV3Options& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  Linear q_proj{nullptr}, q_a_proj{nullptr}, q_b_proj{nullptr};  // q_proj without q_lora_rank, else q_a and q_b
  Norm q_a_layernorm{nullptr};
  Linear kv_a_proj_with_mqa{nullptr};
  Norm kv_a_layernorm{nullptr};
  Linear kv_b_proj{nullptr}, o_proj{nullptr};

 private:
  int64_t nope_, rope_, v_, rank_;
  double scale_, dropout_;
  bool interleave_;
};
TORCH_MODULE(DeepseekV3Attention);

// Dense (GatedMLP) before first_k_dense_replace, a mixture of experts (SparseMoeBlock, registered as "mlp") after.
class DeepseekV3DecoderLayerImpl : public torch::nn::Module {
 public:
  DeepseekV3DecoderLayerImpl(const DeepseekV3Options& o, const at::TensorOptions& t, int64_t index);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  Norm input_layernorm{nullptr};
  DeepseekV3Attention self_attn{nullptr};
  Norm post_attention_layernorm{nullptr};
  GatedMLP mlp{nullptr};
  SparseMoeBlock moe{nullptr};
};
TORCH_MODULE(DeepseekV3DecoderLayer);

// Units: 0 = the root (embedding, final norm and head), 1..num_hidden_layers = the decoder layers. Tensor parallelism
// is refused (the latent projections would need a replicated style; the experts do not split); context and expert
// parallelism apply.
class DeepseekV3ForCausalLMImpl
    : public HfDecoderLM<DeepseekV3ForCausalLMImpl, DeepseekV3Options, DeepseekV3DecoderLayerImpl>,
      public MixtureOfExpertsModel {
 public:
  explicit DeepseekV3ForCausalLMImpl(const DeepseekV3Options& o);

  // transformers' scheme, and the routers' correction biases 0 (a buffer transformers keeps as it was built).
  void init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select = nullptr) override;
  // 6 N_active (less an untied input embedding) + 6 (heads x (qk_head_dim + v_head_dim)) x S per layer.
  double flops_per_token(int64_t seq_len) const override;
  // No auxiliary loss: DeepSeek-V3 balances its experts through the correction biases.
  std::map<std::string, at::Tensor> auxiliary_losses() const override { return {}; }
  void set_auxiliary_loss_scale(double) override {}
  std::vector<std::pair<std::string, at::Tensor>> expert_token_counts() const override;
  int64_t num_active_params() const override;

 protected:
  void begin_forward(const DecoderCall& call) override;
  void check_tensor_parallel(int64_t degree) const override;
  std::string describe_more() const override;
};
TORCH_MODULE(DeepseekV3ForCausalLM);

}  // namespace tessera::models
