// The Granite family: options (recipe and config.json), a Llama-shaped decoder with Granite's embedding, attention,
// residual and logits multipliers, initialisation, the tensor-parallel plan.
#include "models/granite/granite.h"

#include <fmt/format.h>

#include "tessera/config/value.h"
#include "tessera/models/family_keys.h"
#include "tessera/models/family_support.h"

namespace tessera::models {

// ---- Options --------------------------------------------------------------------------------------------------------

// GraniteConfig's keys.
const FamilyKeys<GraniteOptions>& granite_keys() {
  using O = GraniteOptions;
  static const FamilyKeys<O> keys =
      FamilyKeys<O>({"granite"}, [](const std::string&) { return "GraniteForCausalLM"; })
          .field("vocab_size", &O::vocab_size, positive())
          .field("hidden_size", &O::hidden_size, positive())
          .field("intermediate_size", &O::intermediate_size, positive())
          .field("num_hidden_layers", &O::num_hidden_layers, positive())
          .field("num_attention_heads", &O::num_attention_heads, positive())
          .divides("num_attention_heads", &O::num_attention_heads, "hidden_size", &O::hidden_size)
          .resolved(
              "num_key_value_heads", &O::num_key_value_heads, [](const O& o) { return o.num_attention_heads; },
              positive())
          .divides("num_key_value_heads", &O::num_key_value_heads, "num_attention_heads", &O::num_attention_heads)
          .field("hidden_act", &O::hidden_act, hf_activation_check())
          .field("max_position_embeddings", &O::max_position_embeddings, positive())
          .field("initializer_range", &O::initializer_range)
          .field("rms_norm_eps", &O::rms_norm_eps, positive_real())
          .token_ids()
          .pad_token_below_vocab()
          .field("tie_word_embeddings", &O::tie_word_embeddings)
          .field("rope_theta", &O::rope_theta, positive_real())
          .linear_rope_scaling(&O::rope_factor, "Granite")
          .field("attention_bias", &O::attention_bias)
          .field("attention_dropout", &O::attention_dropout, probability())
          .field("mlp_bias", &O::mlp_bias)
          .field("embedding_multiplier", &O::embedding_multiplier)
          .field("logits_scaling", &O::logits_scaling, positive_real())
          .field("residual_multiplier", &O::residual_multiplier)
          .field("attention_multiplier", &O::attention_multiplier, positive_real());
  return keys;
}

// ---- Modules --------------------------------------------------------------------------------------------------------

GraniteDecoderLayerImpl::GraniteDecoderLayerImpl(const GraniteOptions& o, const at::TensorOptions& t)
    : residual_multiplier_(o.residual_multiplier) {
  self_attn = register_module("self_attn", SelfAttention(SelfAttentionOptions{.hidden_size = o.hidden_size,
                                                                              .heads = o.num_attention_heads,
                                                                              .kv_heads = o.num_key_value_heads,
                                                                              .qkv_bias = o.attention_bias,
                                                                              .out_bias = o.attention_bias,
                                                                              .scale = o.attention_multiplier,
                                                                              .dropout = o.attention_dropout},
                                                         t));
  mlp = register_module("mlp", GatedMLP(o.hidden_size, o.intermediate_size, o.hidden_act, o.mlp_bias, t));
  auto norm = [&] { return Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t); };
  input_layernorm = register_module("input_layernorm", norm());
  post_attention_layernorm = register_module("post_attention_layernorm", norm());
}

at::Tensor GraniteDecoderLayerImpl::forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache) {
  const at::Tensor h = x + self_attn(input_layernorm(x), in, cache) * residual_multiplier_;
  return h + mlp(post_attention_layernorm(h)) * residual_multiplier_;
}

GraniteForCausalLMImpl::GraniteForCausalLMImpl(const GraniteOptions& o) : HfDecoderLM(o, granite_keys()) {
  const at::TensorOptions t = tensor_options();
  build_backbone([&](int64_t) { return GraniteDecoderLayer(o, t); },
                 Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t));
  inv_freq_ = rotary_inv_freq(o.head_dim(), o.rope_theta) / o.rope_factor;
}

at::Tensor GraniteForCausalLMImpl::embed(const at::Tensor& ids, const DecoderCall&) {
  return model->embed_tokens(ids) * o_.embedding_multiplier;
}

at::Tensor GraniteForCausalLMImpl::head(const at::Tensor& h) {
  return head_logits(model->norm(h), lm_head) / o_.logits_scaling;
}

std::string GraniteForCausalLMImpl::describe_more() const {
  return fmt::format(", multipliers: embedding {}, attention {}, residual {}, logits / {}", o_.embedding_multiplier,
                     o_.attention_multiplier, o_.residual_multiplier, o_.logits_scaling);
}

}  // namespace tessera::models
