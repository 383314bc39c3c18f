// The OLMo 2 family (AI2's OLMo-2 1B ... 32B, and OLMo 3 as `model_type: olmo3`) as LibTorch modules with Hugging
// Face's module names, so named_parameters() gives the keys of Olmo2ForCausalLM folders: model.embed_tokens.weight,
// model.layers.{i}.self_attn.{q,k,v,o}_proj.*, ....self_attn.{q,k}_norm.weight, ....post_attention_layernorm.weight,
// ....mlp.{gate,up,down}_proj.weight, ....post_feedforward_layernorm.weight, model.norm.weight, lm_head.weight (untied
// only). The function is transformers' Olmo2ForCausalLM (4.57): RMSNorms after the attention and after the MLP,
// inside the residual (x + norm(attn(x)), h + norm(mlp(h))), q/k RMSNorms over the whole projection before the heads
// are split, rotary embeddings, grouped-query attention, a gated MLP. OLMo 3 (transformers' Olmo3ForCausalLM) is the
// same model with sliding-window layers (layer_types; by default three of every four) whose rotary embeddings ignore
// rope_scaling. Olmo2ForCausalLM implements the model protocol (causal_lm.h); `model.name: olmo2` (with
// `model_type: olmo3` for OLMo 3). Not thread-safe.
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

// transformers' Olmo2Config keys and defaults (Olmo3Config adds sliding_window and layer_types).
struct Olmo2Options {
  std::string model_type = "olmo2";  // olmo2 | olmo3: the config.json written back
  int64_t vocab_size = 50304;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 0;  // resolved: num_attention_heads when not given
  std::string hidden_act = "silu";
  int64_t max_position_embeddings = 2048;
  double initializer_range = 0.02;
  std::optional<int64_t> bos_token_id, eos_token_id = 50279, pad_token_id = 1;
  bool tie_word_embeddings = false;
  double rope_theta = 10000.0;
  double rope_factor = 1.0;  // rope_scaling of the linear kind; 1: none
  bool attention_bias = false;
  double attention_dropout = 0.0;
  double rms_norm_eps = 1e-5;
  int64_t sliding_window = 4096;         // OLMo 3's sliding_attention layers
  std::vector<std::string> layer_types;  // OLMo 3; resolved: sliding_attention except every fourth layer
  std::string init_device = "cpu";       // cpu | cuda | meta

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  bool sliding(int64_t layer) const {
    return model_type == "olmo3" && layer_types[static_cast<size_t>(layer)] == "sliding_attention";
  }
};

// Olmo2Config's (and Olmo3Config's) keys: the recipe reader, the config.json reader and writer.
const FamilyKeys<Olmo2Options>& olmo2_keys();

// Reads the call's full-attention inputs (`global`) or, in an OLMo 3 sliding layer, the windowed ones (`local`).
class Olmo2DecoderLayerImpl : public torch::nn::Module {
 public:
  Olmo2DecoderLayerImpl(const Olmo2Options& o, int64_t layer, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const GlobalLocalInputs& in, LayerCache* cache = nullptr);

  SelfAttention self_attn{nullptr};
  GatedMLP mlp{nullptr};
  Norm post_attention_layernorm{nullptr}, post_feedforward_layernorm{nullptr};

 private:
  bool sliding_;
};
TORCH_MODULE(Olmo2DecoderLayer);

// Units: 0 = the root (embedding, final norm and head), 1..num_hidden_layers = the decoder layers. Causal masks with
// the rotary tables (rope_scaling applied), and for OLMo 3's sliding layers windowed masks with unscaled tables. The
// tensor-parallel plan: heads (the q/k norms split with their projections' features), the MLP's hidden units and the
// vocabulary split; the post-norms on sequence shards.
class Olmo2ForCausalLMImpl
    : public HfDecoderLM<Olmo2ForCausalLMImpl, Olmo2Options, Olmo2DecoderLayerImpl, GlobalLocalInputs> {
 public:
  explicit Olmo2ForCausalLMImpl(const Olmo2Options& o);

 protected:
  bool windowed(int64_t i) const override { return o_.sliding(i); }
  void plan_layer(TensorParallelPlan& plan, const std::string& p, int64_t i) const override;
  std::string describe_more() const override;
};
TORCH_MODULE(Olmo2ForCausalLM);

}  // namespace tessera::models
