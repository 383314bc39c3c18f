// The Llama family (Llama 2/3/3.1/3.2, and Mistral's sliding window, Qwen2's q/k/v biases and Qwen3's per-head q/k
// norms from the same code) as
// LibTorch modules with Hugging Face's module names, so named_parameters() gives the keys of HF folders:
// model.embed_tokens.weight, model.layers.{i}.input_layernorm.weight, ....self_attn.{q,k,v,o}_proj.weight,
// ....post_attention_layernorm.weight, ....mlp.{gate,up,down}_proj.weight, model.norm.weight, lm_head.weight (untied
// only). RMSNorm, rotary embeddings in HF's rotate-half layout (HF weights load without permutation), SwiGLU,
// grouped-query attention. LlamaForCausalLM implements the model protocol (causal_lm.h); `model.name: llama`.
// Modules are not thread-safe.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/modules/container/modulelist.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/config/reader.h"
#include "tessera/models/blocks/attention.h"
#include "tessera/models/blocks/hf_decoder.h"
#include "tessera/models/blocks/layers.h"
#include "tessera/models/blocks/moe.h"
#include "tessera/models/blocks/self_attention.h"
#include "tessera/models/capabilities.h"
#include "tessera/models/causal_lm.h"
#include "tessera/models/family_keys.h"
#include "tessera/models/parallel_plan.h"

namespace tessera::models {

// HF's rope_scaling: none ("default"), "linear" (positions divided by factor) or Llama 3.1's "llama3" (low
// frequencies divided by factor, a smooth ramp between low_freq_factor and high_freq_factor).
struct RopeScaling {
  std::string type = "default";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// HF's LlamaConfig keys and defaults (MistralConfig and Qwen2Config add sliding windows and q/k/v biases, Qwen3Config
// per-head q/k norms; MixtralConfig, Qwen2MoeConfig and Qwen3MoeConfig a sparse mixture of experts in place of the
// MLP).
struct LlamaOptions {
  // llama | mistral | qwen2 | qwen3 | mixtral | qwen2_moe | qwen3_moe: the config.json written back
  std::string model_type = "llama";
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 0;  // resolved: num_attention_heads when not given
  int64_t head_dim = 0;             // resolved: hidden_size / num_attention_heads when not given
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q, k, v and o projections (Qwen2: q, k, v only, see qkv_bias)
  bool qkv_bias = false;        // Qwen2's biases on q, k, v and none on o
  bool mlp_bias = false;
  int64_t sliding_window = 0;  // Mistral / Qwen2: each query sees at most this many keys; 0 = unlimited
  // Qwen2 / Qwen3: the layers the window applies to (sliding_attention or full_attention each); empty: every layer.
  std::vector<std::string> layer_types;
  double attention_dropout = 0.0;
  double initializer_range = 0.02;
  std::optional<int64_t> bos_token_id, eos_token_id, pad_token_id;
  std::string init_device = "cpu";  // cpu | cuda | meta
  bool qk_norm = false;  // Qwen3, Qwen3-MoE: RMSNorms q_norm / k_norm over each head's queries and keys, before rotary
  // Mixtral (num_local_experts), Qwen2-MoE and Qwen3-MoE (num_experts): 0 = a dense model.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 2;
  int64_t moe_intermediate_size = 0;            // Qwen2-MoE's experts (Mixtral's use intermediate_size)
  int64_t shared_expert_intermediate_size = 0;  // Qwen2-MoE
  bool norm_topk_prob = true;                   // Mixtral always; Qwen2-MoE's key (default false)
  double router_jitter_noise = 0;               // Mixtral
  double router_aux_loss_coef = 0.001;          // transformers' load-balancing loss, with output_router_logits
  bool output_router_logits = false;
  int64_t decoder_sparse_step = 1;       // Qwen2-MoE: layers i with (i + 1) % step == 0 are sparse
  std::vector<int64_t> mlp_only_layers;  // Qwen2-MoE: dense layers

