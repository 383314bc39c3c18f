// The GLM-4 family: options (recipe and config.json), sandwich-norm layers over the shared attention with interleaved
// partial rotary and a fused SwiGLU MLP, initialisation, the tensor-parallel plan.
#include "models/glm4/glm4.h"

#include <fmt/format.h>

#include "tessera/config/value.h"
#include "tessera/models/family_keys.h"
#include "tessera/models/family_support.h"

namespace tessera::models {

// ---- Options --------------------------------------------------------------------------------------------------------

int64_t Glm4Options::rotary_dims() const {
  return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
}

// Glm4Config's keys.
const FamilyKeys<Glm4Options>& glm4_keys() {
  using O = Glm4Options;
  static const FamilyKeys<O> keys =
      FamilyKeys<O>({"glm4"}, [](const std::string&) { return "Glm4ForCausalLM"; })
          .field("vocab_size", &O::vocab_size, positive())
          .field("hidden_size", &O::hidden_size, positive())
          .field("intermediate_size", &O::intermediate_size, positive())
          .field("num_hidden_layers", &O::num_hidden_layers, positive())
          .field("num_attention_heads", &O::num_attention_heads, positive())
          .field("num_key_value_heads", &O::num_key_value_heads, positive())
          .divides("num_key_value_heads", &O::num_key_value_heads, "num_attention_heads", &O::num_attention_heads)
          .field("head_dim", &O::head_dim, positive())
          .partial_rotary_factor(&O::partial_rotary_factor, [](const O& o) { return o.head_dim; })
          .field("hidden_act", &O::hidden_act, hf_activation_check())
          .field("attention_dropout", &O::attention_dropout, probability())
          .field("max_position_embeddings", &O::max_position_embeddings, positive())
          .field("initializer_range", &O::initializer_range)
          .field("rms_norm_eps", &O::rms_norm_eps, positive_real())
          .field("tie_word_embeddings", &O::tie_word_embeddings)
          .field("rope_theta", &O::rope_theta, positive_real())
          .token_ids()
          .pad_token_below_vocab()
          .field("attention_bias", &O::attention_bias);
  return keys;
}

// ---- Modules --------------------------------------------------------------------------------------------------------

Glm4DecoderLayerImpl::Glm4DecoderLayerImpl(const Glm4Options& o, const at::TensorOptions& t) {
  self_attn = register_module("self_attn", SelfAttention(SelfAttentionOptions{.hidden_size = o.hidden_size,
                                                                              .heads = o.num_attention_heads,
                                                                              .kv_heads = o.num_key_value_heads,
                                                                              .head_dim = o.head_dim,
                                                                              .qkv_bias = o.attention_bias,
                                                                              .dropout = o.attention_dropout,
                                                                              .interleaved_rotary = true},
                                                         t));
  mlp = register_module("mlp", GatedMLP(o.hidden_size, o.intermediate_size, o.hidden_act, false, t, true));
  auto norm = [&] { return Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t); };
  input_layernorm = register_module("input_layernorm", norm());
  post_attention_layernorm = register_module("post_attention_layernorm", norm());
  post_self_attn_layernorm = register_module("post_self_attn_layernorm", norm());
  post_mlp_layernorm = register_module("post_mlp_layernorm", norm());
}

at::Tensor Glm4DecoderLayerImpl::forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache) {
  const at::Tensor h = x + post_self_attn_layernorm(self_attn(input_layernorm(x), in, cache));
  return h + post_mlp_layernorm(mlp(post_attention_layernorm(h)));
}

Glm4ForCausalLMImpl::Glm4ForCausalLMImpl(const Glm4Options& o) : HfDecoderLM(o, glm4_keys()) {
  const at::TensorOptions t = tensor_options();
  build_backbone([&](int64_t) { return Glm4DecoderLayer(o, t); },
                 Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t));
  inv_freq_ = rotary_inv_freq(o.rotary_dims(), o.rope_theta);  // the first rotary_dims() features of each head
}

std::string Glm4ForCausalLMImpl::describe_more() const {
  return fmt::format(", interleaved rotary on {}", o_.rotary_dims());
}

void Glm4ForCausalLMImpl::plan_layer(TensorParallelPlan& plan, const std::string& p, int64_t) const {
  plan.layer(p, {"input_layernorm", "post_self_attn_layernorm", "post_attention_layernorm", "post_mlp_layernorm"},
             {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}, {"self_attn.o_proj", "mlp.down_proj"});
  plan.column(p + "mlp.gate_up_proj", {o_.intermediate_size, o_.intermediate_size});
}

}  // namespace tessera::models
