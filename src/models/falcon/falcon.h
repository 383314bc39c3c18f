// The Falcon family (Falcon 7B's multi-query attention, Falcon 40B/180B's "new decoder architecture" with grouped
// K/V, the RW models' ALiBi and biases) as LibTorch modules with Hugging Face's module names, so named_parameters()
// gives the keys of FalconForCausalLM folders: transformer.word_embeddings.weight,
// transformer.h.{i}.self_attention.{query_key_value,dense}.weight, ....mlp.{dense_h_to_4h,dense_4h_to_h}.weight,
// ....{input_layernorm | ln_attn, ln_mlp | input_layernorm, post_attention_layernorm}.{weight,bias},
// transformer.ln_f.{weight,bias}, lm_head.weight (untied only). The function is transformers' FalconForCausalLM
// (4.57): parallel or sequential attention and MLP, one or two LayerNorms in parallel blocks, rotary (HF's
// rotate-half layout) or ALiBi positions (BLOOM's slopes, added in bf16 as transformers does), biases on or off.
// `model.name: falcon`. Modules are not thread-safe.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>

#include "tessera/models/blocks/hf_decoder.h"
#include "tessera/models/blocks/layers.h"
#include "tessera/models/family_keys.h"

namespace tessera::models {

// HF's FalconConfig keys and defaults (those of Falcon 7B); members under transformers' canonical names.
struct FalconOptions {
  int64_t vocab_size = 65024;
  int64_t hidden_size = 4544;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 71;
  int64_t num_kv_heads = 0;  // resolved: num_attention_heads when not given (the config's value; see kv_heads())
  bool new_decoder_architecture = false;
  bool multi_query = true;  // ignored by the new decoder architecture
  bool parallel_attn = true;
  std::optional<int64_t> num_ln_in_parallel_attn;  // as given; see ln_count()
  bool bias = false;                               // biases on the four Linear layers (LayerNorms always have one)
  bool alibi = false;                              // ALiBi instead of rotary positions
  double layer_norm_epsilon = 1e-5;
  double rope_theta = 10000.0;
  double rope_linear_factor = 1.0;  // rope_scaling {rope_type: linear, factor}; 1 = none
  int64_t max_position_embeddings = 2048;
  int64_t intermediate_size = 0;  // config key ffn_hidden_size; resolved: 4 * hidden_size when not given
  std::string activation = "gelu";
  double hidden_dropout = 0.0;
  double attention_dropout = 0.0;
  double initializer_range = 0.02;
  bool tie_word_embeddings = true;
  std::optional<int64_t> bos_token_id = 11, eos_token_id = 11, pad_token_id;
  std::string init_device = "cpu";  // cpu | cuda | meta

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  // The K/V heads the attention computes: num_kv_heads in the new architecture, 1 with multi_query, else one per
  // query head.
  int64_t kv_heads() const;
  // LayerNorms per block: 2 (ln_attn, ln_mlp) for the new architecture unless num_ln_in_parallel_attn is 1; 2
  // (input_layernorm, post_attention_layernorm) for sequential blocks; else 1 (input_layernorm).
  int64_t ln_count() const;
  bool two_parallel_norms() const { return parallel_attn && ln_count() == 2; }
};

// FalconConfig's keys (config.json's n_embed, the RW models' alias of hidden_size, accepted); every combination
// transformers' FalconForCausalLM does not compute (e.g. a sequential new-architecture block) is refused by key.
const FamilyKeys<FalconOptions>& falcon_keys();

// transformers' build_alibi_tensor slopes (BLOOM's): 2^(-8k/n) for k = 1..n, n the largest power of two <= heads,
// then 2^(-4(2j+1)/n) for the remaining heads; float32 (heads,).
at::Tensor falcon_alibi_slopes(int64_t n_heads);

class FalconAttentionImpl : public torch::nn::Module {
 public:
  FalconAttentionImpl(const FalconOptions& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  Linear query_key_value{nullptr}, dense{nullptr};

 private:
  FalconOptions o_;
};
TORCH_MODULE(FalconAttention);

// dense_4h_to_h(act(dense_h_to_4h(x))).
class FalconMLPImpl : public torch::nn::Module {
 public:
  FalconMLPImpl(const FalconOptions& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x);

  Linear dense_h_to_4h{nullptr}, dense_4h_to_h{nullptr};

 private:
  std::string activation_;
};
TORCH_MODULE(FalconMLP);

class FalconDecoderLayerImpl : public torch::nn::Module {
 public:
  FalconDecoderLayerImpl(const FalconOptions& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  Norm input_layernorm{nullptr};           // one-norm parallel blocks and sequential blocks
  Norm post_attention_layernorm{nullptr};  // sequential blocks
  Norm ln_attn{nullptr}, ln_mlp{nullptr};  // two-norm parallel blocks
  FalconAttention self_attention{nullptr};
  FalconMLP mlp{nullptr};

 private:
  FalconOptions o_;
};
TORCH_MODULE(FalconDecoderLayer);

// Units: 0 = the root (embedding, final norm and head), 1..num_hidden_layers = the decoder layers. Initialised as
// transformers' FalconPreTrainedModel. The tensor-parallel plan: whole K/V groups (or heads), the MLP's hidden units
// and the vocabulary split; refused for ALiBi and multi-query attention.
class FalconForCausalLMImpl : public HfDecoderLM<FalconForCausalLMImpl, FalconOptions, FalconDecoderLayerImpl> {
 public:
  explicit FalconForCausalLMImpl(const FalconOptions& o);
  // Per layer: the input, each norm's output, the fused q/k/v projection, the attention output, the residual sum of
  // a sequential block, and the MLP's pre- and post-activation values; then the logits.
  std::optional<double> activation_bytes(int64_t batch, int64_t seq_len, int bytes_per_value,
                                         bool activation_checkpointing) const override;

 protected:
  // Causal masks and rotary tables, or ALiBi biases (transformers' Falcon-RW arithmetic).
  AttentionInputs attention_inputs(const DecoderCall& call) override;
  void check_tensor_parallel(int64_t degree) const override;
  void plan_layer(TensorParallelPlan& plan, const std::string& p, int64_t i) const override;
  std::string describe_more() const override;

 private:
  at::Tensor slopes_;  // (heads,) float32 on the CPU; ALiBi only
};
TORCH_MODULE(FalconForCausalLM);

}  // namespace tessera::models
