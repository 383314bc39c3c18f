// The attention module most transformers decoders share, as one block: separate query, key, value and output
// projections under transformers' names (q_proj, k_proj, v_proj and o_proj, or out_proj), grouped-query heads, q/k
// norms per head (Qwen3, Gemma 3) or over the whole projection (OLMo 2), an output gate per head (Qwen3.5), rotary
// embeddings from the call's tables when
// it has them (over the tables' width, so partial rotary too; rotate-half or interleaved pairs), the KV cache and
// attend(). A family registers it under its own module name ("self_attn", "attention")
// with the options of its config; what differs beyond these (fused projections, ALiBi, multi-query layouts) stays in
// the family's own module.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <string>

#include "tessera/models/blocks/attention.h"
#include "tessera/models/blocks/layers.h"
#include "tessera/models/blocks/norm_type.h"

namespace tessera::models {

// Where the q/k norms apply: none, over each head's head_dim features (before rotary), or over all the heads'
// features of the projection (before the heads are split).
enum class QKNorm { kNone, kPerHead, kWhole };

struct SelfAttentionOptions {
  int64_t hidden_size = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;  // 0: heads
  int64_t head_dim = 0;  // 0: hidden_size / heads
  bool qkv_bias = false;
  bool out_bias = false;
  std::string out_name = "o_proj";  // the output projection's module name (OPT's and GPT-Neo's: out_proj)
  bool kv_first = false;            // registered k_proj, v_proj, q_proj (transformers' order in OPT and GPT-Neo)
  QKNorm qk_norm = QKNorm::kNone;
  NormType qk_norm_type = NormType::kRMSNorm;
  double qk_norm_eps = 1e-6;
  double scale = 0;                 // the scores' scale; 0: 1 / sqrt(head_dim)
  double dropout = 0;               // on the attention probabilities, while training
  bool interleaved_rotary = false;  // rotate pairs (2i, 2i + 1) (apply_rotary_interleaved: GLM's layout)
  bool sinks = false;               // a learned sink logit per head, `sinks` (heads,) (gpt-oss; attend())
  // q_proj also gives each head an output gate, [query | gate] per head; the attention's output is multiplied by
  // sigmoid(gate) before o_proj (Qwen3-Next, Qwen3.5).
  bool output_gate = false;

  int64_t kv() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t hd() const { return head_dim > 0 ? head_dim : hidden_size / heads; }
};

class SelfAttentionImpl : public torch::nn::Module {
 public:
  SelfAttentionImpl(const SelfAttentionOptions& o, const at::TensorOptions& t);
  // x (B, s, hidden) -> (B, s, hidden). Head counts and the sequence length come from the projections' outputs (this
  // rank's heads under tensor parallelism, the whole sequence of a sharded x under sequence parallelism).
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};  // o_proj under options.out_name
  Norm q_norm{nullptr}, k_norm{nullptr};                                      // with qk_norm only
  at::Tensor sinks;                                                           // with options.sinks only

 private:
  SelfAttentionOptions o_;
};
TORCH_MODULE(SelfAttention);

// down_proj(act(gate_proj(x)) * up_proj(x)): the gated MLP (SwiGLU with silu, GeGLU with a GELU) under transformers'
// names; `fused`: gate and up as the two halves of one gate_up_proj (Phi-3, GLM-4), which a tensor-parallel plan
// splits half by half.
class GatedMLPImpl : public torch::nn::Module {
 public:
  // `act`: one of hf_activation_names().
  GatedMLPImpl(int64_t hidden_size, int64_t intermediate_size, const std::string& act, bool bias,
               const at::TensorOptions& t, bool fused = false);
  at::Tensor forward(const at::Tensor& x);

  Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  Linear gate_up_proj{nullptr};  // fused only (gate_proj and up_proj null)

 private:
  std::string act_;
};
TORCH_MODULE(GatedMLP);

}  // namespace tessera::models
