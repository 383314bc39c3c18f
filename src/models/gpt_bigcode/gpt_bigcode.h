// The GPT-BigCode family (BigCode's StarCoder 1, StarCoderBase, SantaCoder) as LibTorch modules with Hugging Face's
// module names, so named_parameters() gives the keys of GPTBigCodeForCausalLM folders: transformer.wte.weight,
// transformer.wpe.weight, transformer.h.{i}.ln_1.*, ....attn.c_attn.*, ....attn.c_proj.*, ....ln_2.*,
// ....mlp.c_fc.*, ....mlp.c_proj.*, transformer.ln_f.*, lm_head.weight (untied only). The function is transformers'
// GPTBigCodeForCausalLM (4.57): GPT-2 blocks (LayerNorms before attention and MLP, learned positions, biases
// everywhere) with multi-query attention (`multi_query`: one key/value head, c_attn's output [queries | key |
// value]) or multi-head attention (c_attn's output head-major, each head's query, key and value together).
// `model.name: gpt_bigcode`. Not thread-safe.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <optional>
#include <string>

#include "tessera/models/blocks/hf_decoder.h"
#include "tessera/models/blocks/layers.h"
#include "tessera/models/family_keys.h"

namespace tessera::models {

// transformers' GPTBigCodeConfig keys and defaults; members under transformers' canonical names.
struct GPTBigCodeOptions {
  int64_t vocab_size = 50257;
  int64_t max_position_embeddings = 1024;  // config key n_positions
  int64_t hidden_size = 768;               // config key n_embd
  int64_t num_hidden_layers = 12;          // config key n_layer
  int64_t num_attention_heads = 12;        // config key n_head
  int64_t intermediate_size = 0;           // config key n_inner; resolved: 4 * n_embd when not given
  std::string activation_function = "gelu_pytorch_tanh";
  double resid_pdrop = 0.1;
  double embd_pdrop = 0.1;
  double attn_pdrop = 0.1;
  double layer_norm_epsilon = 1e-5;
  double initializer_range = 0.02;
  bool scale_attn_weights = true;
  // Where transformers' eager attention upcasts its softmax; its SDPA path, and Tessera, compute the softmax in float32
  // whatever they say.
  bool attention_softmax_in_fp32 = true;
  bool scale_attention_softmax_in_fp32 = true;
  bool multi_query = true;
  bool tie_word_embeddings = true;
  std::optional<int64_t> bos_token_id = 50256, eos_token_id = 50256, pad_token_id;
  std::string init_device = "cpu";  // cpu | cuda | meta

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  int64_t kv_heads() const { return multi_query ? 1 : num_attention_heads; }
};

// GPTBigCodeConfig's keys: the recipe reader, the config.json reader and writer.
const FamilyKeys<GPTBigCodeOptions>& gpt_bigcode_keys();

class GPTBigCodeAttentionImpl : public torch::nn::Module {
 public:
  GPTBigCodeAttentionImpl(const GPTBigCodeOptions& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  Linear c_attn{nullptr}, c_proj{nullptr};

 private:
  GPTBigCodeOptions o_;
};
TORCH_MODULE(GPTBigCodeAttention);

// c_proj(act(c_fc(x))), then the residual dropout.
class GPTBigCodeMLPImpl : public torch::nn::Module {
 public:
  GPTBigCodeMLPImpl(const GPTBigCodeOptions& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x);

  Linear c_fc{nullptr}, c_proj{nullptr};

 private:
  std::string act_;
  double dropout_;
};
TORCH_MODULE(GPTBigCodeMLP);

class GPTBigCodeBlockImpl : public torch::nn::Module {
 public:
  GPTBigCodeBlockImpl(const GPTBigCodeOptions& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  Norm ln_1{nullptr};
  GPTBigCodeAttention attn{nullptr};
  Norm ln_2{nullptr};
  GPTBigCodeMLP mlp{nullptr};
};
TORCH_MODULE(GPTBigCodeBlock);

// Units: 0 = the root (embeddings, final norm and head), 1..n_layer = the blocks. The tensor-parallel plan (multi-head
// attention only: multi-query attention's one key/value head does not split): heads (c_attn is head-major), the MLP's
// hidden units and the vocabulary, the LayerNorms on sequence shards.
class GPTBigCodeForCausalLMImpl
    : public HfDecoderLM<GPTBigCodeForCausalLMImpl, GPTBigCodeOptions, GPTBigCodeBlockImpl> {
 public:
  explicit GPTBigCodeForCausalLMImpl(const GPTBigCodeOptions& o);
  // transformers' scheme, with the attention's and the MLP's c_proj weights at std initializer_range / sqrt(2 n_layer).
  void init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select = nullptr) override;

 protected:
  at::Tensor embed(const at::Tensor& ids, const DecoderCall& call) override;  // tokens + positions, dropped out
  void check_tensor_parallel(int64_t degree) const override;
  void plan_layer(TensorParallelPlan& plan, const std::string& p, int64_t i) const override;
  std::string describe_more() const override;
};
TORCH_MODULE(GPTBigCodeForCausalLM);

}  // namespace tessera::models
