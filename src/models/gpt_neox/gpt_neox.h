// The GPT-NeoX family (EleutherAI's GPT-NeoX-20B and the Pythia suite, 14M ... 12B) as LibTorch modules with
// Hugging Face's module names, so named_parameters() gives the keys of GPTNeoXForCausalLM folders:
// gpt_neox.embed_in.weight, gpt_neox.layers.{i}.{input_layernorm,post_attention_layernorm}.{weight,bias},
// ....attention.{query_key_value,dense}.{weight,bias}, ....mlp.{dense_h_to_4h,dense_4h_to_h}.{weight,bias},
// gpt_neox.final_layer_norm.{weight,bias}, embed_out.weight (untied only). The function is transformers'
// GPTNeoXForCausalLM (4.57): per-head interleaved q/k/v, rotary on the first rotary_pct of each head (HF's
// rotate-half layout), parallel (x + attn(ln1 x) + mlp(ln2 x)) or sequential residuals, biases on or off.
// GPTNeoXForCausalLM implements the model protocol (causal_lm.h); `model.name: gpt_neox`. Not thread-safe.
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
#include "tessera/models/family_keys.h"

namespace tessera::models {

// HF's GPTNeoXConfig keys and defaults (those of GPT-NeoX-20B).
struct GPTNeoXOptions {
  int64_t vocab_size = 50432;
  int64_t hidden_size = 6144;
  int64_t num_hidden_layers = 44;
  int64_t num_attention_heads = 64;
  int64_t intermediate_size = 24576;
  std::string hidden_act = "gelu";
  double rotary_pct = 0.25;
  double rotary_emb_base = 10000.0;
  double rope_linear_factor = 1.0;  // rope_scaling {rope_type: linear, factor}; 1 = none
  double attention_dropout = 0.0;
  double hidden_dropout = 0.0;
  int64_t max_position_embeddings = 2048;
  double initializer_range = 0.02;
  double layer_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  bool use_parallel_residual = true;
  bool attention_bias = true;
  std::optional<int64_t> bos_token_id = 0, eos_token_id = 2, pad_token_id;
  std::string init_device = "cpu";  // cpu | cuda | meta

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  // The rotated dimensions of each head: int(head_dim * rotary_pct), as transformers truncates it.
  int64_t rotary_ndims() const;
};

// GPTNeoXConfig's keys: the recipe reader, the config.json reader and writer.
const FamilyKeys<GPTNeoXOptions>& gpt_neox_keys();

class GPTNeoXAttentionImpl : public torch::nn::Module {
 public:
  GPTNeoXAttentionImpl(const GPTNeoXOptions& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  Linear query_key_value{nullptr}, dense{nullptr};

 private:
  GPTNeoXOptions o_;
};
TORCH_MODULE(GPTNeoXAttention);

// dense_4h_to_h(act(dense_h_to_4h(x))).
class GPTNeoXMLPImpl : public torch::nn::Module {
 public:
  GPTNeoXMLPImpl(const GPTNeoXOptions& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x);

  Linear dense_h_to_4h{nullptr}, dense_4h_to_h{nullptr};

 private:
  std::string act_;
};
TORCH_MODULE(GPTNeoXMLP);

class GPTNeoXLayerImpl : public torch::nn::Module {
 public:
  GPTNeoXLayerImpl(const GPTNeoXOptions& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  Norm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  GPTNeoXAttention attention{nullptr};
  GPTNeoXMLP mlp{nullptr};

 private:
  GPTNeoXOptions o_;
};
TORCH_MODULE(GPTNeoXLayer);

// Units: 0 = the root (embedding, final norm and head), 1..num_hidden_layers = the layers. Initialised as transformers'
// GPTNeoXPreTrainedModel does (LayerNorms weight 1 and bias 0). The tensor-parallel plan: heads, the MLP's hidden
// units and the vocabulary split.
class GPTNeoXForCausalLMImpl : public HfDecoderLM<GPTNeoXForCausalLMImpl, GPTNeoXOptions, GPTNeoXLayerImpl> {
 public:
  explicit GPTNeoXForCausalLMImpl(const GPTNeoXOptions& o);
  std::optional<double> activation_bytes(int64_t batch, int64_t seq_len, int bytes_per_value,
                                         bool activation_checkpointing) const override;

 protected:
  at::Tensor embed(const at::Tensor& ids, const DecoderCall& call) override;  // the embedding dropout
  void plan_layer(TensorParallelPlan& plan, const std::string& p, int64_t i) const override;
  std::string describe_more() const override;
};
TORCH_MODULE(GPTNeoXForCausalLM);

}  // namespace tessera::models
