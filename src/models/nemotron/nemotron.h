// The Nemotron family (NVIDIA's Nemotron-3 / Nemotron-4 / Minitron) as LibTorch modules with Hugging Face's module
// names, so named_parameters() gives the keys of NemotronForCausalLM folders: model.embed_tokens.weight,
// model.layers.{i}.input_layernorm.*, ....self_attn.{q,k,v,o}_proj.*, ....post_attention_layernorm.*,
// ....mlp.{up,down}_proj.*, model.norm.*, lm_head.weight (untied only). The function is transformers'
// NemotronForCausalLM (4.57): LayerNorm1P (a LayerNorm scaled by 1 + weight) before the attention and the MLP,
// grouped-query attention with an explicit head_dim and rotary embeddings on the first partial_rotary_factor of each
// head, an ungated MLP with squared ReLU (relu2). NemotronForCausalLM implements the model protocol (causal_lm.h);
// `model.name: nemotron`. Not thread-safe.
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

// transformers' NemotronConfig keys and defaults.
struct NemotronOptions {
  int64_t vocab_size = 256000;
  int64_t hidden_size = 6144;
  int64_t intermediate_size = 24576;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 48;
  int64_t head_dim = 0;             // resolved: hidden_size / num_attention_heads when not given
  int64_t num_key_value_heads = 0;  // resolved: num_attention_heads when not given
  std::string hidden_act = "relu2";
  int64_t max_position_embeddings = 4096;
  double initializer_range = 0.0134;
  double norm_eps = 1e-5;
  std::optional<int64_t> bos_token_id = 2, eos_token_id = 3, pad_token_id;
  bool tie_word_embeddings = false;
  double rope_theta = 10000.0;
  double partial_rotary_factor = 0.5;
  bool attention_bias = false;
  double attention_dropout = 0.0;
  bool mlp_bias = false;
  std::string init_device = "cpu";  // cpu | cuda | meta

  // int(head_dim * partial_rotary_factor): the features of each head that rotate.
  int64_t rotary_dims() const;
};

// NemotronConfig's keys: the recipe reader, the config.json reader and writer.
const FamilyKeys<NemotronOptions>& nemotron_keys();

// down_proj(act(up_proj(x))), no gate.
class NemotronMLPImpl : public torch::nn::Module {
 public:
  NemotronMLPImpl(const NemotronOptions& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x);

  Linear up_proj{nullptr}, down_proj{nullptr};

 private:
  std::string act_;
};
TORCH_MODULE(NemotronMLP);

class NemotronDecoderLayerImpl : public torch::nn::Module {
 public:
  NemotronDecoderLayerImpl(const NemotronOptions& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  SelfAttention self_attn{nullptr};
  NemotronMLP mlp{nullptr};
  Norm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(NemotronDecoderLayer);

// Units: 0 = the root (embedding, final norm and head), 1..num_hidden_layers = the decoder layers. Initialised as
// transformers' NemotronPreTrainedModel does (LayerNorm1P weight 1 and bias 0). The tensor-parallel plan: heads, the
// MLP's hidden units and the vocabulary (where it divides); the layers' norms on sequence shards.
class NemotronForCausalLMImpl : public HfDecoderLM<NemotronForCausalLMImpl, NemotronOptions, NemotronDecoderLayerImpl> {
 public:
  explicit NemotronForCausalLMImpl(const NemotronOptions& o);

 protected:
  void plan_layer(TensorParallelPlan& plan, const std::string& p, int64_t i) const override;  // up_proj, no gate
  std::string describe_more() const override;
};
TORCH_MODULE(NemotronForCausalLM);

}  // namespace tessera::models
