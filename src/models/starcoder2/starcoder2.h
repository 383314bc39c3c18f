// The StarCoder2 family (BigCode's StarCoder2 3B / 7B / 15B) as LibTorch modules with Hugging Face's module names,
// so named_parameters() gives the keys of Starcoder2ForCausalLM folders: model.embed_tokens.weight,
// model.layers.{i}.input_layernorm.*, ....self_attn.{q,k,v,o}_proj.*, ....post_attention_layernorm.*,
// ....mlp.{c_fc,c_proj}.*, model.norm.*, lm_head.weight (untied only). The function is transformers'
// Starcoder2ForCausalLM (4.57): LayerNorms with biases before the attention and the MLP, q/k/v/o projections with
// biases (use_bias), grouped-query attention with rotary embeddings and an optional sliding window, a GELU MLP with
// biases, dropout on the embeddings and on each block's output. Starcoder2ForCausalLM implements the model protocol
// (causal_lm.h); `model.name: starcoder2`. Not thread-safe.
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

// transformers' Starcoder2Config keys and defaults (StarCoder2 3B's).
struct Starcoder2Options {
  int64_t vocab_size = 49152;
  int64_t hidden_size = 3072;
  int64_t intermediate_size = 12288;
  int64_t num_hidden_layers = 30;
  int64_t num_attention_heads = 24;
  int64_t num_key_value_heads = 2;
  std::string hidden_act = "gelu_pytorch_tanh";
  int64_t max_position_embeddings = 4096;
  double initializer_range = 0.018042;
  double norm_epsilon = 1e-5;
  std::optional<int64_t> bos_token_id = 50256, eos_token_id = 50256, pad_token_id;
  bool tie_word_embeddings = true;  // PretrainedConfig's default: Starcoder2Config does not set it
  double rope_theta = 10000.0;
  double rope_factor = 1.0;               // rope_scaling of the linear kind; 1: none
  std::optional<int64_t> sliding_window;  // each query sees at most this many keys; null: unlimited
  double attention_dropout = 0.0;
  double residual_dropout = 0.0;
  double embedding_dropout = 0.0;
  bool use_bias = true;
  std::string init_device = "cpu";  // cpu | cuda | meta

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
};

// Starcoder2Config's keys: the recipe reader, the config.json reader and writer.
const FamilyKeys<Starcoder2Options>& starcoder2_keys();

// c_proj(act(c_fc(x))), then the residual dropout.
class Starcoder2MLPImpl : public torch::nn::Module {
 public:
  Starcoder2MLPImpl(const Starcoder2Options& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x);

  Linear c_fc{nullptr}, c_proj{nullptr};

 private:
  std::string act_;
  double dropout_;
};
TORCH_MODULE(Starcoder2MLP);

class Starcoder2DecoderLayerImpl : public torch::nn::Module {
 public:
  Starcoder2DecoderLayerImpl(const Starcoder2Options& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  SelfAttention self_attn{nullptr};
  Starcoder2MLP mlp{nullptr};
  Norm input_layernorm{nullptr}, post_attention_layernorm{nullptr};

 private:
  double residual_dropout_;
};
TORCH_MODULE(Starcoder2DecoderLayer);

// Units: 0 = the root (embedding, final norm and head), 1..num_hidden_layers = the decoder layers. The tensor-parallel
// plan: heads, the MLP's hidden units and the vocabulary (where it divides); the layers' LayerNorms on sequence shards.
class Starcoder2ForCausalLMImpl
    : public HfDecoderLM<Starcoder2ForCausalLMImpl, Starcoder2Options, Starcoder2DecoderLayerImpl> {
 public:
  explicit Starcoder2ForCausalLMImpl(const Starcoder2Options& o);

 protected:
  at::Tensor embed(const at::Tensor& ids, const DecoderCall& call) override;                  // the embedding dropout
  void plan_layer(TensorParallelPlan& plan, const std::string& p, int64_t i) const override;  // c_fc, c_proj
  std::string describe_more() const override;
};
TORCH_MODULE(Starcoder2ForCausalLM);

}  // namespace tessera::models
