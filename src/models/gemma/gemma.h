// The Gemma 2 and Gemma 3 (text) families as LibTorch modules with Hugging Face's module names, so named_parameters()
// gives the keys of Gemma2ForCausalLM / Gemma3ForCausalLM folders: model.embed_tokens.weight,
// model.layers.{i}.self_attn.{q,k,v,o}_proj.weight (+ q_norm / k_norm in Gemma 3),
// ....mlp.{gate,up,down}_proj.weight, ....{input,post_attention,pre_feedforward,post_feedforward}_layernorm.weight,
// model.norm.weight, lm_head.weight (untied only). The function is transformers' (4.57): RMSNorm scaling by
// (1 + weight) in float32, embeddings scaled by sqrt(hidden_size), GeGLU MLP, queries scaled by
// query_pre_attn_scalar^-1/2, sliding-window and full layers (layer_types), attention and final logit soft-capping,
// norms before and after attention and MLP; Gemma 3 adds q/k norms and a separate rope base for its sliding layers.
// GemmaForCausalLM implements the model protocol (causal_lm.h); `model.name: gemma2` or `gemma3_text`.
// Not thread-safe.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/modules/container/modulelist.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/config/reader.h"
#include "tessera/models/blocks/attention.h"
#include "tessera/models/blocks/hf_decoder.h"
#include "tessera/models/blocks/layers.h"
#include "tessera/models/blocks/self_attention.h"
#include "tessera/models/family_keys.h"

namespace tessera::models {

// HF's Gemma2Config / Gemma3TextConfig keys; defaults are those of the model_type's config class (Gemma 2 2B's,
// Gemma 3 4B's text model).
struct GemmaOptions {
  std::string model_type = "gemma2";  // gemma2 | gemma3_text
  int64_t vocab_size = 256000;
  int64_t hidden_size = 2304;
  int64_t intermediate_size = 9216;
  int64_t num_hidden_layers = 26;
  int64_t num_attention_heads = 8;
  int64_t num_key_value_heads = 4;
  int64_t head_dim = 256;
  std::string hidden_activation = "gelu_pytorch_tanh";
  int64_t max_position_embeddings = 8192;
  double initializer_range = 0.02;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = true;
  double rope_theta = 10000.0;
  double rope_local_base_freq = 10000.0;  // Gemma 3: the sliding layers' rope base (Gemma 2: rope_theta)
  double rope_linear_factor = 1.0;        // rope_scaling {rope_type: linear, factor} of the full layers; 1 = none
  bool attention_bias = false;
  double attention_dropout = 0.0;
  double query_pre_attn_scalar = 256;
  int64_t sliding_window = 4096;
  std::vector<std::string> layer_types;  // per layer: "sliding_attention" | "full_attention"
  std::optional<double> final_logit_softcapping = 30.0;
  std::optional<double> attn_logit_softcapping = 50.0;
  std::optional<int64_t> bos_token_id = 2, eos_token_id = 1, pad_token_id = 0;
  std::string init_device = "cpu";  // cpu | cuda | meta

  bool gemma3() const { return model_type == "gemma3_text"; }
  bool sliding(int64_t layer) const { return layer_types[static_cast<size_t>(layer)] == "sliding_attention"; }
};

// Gemma2Config's and Gemma3TextConfig's keys: the recipe reader, the config.json reader and writer.
const FamilyKeys<GemmaOptions>& gemma_keys();

class GemmaDecoderLayerImpl : public torch::nn::Module {
 public:
  GemmaDecoderLayerImpl(const GemmaOptions& o, int64_t layer, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const GlobalLocalInputs& in, LayerCache* cache = nullptr);

  SelfAttention self_attn{nullptr};
  GatedMLP mlp{nullptr};
  Norm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  Norm pre_feedforward_layernorm{nullptr}, post_feedforward_layernorm{nullptr};

 private:
  bool sliding_;
};
TORCH_MODULE(GemmaDecoderLayer);

// Units: 0 = the root (embedding, final norm and head), 1..num_hidden_layers = the decoder layers. Initialised as
// transformers' Gemma2PreTrainedModel / Gemma3PreTrainedModel do (RMSNorm weights 0: the norm scales by 1 + weight).
// The tensor-parallel plan: heads (Gemma 3's q/k norms over this rank's heads), the MLP's hidden units and the
// vocabulary split.
class GemmaForCausalLMImpl
    : public HfDecoderLM<GemmaForCausalLMImpl, GemmaOptions, GemmaDecoderLayerImpl, GlobalLocalInputs> {
 public:
  explicit GemmaForCausalLMImpl(const GemmaOptions& o);

 protected:
  at::Tensor embed(const at::Tensor& ids, const DecoderCall& call) override;  // scaled by sqrt(hidden_size)
  // Full and sliding layers' inputs, each with its rotary base; the attention logits' soft-cap.
  GlobalLocalInputs attention_inputs(const DecoderCall& call) override;
  at::Tensor head(const at::Tensor& h) override;  // the final logits' soft-cap
  bool windowed(int64_t i) const override { return o_.sliding(i); }
  void plan_layer(TensorParallelPlan& plan, const std::string& p, int64_t i) const override;
  std::string describe_more() const override;
};
TORCH_MODULE(GemmaForCausalLM);

}  // namespace tessera::models
