// The GLM-4 family (Zhipu's GLM-4-0414: `model_type: glm4`) as LibTorch modules with Hugging Face's module names, so
// named_parameters() gives the keys of Glm4ForCausalLM folders: model.embed_tokens.weight,
// model.layers.{i}.self_attn.{q,k,v}_proj.{weight,bias}, ....self_attn.o_proj.weight, ....mlp.gate_up_proj.weight,
// ....mlp.down_proj.weight, ....{input,post_self_attn,post_attention,post_mlp}_layernorm.weight, model.norm.weight,
// lm_head.weight (untied only). The function is transformers' Glm4ForCausalLM (4.57): RMSNorms before and after both
// the attention and the MLP (x + post_self_attn_norm(attn(input_norm(x))), h +
// post_mlp_norm(mlp(post_attention_norm(h)))), grouped-query attention with biases on q/k/v, rotary on the first
// partial_rotary_factor of each head in the interleaved layout (pairs 2i, 2i + 1), a SwiGLU MLP with one fused
// gate_up_proj. Glm4ForCausalLM implements the model protocol (causal_lm.h); `model.name: glm4`. Not thread-safe.
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

// transformers' Glm4Config keys and defaults (GLM-4-9B-0414's shape).
struct Glm4Options {
  int64_t vocab_size = 151552;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 13696;
  int64_t num_hidden_layers = 40;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 2;
  double partial_rotary_factor = 0.5;
  int64_t head_dim = 128;
  std::string hidden_act = "silu";
  double attention_dropout = 0.0;
  int64_t max_position_embeddings = 131072;
  double initializer_range = 0.02;
  double rms_norm_eps = 0.00000015625;
  bool tie_word_embeddings = false;
  double rope_theta = 10000.0;
  std::optional<int64_t> bos_token_id, eos_token_id = 151329, pad_token_id = 151329;
  bool attention_bias = true;       // q, k and v; o_proj has none
  std::string init_device = "cpu";  // cpu | cuda | meta

  // int(head_dim * partial_rotary_factor): the features of each head that rotate.
  int64_t rotary_dims() const;
};

// Glm4Config's keys: the recipe reader, the config.json reader and writer.
const FamilyKeys<Glm4Options>& glm4_keys();

class Glm4DecoderLayerImpl : public torch::nn::Module {
 public:
  Glm4DecoderLayerImpl(const Glm4Options& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  SelfAttention self_attn{nullptr};
  GatedMLP mlp{nullptr};  // fused gate_up_proj
  Norm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  Norm post_self_attn_layernorm{nullptr}, post_mlp_layernorm{nullptr};
};
TORCH_MODULE(Glm4DecoderLayer);

// Units: 0 = the root (embedding, final norm and head), 1..num_hidden_layers = the decoder layers. The tensor-parallel
// plan: heads, the fused gate_up_proj in its two blocks, the vocabulary (where it divides); the four norms on sequence
// shards.
class Glm4ForCausalLMImpl : public HfDecoderLM<Glm4ForCausalLMImpl, Glm4Options, Glm4DecoderLayerImpl> {
 public:
  explicit Glm4ForCausalLMImpl(const Glm4Options& o);

 protected:
  void plan_layer(TensorParallelPlan& plan, const std::string& p, int64_t i) const override;
  std::string describe_more() const override;
};
TORCH_MODULE(Glm4ForCausalLM);

}  // namespace tessera::models
