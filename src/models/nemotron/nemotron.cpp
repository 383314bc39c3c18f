// The Nemotron family: options (recipe and config.json), LayerNorm1P blocks over the shared attention with partial
// rotary and a squared-ReLU MLP, initialisation, the tensor-parallel plan.
#include "models/nemotron/nemotron.h"

#include <fmt/format.h>

#include "tessera/config/value.h"
#include "tessera/models/family_keys.h"
#include "tessera/models/family_support.h"

namespace tessera::models {

// ---- Options --------------------------------------------------------------------------------------------------------

int64_t NemotronOptions::rotary_dims() const {
  return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
}

// NemotronConfig's keys.
const FamilyKeys<NemotronOptions>& nemotron_keys() {
  using O = NemotronOptions;
  static const FamilyKeys<O> keys =
      FamilyKeys<O>({"nemotron"}, [](const std::string&) { return "NemotronForCausalLM"; })
          .field("vocab_size", &O::vocab_size, positive())
          .field("hidden_size", &O::hidden_size, positive())
          .field("intermediate_size", &O::intermediate_size, positive())
          .field("num_hidden_layers", &O::num_hidden_layers, positive())
          .field("num_attention_heads", &O::num_attention_heads, positive())
          .resolved(
              "head_dim", &O::head_dim, [](const O& o) { return o.hidden_size / o.num_attention_heads; }, positive())
          .resolved(
              "num_key_value_heads", &O::num_key_value_heads, [](const O& o) { return o.num_attention_heads; },
              positive())
          .divides("num_key_value_heads", &O::num_key_value_heads, "num_attention_heads", &O::num_attention_heads)
          .field("hidden_act", &O::hidden_act, hf_activation_check())
          .field("max_position_embeddings", &O::max_position_embeddings, positive())
          .field("initializer_range", &O::initializer_range)
          .field("norm_eps", &O::norm_eps, positive_real())
          .token_ids()
          .pad_token_below_vocab()
          .field("tie_word_embeddings", &O::tie_word_embeddings)
          .field("rope_theta", &O::rope_theta, positive_real())
          .partial_rotary_factor(&O::partial_rotary_factor, [](const O& o) { return o.head_dim; })
          .field("attention_bias", &O::attention_bias)
          .field("attention_dropout", &O::attention_dropout, probability())
          .field("mlp_bias", &O::mlp_bias);
  return keys;
}

// ---- Modules --------------------------------------------------------------------------------------------------------

NemotronMLPImpl::NemotronMLPImpl(const NemotronOptions& o, const at::TensorOptions& t) : act_(o.hidden_act) {
  up_proj = register_module("up_proj", Linear(o.hidden_size, o.intermediate_size, o.mlp_bias, t));
  down_proj = register_module("down_proj", Linear(o.intermediate_size, o.hidden_size, o.mlp_bias, t));
}

at::Tensor NemotronMLPImpl::forward(const at::Tensor& x) {
  return down_proj(hf_activation(act_, up_proj(x)));
}

NemotronDecoderLayerImpl::NemotronDecoderLayerImpl(const NemotronOptions& o, const at::TensorOptions& t) {
  // Rotary on the first rotary_dims() features of each head: the tables are that wide (attention_inputs()).
  self_attn = register_module("self_attn", SelfAttention(SelfAttentionOptions{.hidden_size = o.hidden_size,
                                                                              .heads = o.num_attention_heads,
                                                                              .kv_heads = o.num_key_value_heads,
                                                                              .head_dim = o.head_dim,
                                                                              .qkv_bias = o.attention_bias,
                                                                              .out_bias = o.attention_bias,
                                                                              .dropout = o.attention_dropout},
                                                         t));
  mlp = register_module("mlp", NemotronMLP(o, t));
  auto norm = [&] { return Norm(o.hidden_size, NormType::kLayerNorm1P, o.norm_eps, true, t); };
  input_layernorm = register_module("input_layernorm", norm());
  post_attention_layernorm = register_module("post_attention_layernorm", norm());
}

at::Tensor NemotronDecoderLayerImpl::forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache) {
  const at::Tensor h = x + self_attn(input_layernorm(x), in, cache);
  return h + mlp(post_attention_layernorm(h));
}

NemotronForCausalLMImpl::NemotronForCausalLMImpl(const NemotronOptions& o) : HfDecoderLM(o, nemotron_keys()) {
  const at::TensorOptions t = tensor_options();
  build_backbone([&](int64_t) { return NemotronDecoderLayer(o, t); },
                 Norm(o.hidden_size, NormType::kLayerNorm1P, o.norm_eps, true, t));
  inv_freq_ = rotary_inv_freq(o.rotary_dims(), o.rope_theta);  // the first rotary_dims() features of each head
}

std::string NemotronForCausalLMImpl::describe_more() const {
  return fmt::format(", rotary on {}, {}", o_.rotary_dims(), o_.hidden_act);
}

void NemotronForCausalLMImpl::plan_layer(TensorParallelPlan& plan, const std::string& p, int64_t) const {
  plan.layer(p, {"input_layernorm", "post_attention_layernorm"},
             {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.up_proj"},
             {"self_attn.o_proj", "mlp.down_proj"});
}

}  // namespace tessera::models
