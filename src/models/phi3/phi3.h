// The Phi-3 family (Microsoft's Phi-3 mini/small-shaped dense models, Phi-3.5 mini, Phi-4 mini) as LibTorch modules
// with Hugging Face's module names, so named_parameters() gives the keys of Phi3ForCausalLM folders:
// model.embed_tokens.weight, model.layers.{i}.self_attn.{qkv_proj,o_proj}.weight (q, k and v fused, in that order),
// ....mlp.{gate_up_proj,down_proj}.weight (gate and up fused, in that order), ....{input,post_attention}_layernorm
// .weight, model.norm.weight, lm_head.weight (untied only). The function is transformers' Phi3ForCausalLM (4.57):
// Llama-style RMSNorm blocks, grouped-query attention, rotary on the first partial_rotary_factor of each head,
// `longrope` (`su`) scaling (short factors up to original_max_position_embeddings, long ones beyond, cos/sin scaled by
// the attention factor), an optional sliding window, residual dropout. Phi3ForCausalLM implements the model protocol
// (causal_lm.h); `model.name: phi3`. Not thread-safe.
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

// HF's Phi3Config keys and defaults (those of Phi-3 mini).
struct Phi3Options {
  int64_t vocab_size = 32064;
  int64_t hidden_size = 3072;
  int64_t intermediate_size = 8192;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 0;  // resolved: num_attention_heads when not given
  double resid_pdrop = 0.0;
  double embd_pdrop = 0.0;  // read and kept for config.json; transformers 4.57's Phi-3 applies no embedding dropout
  double attention_dropout = 0.0;
  std::string hidden_act = "silu";
  int64_t max_position_embeddings = 4096;
  int64_t original_max_position_embeddings = 4096;
  double initializer_range = 0.02;
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  double rope_theta = 10000.0;
  double partial_rotary_factor = 1.0;
  // rope_scaling {type: longrope (or su), short_factor, long_factor}: empty factors = no scaling.
  std::vector<double> short_factor, long_factor;
  std::optional<int64_t> sliding_window;
  std::optional<int64_t> bos_token_id = 1, eos_token_id = 32000, pad_token_id = 32000;
  std::string init_device = "cpu";  // cpu | cuda | meta

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  int64_t rotary_ndims() const { return static_cast<int64_t>(static_cast<double>(head_dim()) * partial_rotary_factor); }
  bool longrope() const { return !short_factor.empty(); }
  // transformers' longrope attention factor: sqrt(1 + ln(s) / ln(original)), s = max / original positions (1 when
  // s <= 1 or without longrope).
  double rope_attention_factor() const;
};

// Phi3Config's keys: the recipe reader, the config.json reader and writer.
const FamilyKeys<Phi3Options>& phi3_keys();

class Phi3AttentionImpl : public torch::nn::Module {
 public:
  Phi3AttentionImpl(const Phi3Options& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  Linear o_proj{nullptr}, qkv_proj{nullptr};

 private:
  Phi3Options o_;
};
TORCH_MODULE(Phi3Attention);

class Phi3DecoderLayerImpl : public torch::nn::Module {
 public:
  Phi3DecoderLayerImpl(const Phi3Options& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  Phi3Attention self_attn{nullptr};
  GatedMLP mlp{nullptr};  // fused gate_up_proj
  Norm input_layernorm{nullptr}, post_attention_layernorm{nullptr};

 private:
  double resid_pdrop_;
};
TORCH_MODULE(Phi3DecoderLayer);

// Units: 0 = the root (embedding, final norm and head), 1..num_hidden_layers = the decoder layers. The tensor-parallel
// plan: heads (of the fused qkv_proj), the MLP's hidden units (of the fused gate_up_proj) and the vocabulary split.
class Phi3ForCausalLMImpl : public HfDecoderLM<Phi3ForCausalLMImpl, Phi3Options, Phi3DecoderLayerImpl> {
 public:
  explicit Phi3ForCausalLMImpl(const Phi3Options& o);
  // longrope: keys cached with the short factors are stale once a row passes original_max_position_embeddings
  // (transformers' Phi3ForCausalLM.prepare_inputs_for_generation recomputes the cache there).
  bool kv_cache_stale(int64_t past, int64_t total) const override {
    return o_.longrope() && total >= o_.original_max_position_embeddings + 1 &&
           past <= o_.original_max_position_embeddings;
  }

 protected:
  // Causal (or sliding-window) masks; rotary tables with longrope's short or long factors.
  AttentionInputs attention_inputs(const DecoderCall& call) override;
  void plan_layer(TensorParallelPlan& plan, const std::string& p, int64_t i) const override;
  std::string describe_more() const override;

 private:
  at::Tensor inv_freq_long_;  // longrope's long factors (inv_freq_: the short ones)
};
TORCH_MODULE(Phi3ForCausalLM);

}  // namespace tessera::models
