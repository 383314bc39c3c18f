// The OPT family (Meta's OPT 125M ... 66B) as LibTorch modules with Hugging Face's module names, so named_parameters()
// gives the keys of OPTForCausalLM folders: model.decoder.embed_tokens.weight (vocab x word_embed_proj_dim),
// model.decoder.embed_positions.weight (max_position_embeddings + 2 rows: positions are offset by 2),
// model.decoder.layers.{i}.self_attn.{q,k,v,out}_proj.*, ....self_attn_layer_norm.*, ....fc1.*, ....fc2.*,
// ....final_layer_norm.*, model.decoder.final_layer_norm.* (pre-LN models), model.decoder.project_in/project_out.weight
// (when word_embed_proj_dim differs from hidden_size), lm_head.weight (untied only). The function is transformers'
// OPTForCausalLM (4.57): learned positions counted over the real tokens, pre-LN or post-LN blocks
// (do_layer_norm_before), ReLU MLP, biases on or off. `model.name: opt`. Not thread-safe.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>

#include "tessera/models/blocks/hf_decoder.h"
#include "tessera/models/blocks/layers.h"
#include "tessera/models/blocks/self_attention.h"
#include "tessera/models/family_keys.h"

namespace tessera::models {

// HF's OPTConfig keys and defaults (those of OPT-125M); members under transformers' canonical names.
struct OPTOptions {
  int64_t vocab_size = 50272;
  int64_t hidden_size = 768;
  int64_t num_hidden_layers = 12;
  int64_t intermediate_size = 3072;  // config key ffn_dim
  int64_t max_position_embeddings = 2048;
  bool do_layer_norm_before = true;
  bool remove_final_layer_norm = false;  // config key _remove_final_layer_norm
  int64_t word_embed_proj_dim = 0;       // resolved: hidden_size when not given
  double dropout = 0.1;
  double attention_dropout = 0.0;
  int64_t num_attention_heads = 12;
  std::string activation_function = "relu";
  double initializer_range = 0.02;  // config key init_std
  bool enable_bias = true;
  bool tie_word_embeddings = true;
  std::optional<int64_t> bos_token_id = 2, eos_token_id = 2, pad_token_id = 1;
  std::string init_device = "cpu";  // cpu | cuda | meta

  bool projects() const { return word_embed_proj_dim != hidden_size; }
  bool final_norm() const { return do_layer_norm_before && !remove_final_layer_norm; }
};

// OPTConfig's keys: the recipe reader, the config.json reader and writer; what Tessera's OPT does not compute
// (layerdrop, LayerNorms without affine parameters) is refused by key.
const FamilyKeys<OPTOptions>& opt_keys();

class OPTDecoderLayerImpl : public torch::nn::Module {
 public:
  OPTDecoderLayerImpl(const OPTOptions& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  SelfAttention self_attn{nullptr};
  Norm self_attn_layer_norm{nullptr};
  Linear fc1{nullptr}, fc2{nullptr};
  Norm final_layer_norm{nullptr};

 private:
  OPTOptions o_;
};
TORCH_MODULE(OPTDecoderLayer);

// Units: 0 = the root (embeddings, projections, final norm and head), 1..num_hidden_layers = the decoder layers.
// Initialised as transformers' OPTPreTrainedModel (std init_std, the padding row of embed_tokens zeroed). The
// tensor-parallel plan: heads, fc1's units and the vocabulary split.
class OPTForCausalLMImpl : public HfDecoderLM<OPTForCausalLMImpl, OPTOptions, OPTDecoderLayerImpl> {
 public:
  explicit OPTForCausalLMImpl(const OPTOptions& o);

  Linear project_in{nullptr}, project_out{nullptr};  // model.decoder.project_*, when word_embed_proj_dim differs

 protected:
  // Tokens (projected in) plus learned positions, offset by 2 as transformers' (which counts each row's real tokens).
  at::Tensor embed(const at::Tensor& ids, const DecoderCall& call) override;
  at::Tensor head(const at::Tensor& h) override;  // the final norm, projected out, the head
  void plan_layer(TensorParallelPlan& plan, const std::string& p, int64_t i) const override;
  std::string describe_more() const override;
};
TORCH_MODULE(OPTForCausalLM);

}  // namespace tessera::models
