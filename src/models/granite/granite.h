// The Granite family (IBM's Granite 3.x dense language models) as LibTorch modules with Hugging Face's module names,
// so named_parameters() gives the keys of GraniteForCausalLM folders: model.embed_tokens.weight,
// model.layers.{i}.input_layernorm.weight, ....self_attn.{q,k,v,o}_proj.*, ....post_attention_layernorm.weight,
// ....mlp.{gate,up,down}_proj.*, model.norm.weight, lm_head.weight (untied only). The function is transformers'
// GraniteForCausalLM (4.57): a Llama-shaped decoder (RMSNorm before attention and MLP, rotary, GQA, gated MLP) with
// four scalars of its config: the embeddings times `embedding_multiplier`, the attention scores scaled by
// `attention_multiplier` (in place of 1 / sqrt(head_dim)), each block's output times `residual_multiplier` before it
// joins the residual, and the logits divided by `logits_scaling`. GraniteForCausalLM implements the model protocol
// (causal_lm.h); `model.name: granite`. Not thread-safe.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/modules/container/modulelist.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "tessera/config/reader.h"
#include "tessera/models/blocks/attention.h"
#include "tessera/models/blocks/hf_decoder.h"
#include "tessera/models/blocks/layers.h"
#include "tessera/models/blocks/self_attention.h"
#include "tessera/models/family_keys.h"

namespace tessera::models {

// transformers' GraniteConfig keys and defaults.
struct GraniteOptions {
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 0;  // resolved: num_attention_heads when not given
  std::string hidden_act = "silu";
  int64_t max_position_embeddings = 2048;
  double initializer_range = 0.02;
  double rms_norm_eps = 1e-6;
  std::optional<int64_t> bos_token_id = 1, eos_token_id = 2, pad_token_id;
  bool tie_word_embeddings = false;
  double rope_theta = 10000.0;
  double rope_factor = 1.0;  // rope_scaling of the linear kind; 1: none
  bool attention_bias = false;
  double attention_dropout = 0.0;
  bool mlp_bias = false;
  double embedding_multiplier = 1.0;
  double logits_scaling = 1.0;
  double residual_multiplier = 1.0;
  double attention_multiplier = 1.0;
  std::string init_device = "cpu";  // cpu | cuda | meta

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
};

// GraniteConfig's keys: the recipe reader, the config.json reader and writer.
const FamilyKeys<GraniteOptions>& granite_keys();

class GraniteDecoderLayerImpl : public torch::nn::Module {
 public:
  GraniteDecoderLayerImpl(const GraniteOptions& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  SelfAttention self_attn{nullptr};
  GatedMLP mlp{nullptr};
  Norm input_layernorm{nullptr}, post_attention_layernorm{nullptr};

 private:
  double residual_multiplier_;
};
TORCH_MODULE(GraniteDecoderLayer);

// Units: 0 = the root (embedding, final norm and head), 1..num_hidden_layers = the decoder layers. Llama's
// tensor-parallel plan.
class GraniteForCausalLMImpl : public HfDecoderLM<GraniteForCausalLMImpl, GraniteOptions, GraniteDecoderLayerImpl> {
 public:
  explicit GraniteForCausalLMImpl(const GraniteOptions& o);

 protected:
  at::Tensor embed(const at::Tensor& ids, const DecoderCall& call) override;  // times embedding_multiplier
  at::Tensor head(const at::Tensor& h) override;                              // divided by logits_scaling
  std::string describe_more() const override;
};
TORCH_MODULE(GraniteForCausalLM);

}  // namespace tessera::models