  bool q_bias() const { return attention_bias || qkv_bias; }
  bool is_sparse_layer(int64_t i) const;
  int64_t sparse_layers() const;
  SparseMoeOptions sparse_moe() const;
  bool o_bias() const { return attention_bias; }
  bool windowed_layer(int64_t i) const {
    return sliding_window > 0 && (layer_types.empty() || layer_types[static_cast<size_t>(i)] == "sliding_attention");
  }
};

// Reads a `model:` section with name llama (HF's LlamaConfig keys; `sliding_window`, `qkv_bias` for the Mistral and
// Qwen2 variants); errors name the key path and line.
LlamaOptions parse_llama_options(config::Section& s);
// config.json (one of llama_model_types()) -> options; throws Error("hf") naming `where` for what the family
// does not compute (another hidden_act, rope_scaling types other than linear and llama3, ...).
LlamaOptions llama_options_from_hf_config(const nlohmann::json& config, const std::string& where);
nlohmann::ordered_json llama_hf_config(const LlamaOptions& o, at::ScalarType dtype);
// The key table the three above are derived from.
const FamilyKeys<LlamaOptions>& llama_keys();
// The config.json model_types the family registers (family.cpp), reads and writes (its key table's), llama first.
const std::vector<std::string>& llama_model_types();

// Exact parameter count (the embedding once when tied), and training FLOPs per token: 6 N (less an untied input
// embedding, a lookup) + 12 L (heads x head_dim) S, N counting each sparse layer's router, top-k experts and shared
// expert only (the active parameters).
int64_t llama_param_count(const LlamaOptions& o);
int64_t llama_active_param_count(const LlamaOptions& o);
double llama_flops_per_token(const LlamaOptions& o, int64_t seq_len);
// Parameters of the largest sharding unit: the root (embedding, final norm, untied head) or one decoder layer.
int64_t llama_largest_unit_params(const LlamaOptions& o);
// Activation bytes kept for the backward of one forward on batch x seq_len tokens: per layer the input, both norm
// outputs, q/k/v, the attention output, the residual sum and the four MLP intermediates (gate, up, silu(gate) and the
// product); with activation checkpointing each layer's input only, plus one layer's worth recomputed; and the logits
// (stored in `bytes_per_value`, and their fp32 loss copy).
double llama_activation_bytes(const LlamaOptions& o, int64_t batch, int64_t seq_len, int bytes_per_value,
                              bool activation_checkpointing);

// The inverse frequencies of the rotary embedding (head_dim / 2,), float32, with `rope_scaling` applied as HF does.
at::Tensor llama_inv_freq(const LlamaOptions& o);

// The MLP is dense, or in sparse layers a SparseMoeBlock registered as "block_sparse_moe" (Mixtral) or "mlp"
// (Qwen2-MoE). The layer reads the call's windowed inputs (`local`) when the sliding window applies to it, else the
// full ones (`global`).
class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  LlamaDecoderLayerImpl(const LlamaOptions& o, const at::TensorOptions& t, int64_t index = 0,
                        std::shared_ptr<HfRouterLoss> router_loss = nullptr,
                        std::shared_ptr<AuxLossScale> aux_scale = nullptr);
  at::Tensor forward(const at::Tensor& x, const GlobalLocalInputs& in, LayerCache* cache = nullptr);

  Norm input_layernorm{nullptr};
  SelfAttention self_attn{nullptr};
  Norm post_attention_layernorm{nullptr};
  GatedMLP mlp{nullptr};
  SparseMoeBlock moe{nullptr};

 private:
  bool windowed_ = false;
};
TORCH_MODULE(LlamaDecoderLayer);

// Units: 0 = the root (embedding, final norm and head), 1..num_hidden_layers = the decoder layers. The tensor-parallel
// plan: Llama's layer (refused for MoE layers), Qwen3's q/k norms over this rank's heads.
class LlamaForCausalLMImpl
    : public HfDecoderLM<LlamaForCausalLMImpl, LlamaOptions, LlamaDecoderLayerImpl, GlobalLocalInputs>,
      public MixtureOfExpertsModel {
 public:
  explicit LlamaForCausalLMImpl(const LlamaOptions& o);

  double flops_per_token(int64_t seq_len) const override { return llama_flops_per_token(o_, seq_len); }
  std::optional<double> activation_bytes(int64_t batch, int64_t seq_len, int bytes_per_value,
                                         bool activation_checkpointing) const override {
    return llama_activation_bytes(o_, batch, seq_len, bytes_per_value, activation_checkpointing);
  }
  int64_t largest_unit_params() const override { return llama_largest_unit_params(o_); }
  // Mixtral / Qwen2-MoE: transformers' load-balancing loss as "aux_loss" (with output_router_logits; weighted by
  // router_aux_loss_coef), and each sparse layer's tokens per expert.
  std::map<std::string, at::Tensor> auxiliary_losses() const override { return routing_.auxiliary_losses(); }
  void set_auxiliary_loss_scale(double scale) override { routing_.scale->set(scale); }
  std::vector<std::pair<std::string, at::Tensor>> expert_token_counts() const override;
  int64_t num_active_params() const override { return llama_active_param_count(o_); }
  // The router's losses count each rank's tokens as the batch.
  bool supports_context_parallel() const override { return o_.num_experts == 0; }

 protected:
  bool windowed(int64_t i) const override { return o_.windowed_layer(i); }
  // The mixture of experts' records and transformers' load-balancing loss over the whole forward.
  void begin_forward(const DecoderCall& call) override;
  void end_forward() override;
  void check_tensor_parallel(int64_t degree) const override;  // refused for MoE layers
  void plan_layer(TensorParallelPlan& plan, const std::string& p, int64_t i) const override;
  std::string describe_more() const override;

 private:
  HfMoeRouting routing_;
};
TORCH_MODULE(LlamaForCausalLM);

// Builds the model on options.init_device; on a real device initialised as HF's LlamaPreTrainedModel does (normal
// with std initializer_range for Linear and Embedding weights, zero biases, norms 1), each module from its own
// generator seeded from `seed` and the module's name.
LlamaForCausalLM build_llama(const LlamaOptions& options, uint64_t seed = 17);

}  // namespace tessera::models
