// The Qwen3.5 family's text model (Qwen's Qwen3.5 dense checkpoints, transformers 5's Qwen3_5ForCausalLM, model_type
// qwen3_5_text) as LibTorch modules with transformers' module names, so named_parameters() gives the keys of its
// folders: model.embed_tokens.weight, model.layers.{i}.linear_attn.{in_proj_qkv,in_proj_z,in_proj_b,in_proj_a,
// out_proj}.weight, ....linear_attn.{conv1d.weight,dt_bias,A_log,norm.weight} (Gated DeltaNet layers),
// ....self_attn.{q,k,v,o}_proj.weight, ....self_attn.{q,k}_norm.weight (gated full-attention layers),
// ....mlp.{gate,up,down}_proj.weight, ....{input,post_attention}_layernorm.weight, model.norm.weight, lm_head.weight
// (untied only). The function is transformers 5.25's Qwen3_5ForCausalLM: a hybrid stack, per layer_types, of
// - Gated DeltaNet linear attention: q, k, v through a causal depthwise convolution (with the activation), q and k
//   L2-normalised, the gated delta rule's recurrence (decay exp(g), g = -exp(A_log) softplus(a + dt_bias), write
//   strength sigmoid(b)) computed by chunks of 64 as transformers' torch path computes it, its output through a
//   gated RMSNorm (norm(o) silu(z)); padding positions zeroed before it;
// - full attention whose q_proj also gives a per-head output gate (sigmoid), q/k norms per head, rotary embeddings on
//   the first partial_rotary_factor of each head (text positions: transformers' multimodal rotary sections then all
//   read the same position, so mrope_section changes nothing);
// with zero-centred RMSNorms (x (1 + w)) and a SwiGLU MLP. The KV cache also holds each linear layer's convolution
// window and recurrent state. `model.name: qwen3_5`.
//
// Qwen3.5-MoE (transformers 5's Qwen3_5MoeForCausalLM, model_type qwen3_5_moe_text, `model.name: qwen3_5_moe`) is the
// same stack with a mixture of experts as every layer's MLP (Qwen3_5MoeSparseMoeBlock): a softmax router
// (mlp.gate.weight) choosing num_experts_per_tok of num_experts experts (mlp.experts.{e}.{gate,up,down}_proj.weight),
// their weights renormalised, plus a shared expert (mlp.shared_expert.*) gated by sigmoid(mlp.shared_expert_gate(x)),
// with transformers' load-balancing loss under output_router_logits. The published folders of both
// (Qwen3_5ForConditionalGeneration / Qwen3_5MoeForConditionalGeneration, model_type qwen3_5 / qwen3_5_moe) hold the
// text model under model.language_model and its config in text_config; their vision tower (model.visual.*) and
// multi-token-prediction heads (mtp.*) are left aside on load, as transformers' AutoModelForCausalLM does
// (family.cpp). Not thread-safe.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tessera/models/blocks/hf_decoder.h"
#include "tessera/models/blocks/layers.h"
#include "tessera/models/blocks/moe.h"
#include "tessera/models/blocks/self_attention.h"
#include "tessera/models/capabilities.h"
#include "tessera/models/family_keys.h"

namespace tessera::models {

// transformers' Qwen3_5TextConfig keys and defaults (its docstring's Qwen3.5-9B style configuration), and
// Qwen3_5MoeTextConfig's (its own defaults where they differ: qwen3_5_keys()).
struct Qwen35Options {
  std::string model_type = "qwen3_5_text";  // or qwen3_5_moe_text
  int64_t vocab_size = 248320;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 12288;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 16;
  int64_t num_key_value_heads = 4;
  std::string hidden_act = "silu";
  int64_t max_position_embeddings = 32768;
  double initializer_range = 0.02;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  double rope_theta = 10000.0;
  double partial_rotary_factor = 0.25;
  bool attention_bias = false;
  double attention_dropout = 0.0;
  int64_t head_dim = 256;
  int64_t linear_conv_kernel_dim = 4;
  int64_t linear_key_head_dim = 128;
  int64_t linear_value_head_dim = 128;
  int64_t linear_num_key_heads = 16;
  int64_t linear_num_value_heads = 32;
  // linear_attention or full_attention per layer; resolved: full_attention every full_attention_interval-th layer.
  std::vector<std::string> layer_types;
  int64_t full_attention_interval = 4;
  std::optional<int64_t> bos_token_id, eos_token_id, pad_token_id;
  // qwen3_5_moe_text: every layer's experts (num_experts > 0), each moe_intermediate_size wide, and the shared expert.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0;
  bool output_router_logits = false;
  double router_aux_loss_coef = 0.001;
  std::string init_device = "cpu";  // cpu | cuda | meta

  bool moe() const { return num_experts > 0; }
  SparseMoeOptions sparse_moe() const;
  int64_t rotary_dims() const { return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor); }
  bool linear(int64_t layer) const { return layer_types[static_cast<size_t>(layer)] == "linear_attention"; }
};

// Qwen3_5TextConfig's keys: the recipe reader, the config.json reader (transformers 5's rope_parameters through its
// config form) and writer.
const FamilyKeys<Qwen35Options>& qwen3_5_keys();

