// The SmolLM3 family: options (recipe and config.json, with the NoPE and sliding-window layer lists resolved as
// SmolLM3Config resolves them), a Llama-shaped decoder whose NoPE layers drop the rotary tables, initialisation, the
// tensor-parallel plan.
#include "models/smollm3/smollm3.h"

#include <fmt/format.h>

#include <algorithm>

#include "tessera/config/value.h"
#include "tessera/models/family_keys.h"
#include "tessera/models/family_support.h"

namespace tessera::models {

// ---- Options --------------------------------------------------------------------------------------------------------

// SmolLM3Config's keys. no_rope_layers and layer_types are written resolved; their resolution rows follow them.
const FamilyKeys<SmolLM3Options>& smollm3_keys() {
  using O = SmolLM3Options;
  static const FamilyKeys<O> keys =
      FamilyKeys<O>({"smollm3"}, [](const std::string&) { return "SmolLM3ForCausalLM"; })
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
          .linear_rope_scaling(&O::rope_factor, "SmolLM3")
          .field("use_sliding_window", &O::use_sliding_window)
          .field("sliding_window", &O::sliding_window, positive_or_none<int64_t>())
          .field("no_rope_layer_interval", &O::no_rope_layer_interval, positive())
          .field("no_rope_layers", &O::no_rope_layers)
          .custom(
              "no_rope_layers",
              [](config::Section& s, O& o) {
                if (o.no_rope_layers.empty()) {
                  for (int64_t i = 0; i < o.num_hidden_layers; ++i)
                    o.no_rope_layers.push_back((i + 1) % o.no_rope_layer_interval != 0 ? 1 : 0);
                }
                s.check(static_cast<int64_t>(o.no_rope_layers.size()) == o.num_hidden_layers, "no_rope_layers",
                        fmt::format("has {} entries for {} layers", o.no_rope_layers.size(), o.num_hidden_layers));
                for (const int64_t v : o.no_rope_layers) {
                  s.check(v == 0 || v == 1, "no_rope_layers",
                          fmt::format("each entry is 1 (rotary) or 0 (no position embedding), got {}", v));
                }
              },
              nullptr)
          .field("layer_types", &O::layer_types)
          .custom(
              "layer_types",
              [](config::Section& s, O& o) {
                if (o.layer_types.empty()) {
                  for (int64_t i = 0; i < o.num_hidden_layers; ++i) {
                    const bool windowed = o.use_sliding_window && o.sliding_window && !o.rotary(i);
                    o.layer_types.emplace_back(windowed ? "sliding_attention" : "full_attention");
                  }
                }
                check_layer_types(s, o.layer_types, o.num_hidden_layers);
                for (const std::string& t : o.layer_types) {
                  // transformers' attention then runs unwindowed while its mask is windowed (when sliding_window is
                  // set) or cannot be built (when it is not).
                  s.check(t == "full_attention" || (o.use_sliding_window && o.sliding_window), "layer_types",
                          "names sliding_attention layers without use_sliding_window and a sliding_window, which "
                          "transformers' SmolLM3 does not compute consistently");
                }
              },
              nullptr)
          .field("attention_bias", &O::attention_bias)
          .field("attention_dropout", &O::attention_dropout, probability())
          .field("mlp_bias", &O::mlp_bias);
  return keys;
}

// ---- Modules --------------------------------------------------------------------------------------------------------

SmolLM3DecoderLayerImpl::SmolLM3DecoderLayerImpl(const SmolLM3Options& o, int64_t layer, const at::TensorOptions& t)
    : rotary_(o.rotary(layer)), sliding_(o.sliding(layer)) {
  self_attn = register_module("self_attn", SelfAttention(SelfAttentionOptions{.hidden_size = o.hidden_size,
                                                                              .heads = o.num_attention_heads,
                                                                              .kv_heads = o.num_key_value_heads,
                                                                              .qkv_bias = o.attention_bias,
                                                                              .out_bias = o.attention_bias,
                                                                              .dropout = o.attention_dropout},
                                                         t));
  mlp = register_module("mlp", GatedMLP(o.hidden_size, o.intermediate_size, o.hidden_act, o.mlp_bias, t));
  auto norm = [&] { return Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t); };
  input_layernorm = register_module("input_layernorm", norm());
  post_attention_layernorm = register_module("post_attention_layernorm", norm());
}

at::Tensor SmolLM3DecoderLayerImpl::forward(const at::Tensor& x, const GlobalLocalInputs& in, LayerCache* cache) {
  AttentionInputs a = sliding_ ? in.local : in.global;
  if (!rotary_) a.rope_cos = a.rope_sin = at::Tensor();  // NoPE
  const at::Tensor h = x + self_attn(input_layernorm(x), a, cache);
  return h + mlp(post_attention_layernorm(h));
}

SmolLM3ForCausalLMImpl::SmolLM3ForCausalLMImpl(const SmolLM3Options& o) : HfDecoderLM(o, smollm3_keys()) {
  const at::TensorOptions t = tensor_options();
  build_backbone([&](int64_t i) { return SmolLM3DecoderLayer(o, i, t); },
                 Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t));
  inv_freq_ = rotary_inv_freq(o.head_dim(), o.rope_theta) / o.rope_factor;
  window_ = o.sliding_window.value_or(0);
}

std::string SmolLM3ForCausalLMImpl::describe_more() const {
  const auto nope = std::count(o_.no_rope_layers.begin(), o_.no_rope_layers.end(), 0);
  int64_t sliding = 0;
  for (int64_t i = 0; i < o_.num_hidden_layers; ++i) sliding += o_.sliding(i) ? 1 : 0;
  return fmt::format(", {} layers without rotary, {} windowed, rope theta {}", nope, sliding, o_.rope_theta);
}

}  // namespace tessera::models
