// The StarCoder2 family: options (recipe and config.json), LayerNorm blocks over the shared attention with biases and
// a GELU MLP, initialisation, the tensor-parallel plan.
#include "models/starcoder2/starcoder2.h"

#include <fmt/format.h>

#include <algorithm>

#include "tessera/config/value.h"
#include "tessera/models/family_keys.h"
#include "tessera/models/family_support.h"

namespace tessera::models {

// ---- Options --------------------------------------------------------------------------------------------------------

// Starcoder2Config's keys.
const FamilyKeys<Starcoder2Options>& starcoder2_keys() {
  using O = Starcoder2Options;
  static const FamilyKeys<O> keys =
      FamilyKeys<O>({"starcoder2"}, [](const std::string&) { return "Starcoder2ForCausalLM"; })
          .field("vocab_size", &O::vocab_size, positive())
          .field("hidden_size", &O::hidden_size, positive())
          .field("intermediate_size", &O::intermediate_size, positive())
          .field("num_hidden_layers", &O::num_hidden_layers, positive())
          .field("num_attention_heads", &O::num_attention_heads, positive())
          .divides("num_attention_heads", &O::num_attention_heads, "hidden_size", &O::hidden_size)
          .field("num_key_value_heads", &O::num_key_value_heads, positive())
          .divides("num_key_value_heads", &O::num_key_value_heads, "num_attention_heads", &O::num_attention_heads)
          .field("hidden_act", &O::hidden_act, hf_activation_check())
          .field("max_position_embeddings", &O::max_position_embeddings, positive())
          .field("initializer_range", &O::initializer_range)
          .field("norm_epsilon", &O::norm_epsilon, positive_real())
          .token_ids()
          .pad_token_below_vocab()
          .field("tie_word_embeddings", &O::tie_word_embeddings)
          .field("rope_theta", &O::rope_theta, positive_real())
          .linear_rope_scaling(&O::rope_factor, "StarCoder2")
          .field("sliding_window", &O::sliding_window, positive_or_none<int64_t>())
          .field("attention_dropout", &O::attention_dropout, probability())
          .field("residual_dropout", &O::residual_dropout, probability())
          .field("embedding_dropout", &O::embedding_dropout, probability())
          .field("use_bias", &O::use_bias)
          // The published configs also carry mlp_type, norm_type and layer_norm_epsilon, which transformers'
          // StarCoder2 classes do not read (norm_epsilon is the one they do).
          .hf_accepts({"mlp_type", "norm_type", "layer_norm_epsilon"});
  return keys;
}

// ---- Modules --------------------------------------------------------------------------------------------------------

Starcoder2MLPImpl::Starcoder2MLPImpl(const Starcoder2Options& o, const at::TensorOptions& t)
    : act_(o.hidden_act), dropout_(o.residual_dropout) {
  c_fc = register_module("c_fc", Linear(o.hidden_size, o.intermediate_size, o.use_bias, t));
  c_proj = register_module("c_proj", Linear(o.intermediate_size, o.hidden_size, o.use_bias, t));
}

at::Tensor Starcoder2MLPImpl::forward(const at::Tensor& x) {
  return at::dropout(c_proj(hf_activation(act_, c_fc(x))), dropout_, is_training());
}

Starcoder2DecoderLayerImpl::Starcoder2DecoderLayerImpl(const Starcoder2Options& o, const at::TensorOptions& t)
    : residual_dropout_(o.residual_dropout) {
  self_attn = register_module("self_attn", SelfAttention(SelfAttentionOptions{.hidden_size = o.hidden_size,
                                                                              .heads = o.num_attention_heads,
                                                                              .kv_heads = o.num_key_value_heads,
                                                                              .qkv_bias = o.use_bias,
                                                                              .out_bias = o.use_bias,
                                                                              .dropout = o.attention_dropout},
                                                         t));
  mlp = register_module("mlp", Starcoder2MLP(o, t));
  auto norm = [&] { return Norm(o.hidden_size, NormType::kLayerNorm, o.norm_epsilon, true, t); };
  input_layernorm = register_module("input_layernorm", norm());
  post_attention_layernorm = register_module("post_attention_layernorm", norm());
}

at::Tensor Starcoder2DecoderLayerImpl::forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache) {
  const at::Tensor h = x + at::dropout(self_attn(input_layernorm(x), in, cache), residual_dropout_, is_training());
  return h + mlp(post_attention_layernorm(h));
}

Starcoder2ForCausalLMImpl::Starcoder2ForCausalLMImpl(const Starcoder2Options& o) : HfDecoderLM(o, starcoder2_keys()) {
  const at::TensorOptions t = tensor_options();
  build_backbone([&](int64_t) { return Starcoder2DecoderLayer(o, t); },
                 Norm(o.hidden_size, NormType::kLayerNorm, o.norm_epsilon, true, t));
  inv_freq_ = rotary_inv_freq(o.head_dim(), o.rope_theta) / o.rope_factor;
  window_ = o.sliding_window.value_or(0);
}

at::Tensor Starcoder2ForCausalLMImpl::embed(const at::Tensor& ids, const DecoderCall&) {
  return at::dropout(model->embed_tokens(ids), o_.embedding_dropout, is_training());
}

std::string Starcoder2ForCausalLMImpl::describe_more() const {
  return fmt::format(", rope theta {}{}", o_.rope_theta,
                     o_.sliding_window ? fmt::format(", sliding window {}", *o_.sliding_window) : "");
}

void Starcoder2ForCausalLMImpl::plan_layer(TensorParallelPlan& plan, const std::string& p, int64_t) const {
  plan.layer(p, {"input_layernorm", "post_attention_layernorm"},
             {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.c_fc"},
             {"self_attn.o_proj", "mlp.c_proj"});
}

}  // namespace tessera::models
