// The GPT-Neo family (EleutherAI's GPT-Neo 125M, 1.3B, 2.7B) as LibTorch modules with Hugging Face's module names,
// so named_parameters() gives the keys of GPTNeoForCausalLM folders: transformer.{wte,wpe}.weight,
// transformer.h.{i}.{ln_1,ln_2}.*, transformer.h.{i}.attn.attention.{q,k,v}_proj.weight (no biases),
// ....attn.attention.out_proj.{weight,bias}, ....mlp.{c_fc,c_proj}.*, transformer.ln_f.*; the head is tied to wte.
// The function is transformers' GPTNeoForCausalLM (4.57): learned positions, layers alternating global causal
// attention and local attention over the last window_size tokens (attention_types), scores NOT scaled by
// 1/sqrt(head_dim), pre-LN blocks. `model.name: gpt_neo`. Not thread-safe.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "tessera/models/blocks/hf_decoder.h"
#include "tessera/models/blocks/layers.h"
#include "tessera/models/blocks/self_attention.h"
#include "tessera/models/family_keys.h"

namespace tessera::models {

// HF's GPTNeoConfig keys and defaults (those of GPT-Neo 1.3B); members under transformers' canonical names.
struct GPTNeoOptions {
  int64_t vocab_size = 50257;
  int64_t max_position_embeddings = 2048;
  int64_t hidden_size = 2048;
  int64_t num_hidden_layers = 24;  // config key num_layers
  // Per layer, "global" or "local": attention_types ([[["global", "local"], 12]]) expanded as transformers does
  // (each pattern repeated its count of times), or the config's attention_layers when it gives them.
  std::vector<std::string> attention_layers;
  int64_t num_attention_heads = 16;  // config key num_heads
  int64_t intermediate_size = 0;     // resolved: 4 * hidden_size when not given
  int64_t window_size = 256;
  std::string activation_function = "gelu_new";
  double resid_dropout = 0.0;
  double embed_dropout = 0.0;
  double attention_dropout = 0.0;
  double layer_norm_epsilon = 1e-5;
  double initializer_range = 0.02;
  static constexpr bool tie_word_embeddings = true;  // every published GPT-Neo ties its head to wte
  std::optional<int64_t> bos_token_id = 50256, eos_token_id = 50256, pad_token_id;
  std::string init_device = "cpu";  // cpu | cuda | meta

  // attention_types as given (for config.json): runs of equal patterns, compressed back.
  nlohmann::ordered_json attention_types() const;
};

// GPTNeoConfig's keys: the recipe reader, the config.json reader and writer.
const FamilyKeys<GPTNeoOptions>& gpt_neo_keys();

// transformers' GPTNeoAttention: a wrapper whose one child is `attention` (hence attn.attention.* names).
class GPTNeoAttentionImpl : public torch::nn::Module {
 public:
  GPTNeoAttentionImpl(const GPTNeoOptions& o, const at::TensorOptions& t);

  SelfAttention attention{nullptr};  // unscaled scores
};
TORCH_MODULE(GPTNeoAttention);

class GPTNeoMLPImpl : public torch::nn::Module {
 public:
  GPTNeoMLPImpl(const GPTNeoOptions& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x);

  Linear c_fc{nullptr}, c_proj{nullptr};

 private:
  std::string act_;
  double dropout_;
};
TORCH_MODULE(GPTNeoMLP);

class GPTNeoBlockImpl : public torch::nn::Module {
 public:
  GPTNeoBlockImpl(const GPTNeoOptions& o, bool local, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const GlobalLocalInputs& in, LayerCache* cache = nullptr);

  Norm ln_1{nullptr};
  GPTNeoAttention attn{nullptr};
  Norm ln_2{nullptr};
  GPTNeoMLP mlp{nullptr};

 private:
  bool local_;
  double resid_dropout_;
};
TORCH_MODULE(GPTNeoBlock);

// Units: 0 = the root (embeddings, final norm and tied head), 1..num_layers = the blocks. The local layers attend
// over the last window_size positions of the row, padding included, as transformers' banded mask. Initialised as
// transformers' GPTNeoPreTrainedModel. The tensor-parallel plan: heads, c_fc's units and the vocabulary split.
class GPTNeoForCausalLMImpl
    : public HfDecoderLM<GPTNeoForCausalLMImpl, GPTNeoOptions, GPTNeoBlockImpl, GlobalLocalInputs> {
 public:
  explicit GPTNeoForCausalLMImpl(const GPTNeoOptions& o);

 protected:
  at::Tensor embed(const at::Tensor& ids, const DecoderCall& call) override;  // tokens + positions, dropped out
  bool windowed(int64_t i) const override { return o_.attention_layers[i] == "local"; }
  void plan_layer(TensorParallelPlan& plan, const std::string& p, int64_t i) const override;
  std::string describe_more() const override;
};
TORCH_MODULE(GPTNeoForCausalLM);

}  // namespace tessera::models
