// The OLMo 2 family: options (recipe and config.json), modules with norms after attention and MLP and q/k norms over
// the whole projection, initialisation, the tensor-parallel plan.
#include "models/olmo2/olmo2.h"

#include <fmt/format.h>

#include <algorithm>

#include "tessera/config/value.h"
#include "tessera/models/family_keys.h"
#include "tessera/models/family_support.h"

namespace tessera::models {

// ---- Options --------------------------------------------------------------------------------------------------------

// Olmo2Config's keys; Olmo3Config's add sliding_window and layer_types.
const FamilyKeys<Olmo2Options>& olmo2_keys() {
  using O = Olmo2Options;
  static const std::vector<std::string> olmo3 = {"olmo3"};
  static const FamilyKeys<O> keys =
      FamilyKeys<O>({"olmo2", "olmo3"},
                    [](const std::string& type) { return type == "olmo3" ? "Olmo3ForCausalLM" : "Olmo2ForCausalLM"; })
          .defaults([](const std::string& type, O& o) { o.model_type = type; })
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
          .token_ids()
          .pad_token_below_vocab()
          .field("tie_word_embeddings", &O::tie_word_embeddings)
          .field("rope_theta", &O::rope_theta, positive_real())
          .linear_rope_scaling(&O::rope_factor, "OLMo 2")
          .field("attention_bias", &O::attention_bias)
          .field("attention_dropout", &O::attention_dropout, probability())
          .field("rms_norm_eps", &O::rms_norm_eps, positive_real())
          .field("sliding_window", &O::sliding_window, positive(), olmo3)
          .field("layer_types", &O::layer_types, {}, olmo3)
          .custom(
              "layer_types",
              [](config::Section& s, O& o) {
                if (o.layer_types.empty()) {
                  for (int64_t i = 0; i < o.num_hidden_layers; ++i)
                    o.layer_types.emplace_back((i + 1) % 4 != 0 ? "sliding_attention" : "full_attention");
                }
                check_layer_types(s, o.layer_types, o.num_hidden_layers);
              },
              nullptr, olmo3);
  return keys;
}

// ---- Modules --------------------------------------------------------------------------------------------------------

Olmo2DecoderLayerImpl::Olmo2DecoderLayerImpl(const Olmo2Options& o, int64_t layer, const at::TensorOptions& t)
    : sliding_(o.sliding(layer)) {
  self_attn = register_module("self_attn", SelfAttention(SelfAttentionOptions{.hidden_size = o.hidden_size,
                                                                              .heads = o.num_attention_heads,
                                                                              .kv_heads = o.num_key_value_heads,
                                                                              .qkv_bias = o.attention_bias,
                                                                              .out_bias = o.attention_bias,
                                                                              .qk_norm = QKNorm::kWhole,
                                                                              .qk_norm_eps = o.rms_norm_eps,
                                                                              .dropout = o.attention_dropout},
                                                         t));
  mlp = register_module("mlp", GatedMLP(o.hidden_size, o.intermediate_size, o.hidden_act, false, t));
  auto norm = [&] { return Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t); };
  post_attention_layernorm = register_module("post_attention_layernorm", norm());
  post_feedforward_layernorm = register_module("post_feedforward_layernorm", norm());
}

at::Tensor Olmo2DecoderLayerImpl::forward(const at::Tensor& x, const GlobalLocalInputs& in, LayerCache* cache) {
  const at::Tensor h = x + post_attention_layernorm(self_attn(x, sliding_ ? in.local : in.global, cache));
  return h + post_feedforward_layernorm(mlp(h));
}

Olmo2ForCausalLMImpl::Olmo2ForCausalLMImpl(const Olmo2Options& o) : HfDecoderLM(o, olmo2_keys()) {
  const at::TensorOptions t = tensor_options();
  build_backbone([&](int64_t i) { return Olmo2DecoderLayer(o, i, t); },
                 Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t));
  inv_freq_ = rotary_inv_freq(o.head_dim(), o.rope_theta) / o.rope_factor;
  if (o.model_type == "olmo3") {  // the sliding layers' tables ignore rope_scaling
    local_inv_freq_ = rotary_inv_freq(o.head_dim(), o.rope_theta);
    window_ = o.sliding_window;
  }
}

std::string Olmo2ForCausalLMImpl::describe_more() const {
  return fmt::format(", rope theta {}, norms after attention and MLP", o_.rope_theta);
}

void Olmo2ForCausalLMImpl::plan_layer(TensorParallelPlan& plan, const std::string& p, int64_t) const {
  plan.layer(p, {"post_attention_layernorm", "post_feedforward_layernorm"},
             {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"},
             {"self_attn.o_proj", "mlp.down_proj"});
  plan.feature_norm(p + "self_attn.q_norm");
  plan.feature_norm(p + "self_attn.k_norm");
}

}  // namespace tessera::models
