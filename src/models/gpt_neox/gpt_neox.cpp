// The GPT-NeoX family: options (recipe and config.json), modules, partial rotary embeddings, initialisation.
#include "models/gpt_neox/gpt_neox.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

#include "tessera/config/value.h"
#include "tessera/models/family_keys.h"
#include "tessera/models/family_support.h"
#include "tessera/util/error.h"

namespace tessera::models {

// ---- Options --------------------------------------------------------------------------------------------------------

int64_t GPTNeoXOptions::rotary_ndims() const {
  return static_cast<int64_t>(static_cast<double>(head_dim()) * rotary_pct);
}

// GPTNeoXConfig's keys. transformers 4 also stores rope_theta and partial_rotary_factor, but sets them from
// rotary_emb_base and rotary_pct, which decide the function (transformers 5's rope_parameters becomes those two).
const FamilyKeys<GPTNeoXOptions>& gpt_neox_keys() {
  using O = GPTNeoXOptions;
  static const FamilyKeys<O> keys =
      FamilyKeys<O>({"gpt_neox"}, [](const std::string&) { return "GPTNeoXForCausalLM"; })
          .field("vocab_size", &O::vocab_size, positive())
          .field("hidden_size", &O::hidden_size, positive())
          .field("num_hidden_layers", &O::num_hidden_layers, positive())
          .field("num_attention_heads", &O::num_attention_heads, positive())
          .divides("num_attention_heads", &O::num_attention_heads, "hidden_size", &O::hidden_size)
          .field("intermediate_size", &O::intermediate_size, positive())
          .field("hidden_act", &O::hidden_act, hf_activation_check())
          .field("rotary_pct", &O::rotary_pct, KeyCheck<double>([](const double& v) {
                   return v > 0 && v <= 1 ? "" : std::string("must be in (0, 1]");
                 }))
          .field("rotary_emb_base", &O::rotary_emb_base)
          .linear_rope_scaling(&O::rope_linear_factor, "GPT-NeoX")
          .field("attention_dropout", &O::attention_dropout, probability())
          .field("hidden_dropout", &O::hidden_dropout, probability())
          .field("max_position_embeddings", &O::max_position_embeddings, positive())
          .field("initializer_range", &O::initializer_range)
          .field("layer_norm_eps", &O::layer_norm_eps)
          .field("tie_word_embeddings", &O::tie_word_embeddings)
          .field("use_parallel_residual", &O::use_parallel_residual)
          .field("attention_bias", &O::attention_bias)
          .token_ids()
          .finally([](config::Section& s, O& o) {
            s.check(o.rotary_ndims() % 2 == 0 && o.rotary_ndims() > 0, "rotary_pct",
                    fmt::format("gives {} rotary dimensions of each head (int(head_dim {} x {})): rotary embeddings "
                                "rotate an even, positive number",
                                o.rotary_ndims(), o.head_dim(), o.rotary_pct));
          })
          .hf_accepts({"rope_theta", "partial_rotary_factor"});
  return keys;
}

// ---- Modules --------------------------------------------------------------------------------------------------------

GPTNeoXAttentionImpl::GPTNeoXAttentionImpl(const GPTNeoXOptions& o, const at::TensorOptions& t) : o_(o) {
  const int64_t d = o.hidden_size;
  query_key_value = register_module("query_key_value", Linear(d, 3 * d, o.attention_bias, t));
  dense = register_module("dense", Linear(d, d, o.attention_bias, t));
}

at::Tensor GPTNeoXAttentionImpl::forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache) {
  // The heads and the sequence length come from the fused projection's output (this rank's heads under tensor
  // parallelism).
  const int64_t hd = o_.head_dim(), r = o_.rotary_ndims();
  const at::Tensor fused = query_key_value(x);
  const int64_t b = fused.size(0), s = fused.size(1);
  const at::Tensor qkv = fused.view({b, s, -1, 3 * hd});  // per head: q, k, v
  at::Tensor q = qkv.narrow(3, 0, hd), k = qkv.narrow(3, hd, hd), v = qkv.narrow(3, 2 * hd, hd);
  // Rotary on the first r dimensions of each head; the rest pass through.
  auto rotate = [&](const at::Tensor& t) {
    const at::Tensor rotated = apply_rotary(t.narrow(3, 0, r), in.rope_cos, in.rope_sin);
    return r == hd ? rotated : at::cat({rotated, t.narrow(3, r, hd - r)}, 3);
  };
  q = rotate(q).transpose(1, 2);
  k = rotate(k).transpose(1, 2);
  v = v.transpose(1, 2);
  append_to_cache(cache, k, v);
  const double dropout = is_training() ? o_.attention_dropout : 0.0;
  const at::Tensor context = attend(q, k, v, in, 1.0 / std::sqrt(static_cast<double>(hd)), dropout, is_training());
  return dense(context.transpose(1, 2).reshape({b, s, -1}));
}