// A forward's inputs: the full-attention layers' causal masks and rotary tables, and for the linear layers the
// padding mask of the new positions ((B, s), 1 real, 0 padding), undefined when nothing is padded.
struct Qwen35Inputs {
  AttentionInputs attention{};
  at::Tensor padding{};
};
// Linear attention carries a state along the sequence, which a context shard would cut: never called (the model
// says it cannot run context-parallel).
Qwen35Inputs context_parallel_inputs(const Qwen35Inputs& in, std::shared_ptr<const ContextShard> shard,
                                     at::ScalarType dtype);
inline at::Tensor context_positions_of(const Qwen35Inputs& in, const at::Tensor& x) {
  return context_positions_of(in.attention, x);
}

// The causal depthwise convolution's weights (channels, 1, kernel), as transformers' nn.Conv1d(groups=channels).
class DepthwiseConv1dImpl : public torch::nn::Module {
 public:
  DepthwiseConv1dImpl(int64_t channels, int64_t kernel, const at::TensorOptions& t);
  at::Tensor weight;
};
TORCH_MODULE(DepthwiseConv1d);

// transformers' Qwen3_5GatedDeltaNet.
class Qwen35GatedDeltaNetImpl : public torch::nn::Module {
 public:
  Qwen35GatedDeltaNetImpl(const Qwen35Options& o, const at::TensorOptions& t);
  // x (B, s, hidden) -> (B, s, hidden); `padding` as Qwen35Inputs'. With `cache`, continues from and updates its
  // convolution window and recurrent state.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& padding, LayerCache* cache = nullptr);

  DepthwiseConv1d conv1d{nullptr};
  at::Tensor dt_bias, A_log;
  Norm norm{nullptr};  // the gated RMSNorm's weight (head_v_dim)
  Linear out_proj{nullptr}, in_proj_qkv{nullptr}, in_proj_z{nullptr}, in_proj_b{nullptr}, in_proj_a{nullptr};

 private:
  Qwen35Options o_;
};
TORCH_MODULE(Qwen35GatedDeltaNet);

class Qwen35DecoderLayerImpl : public torch::nn::Module {
 public:
  // `router_loss` and `aux_scale`: the model's, for a mixture of experts.
  Qwen35DecoderLayerImpl(const Qwen35Options& o, int64_t layer, const at::TensorOptions& t,
                         std::shared_ptr<HfRouterLoss> router_loss = nullptr,
                         std::shared_ptr<AuxLossScale> aux_scale = nullptr);
  at::Tensor forward(const at::Tensor& x, const Qwen35Inputs& in, LayerCache* cache = nullptr);

  Qwen35GatedDeltaNet linear_attn{nullptr};  // linear_attention layers
  SelfAttention self_attn{nullptr};          // full_attention layers
  GatedMLP mlp{nullptr};                     // qwen3_5_text
  SparseMoeBlock moe{nullptr};               // qwen3_5_moe_text (registered as "mlp")
  Norm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(Qwen35DecoderLayer);

// The gated delta rule over a sequence, as transformers' torch_chunk_gated_delta_rule (chunks of `chunk`, the
// within-chunk system solved by a unit lower-triangular solve) with use_qk_l2norm_in_kernel: q, k (B, s, Hk, dk),
// v (B, s, Hv, dv), g and beta (B, s, Hv); `state` (B, Hv, dk, dv) or undefined for zeros. Returns the output
// (B, s, Hv, dv) in v's dtype and sets `state` to the final state (float32).
at::Tensor chunk_gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                                  const at::Tensor& beta, at::Tensor& state, int64_t chunk = 64);
// One token at a time, as transformers' torch_recurrent_gated_delta_rule (its decode step).
at::Tensor recurrent_gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& g, const at::Tensor& beta, at::Tensor& state);

// Units: 0 = the root (embedding, final norm and head), 1..num_hidden_layers = the layers. Initialised as transformers'
// Qwen3_5PreTrainedModel (the zero-centred norms at 0, dt_bias 1, A_log log U(0.01, 16)). Tensor parallelism is
// refused (the linear layers' projections are gathered whole in transformers' own plan) and so is context parallelism
// (the recurrence runs along the whole sequence); packed documents are refused (the state would cross documents).
class Qwen35ForCausalLMImpl
    : public HfDecoderLM<Qwen35ForCausalLMImpl, Qwen35Options, Qwen35DecoderLayerImpl, Qwen35Inputs>,
      public MixtureOfExpertsModel {
 public:
  explicit Qwen35ForCausalLMImpl(const Qwen35Options& o);
  void init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select = nullptr) override;
  bool supports_context_parallel() const override { return false; }
  // Qwen3.5-MoE: transformers' load-balancing loss as "aux_loss" (with output_router_logits), each layer's tokens per
  // expert; the dense model routes nothing.
  std::map<std::string, at::Tensor> auxiliary_losses() const override { return routing_.auxiliary_losses(); }
  void set_auxiliary_loss_scale(double scale) override { routing_.scale->set(scale); }
  std::vector<std::pair<std::string, at::Tensor>> expert_token_counts() const override;
  int64_t num_active_params() const override;

 protected:
  Qwen35Inputs attention_inputs(const DecoderCall& call) override;
  // FLOPs: the linear layers count their projections (in 6 N), not an attention over the sequence (their
  // recurrence's few FLOPs per token are left out).
  bool windowed(int64_t i) const override { return o_.linear(i); }
  void begin_forward(const DecoderCall& call) override;
  void end_forward() override;
  void check_tensor_parallel(int64_t degree) const override;
  std::string describe_more() const override;

 private:
  HfMoeRouting routing_;
};
TORCH_MODULE(Qwen35ForCausalLM);

}  // namespace tessera::models