GPTNeoXMLPImpl::GPTNeoXMLPImpl(const GPTNeoXOptions& o, const at::TensorOptions& t) : act_(o.hidden_act) {
  dense_h_to_4h = register_module("dense_h_to_4h", Linear(o.hidden_size, o.intermediate_size, true, t));
  dense_4h_to_h = register_module("dense_4h_to_h", Linear(o.intermediate_size, o.hidden_size, true, t));
}

at::Tensor GPTNeoXMLPImpl::forward(const at::Tensor& x) {
  return dense_4h_to_h(hf_activation(act_, dense_h_to_4h(x)));
}

GPTNeoXLayerImpl::GPTNeoXLayerImpl(const GPTNeoXOptions& o, const at::TensorOptions& t) : o_(o) {
  input_layernorm =
      register_module("input_layernorm", Norm(o.hidden_size, NormType::kLayerNorm, o.layer_norm_eps, true, t));
  post_attention_layernorm =
      register_module("post_attention_layernorm", Norm(o.hidden_size, NormType::kLayerNorm, o.layer_norm_eps, true, t));
  attention = register_module("attention", GPTNeoXAttention(o, t));
  mlp = register_module("mlp", GPTNeoXMLP(o, t));
}

at::Tensor GPTNeoXLayerImpl::forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache) {
  const bool training = is_training();
  const at::Tensor attn = at::dropout(attention(input_layernorm(x), in, cache), o_.hidden_dropout, training);
  if (o_.use_parallel_residual) {
    return at::dropout(mlp(post_attention_layernorm(x)), o_.hidden_dropout, training) + attn + x;
  }
  const at::Tensor h = attn + x;
  return at::dropout(mlp(post_attention_layernorm(h)), o_.hidden_dropout, training) + h;
}

GPTNeoXForCausalLMImpl::GPTNeoXForCausalLMImpl(const GPTNeoXOptions& o)
    : HfDecoderLM(o, gpt_neox_keys(),
                  {.root = "gpt_neox",
                   .embed = "embed_in",
                   .norm = "final_layer_norm",
                   .head = "embed_out",
                   .padding_idx = false}) {
  const at::TensorOptions t = tensor_options();
  build_backbone([&](int64_t) { return GPTNeoXLayer(o, t); },
                 Norm(o.hidden_size, NormType::kLayerNorm, o.layer_norm_eps, true, t));
  inv_freq_ = rotary_inv_freq(o.rotary_ndims(), o.rotary_emb_base) / o.rope_linear_factor;
}

at::Tensor GPTNeoXForCausalLMImpl::embed(const at::Tensor& ids, const DecoderCall& /*call*/) {
  return at::dropout(model->embed_tokens(ids), o_.hidden_dropout, is_training());
}

std::optional<double> GPTNeoXForCausalLMImpl::activation_bytes(int64_t batch, int64_t seq_len, int bytes_per_value,
                                                               bool activation_checkpointing) const {
  // Per layer: the input, both norms' outputs, q/k/v, the rotated q and k, the attention output, the residual sum of
  // a sequential layer, and the MLP's pre- and post-activation values.
  const double tokens = static_cast<double>(batch) * static_cast<double>(seq_len);
  const double d = static_cast<double>(o_.hidden_size), f = static_cast<double>(o_.intermediate_size);
  const double p = bytes_per_value;
  const double block = tokens * (d + 2 * d + 3 * d + 2 * d + d + (o_.use_parallel_residual ? 0 : d) + 2 * f) * p;
  const double layers = static_cast<double>(o_.num_hidden_layers);
  const double stored = activation_checkpointing ? layers * tokens * d * p + block : layers * block;
  return stored + tokens * static_cast<double>(o_.vocab_size) * (p + 4);
}

std::string GPTNeoXForCausalLMImpl::describe_more() const {
  return fmt::format(", rotary {} dims, base {}, {} residual, {}", o_.rotary_ndims(), o_.rotary_emb_base,
                     o_.use_parallel_residual ? "parallel" : "sequential", o_.hidden_act);
}

void GPTNeoXForCausalLMImpl::plan_layer(TensorParallelPlan& plan, const std::string& p, int64_t) const {
  // query_key_value is head-major (each head's q, k, v together): one block, split by heads.
  plan.layer(p, {"input_layernorm", "post_attention_layernorm"}, {"attention.query_key_value", "mlp.dense_h_to_4h"},
             {"attention.dense", "mlp.dense_4h_to_h"});
}

}  // namespace tessera::models
