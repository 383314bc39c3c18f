// The Gemma 2 / Gemma 3 (text) families: options (recipe and config.json), modules, the (1 + weight) RMSNorm,
// sliding-window and full layers with their rope tables, soft-capping, initialisation.
#include "models/gemma/gemma.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "tessera/config/value.h"
#include "tessera/models/family_keys.h"
#include "tessera/models/family_support.h"
#include "tessera/util/error.h"

namespace tessera::models {

// ---- Options --------------------------------------------------------------------------------------------------------

namespace {

// transformers' default layer types: every pattern-th layer full, the others sliding (Gemma 2: 2, sliding first).
std::vector<std::string> layer_types_of(int64_t layers, int64_t pattern) {
  std::vector<std::string> types;
  for (int64_t i = 0; i < layers; ++i)
    types.emplace_back((i + 1) % pattern != 0 ? "sliding_attention" : "full_attention");
  return types;
}

}  // namespace

// Gemma2Config's and Gemma3TextConfig's keys. transformers' Gemma reads hidden_activation (hidden_act is its older
// key, which it ignores) and Gemma 3 configs may store _sliding_window_pattern, which it derives layer_types from
// only when layer_types is absent.
const FamilyKeys<GemmaOptions>& gemma_keys() {
  using O = GemmaOptions;
  const FamilyKeys<O>::Types gemma3 = {"gemma3_text"};
  static const FamilyKeys<O> keys =
      FamilyKeys<O>(
          {"gemma2", "gemma3_text"},
          [](const std::string& type) { return type == "gemma3_text" ? "Gemma3ForCausalLM" : "Gemma2ForCausalLM"; })
          .defaults([](const std::string& type, O& o) {
            o.model_type = type;
            if (o.gemma3()) {  // Gemma3TextConfig's defaults where they differ from Gemma2Config's
              o.vocab_size = 262208;
              o.max_position_embeddings = 131072;
              o.rope_theta = 1e6;
              o.final_logit_softcapping.reset();
              o.attn_logit_softcapping.reset();
            }
          })
          .field("vocab_size", &O::vocab_size, positive())
          .field("hidden_size", &O::hidden_size, positive())
          .field("intermediate_size", &O::intermediate_size, positive())
          .field("num_hidden_layers", &O::num_hidden_layers, positive())
          .field("num_attention_heads", &O::num_attention_heads, positive())
          .field("num_key_value_heads", &O::num_key_value_heads, positive())
          .divides("num_key_value_heads", &O::num_key_value_heads, "num_attention_heads", &O::num_attention_heads)
          .field("head_dim", &O::head_dim, KeyCheck<int64_t>([](const int64_t& d) {
                   return d > 0 && d % 2 == 0 ? "" : std::string("must be positive and even (rotary embeddings)");
                 }))
          .field("hidden_activation", &O::hidden_activation, hf_activation_check())
          .field("max_position_embeddings", &O::max_position_embeddings, positive())
          .field("initializer_range", &O::initializer_range)
          .field("rms_norm_eps", &O::rms_norm_eps)
          .field("tie_word_embeddings", &O::tie_word_embeddings)
          .field("rope_theta", &O::rope_theta)
          .linear_rope_scaling(&O::rope_linear_factor, "Gemma")
          .field("rope_local_base_freq", &O::rope_local_base_freq, {}, gemma3)
          .field("attention_bias", &O::attention_bias)
          .field("attention_dropout", &O::attention_dropout, probability())
          .whole_number("query_pre_attn_scalar", &O::query_pre_attn_scalar, positive_real())
          .field("sliding_window", &O::sliding_window, positive())
          .custom(
              "sliding_window_pattern",
              [](config::Section& s, O& o) {
                const int64_t pattern = s.get_int("sliding_window_pattern", 6);
                s.check(pattern > 0, "sliding_window_pattern", "must be positive");
                o.layer_types = layer_types_of(o.num_hidden_layers, pattern);
              },
              nullptr, gemma3)
          .custom(
              "layer_types",
              [](config::Section& s, O& o) {
                if (o.layer_types.empty()) o.layer_types = layer_types_of(o.num_hidden_layers, 2);
                o.layer_types = s.get_strings("layer_types", o.layer_types);
                check_layer_types(s, o.layer_types, o.num_hidden_layers);
              },
              [](const O& o) { return nlohmann::ordered_json(o.layer_types); })
          .field("final_logit_softcapping", &O::final_logit_softcapping, positive_or_none<double>())
          .field("attn_logit_softcapping", &O::attn_logit_softcapping, positive_or_none<double>())
          .fixed("use_bidirectional_attention", false,
                 "EmbeddingGemma's bidirectional attention is not a causal language model", gemma3)
          .token_ids()
          .pad_token_below_vocab()
          .finally([](config::Section&, O& o) {
            if (!o.gemma3()) o.rope_local_base_freq = o.rope_theta;  // Gemma 2's sliding layers rotate as the full
          })
          .hf_accepts({"hidden_act", "_sliding_window_pattern"});
  return keys;
}

// ---- Modules --------------------------------------------------------------------------------------------------------

GemmaDecoderLayerImpl::GemmaDecoderLayerImpl(const GemmaOptions& o, int64_t layer, const at::TensorOptions& t)
    : sliding_(o.sliding(layer)) {
  self_attn = register_module(
      "self_attn", SelfAttention(SelfAttentionOptions{.hidden_size = o.hidden_size,
                                                      .heads = o.num_attention_heads,
                                                      .kv_heads = o.num_key_value_heads,
                                                      .head_dim = o.head_dim,
                                                      .qkv_bias = o.attention_bias,
                                                      .out_bias = o.attention_bias,
                                                      .qk_norm = o.gemma3() ? QKNorm::kPerHead : QKNorm::kNone,
                                                      .qk_norm_type = NormType::kOffsetRMSNorm,
                                                      .qk_norm_eps = o.rms_norm_eps,
                                                      .scale = 1.0 / std::sqrt(o.query_pre_attn_scalar),
                                                      .dropout = o.attention_dropout},
                                 t));
  mlp = register_module("mlp", GatedMLP(o.hidden_size, o.intermediate_size, o.hidden_activation, false, t));
  input_layernorm =
      register_module("input_layernorm", Norm(o.hidden_size, NormType::kOffsetRMSNorm, o.rms_norm_eps, false, t));
  post_attention_layernorm = register_module("post_attention_layernorm",
                                             Norm(o.hidden_size, NormType::kOffsetRMSNorm, o.rms_norm_eps, false, t));
  pre_feedforward_layernorm = register_module("pre_feedforward_layernorm",
                                              Norm(o.hidden_size, NormType::kOffsetRMSNorm, o.rms_norm_eps, false, t));
  post_feedforward_layernorm = register_module("post_feedforward_layernorm",
                                               Norm(o.hidden_size, NormType::kOffsetRMSNorm, o.rms_norm_eps, false, t));
}

at::Tensor GemmaDecoderLayerImpl::forward(const at::Tensor& x, const GlobalLocalInputs& in, LayerCache* cache) {
  const at::Tensor h =
      x + post_attention_layernorm(self_attn(input_layernorm(x), sliding_ ? in.local : in.global, cache));
  return h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)));
}

GemmaForCausalLMImpl::GemmaForCausalLMImpl(const GemmaOptions& o) : HfDecoderLM(o, gemma_keys()) {
  const at::TensorOptions t = tensor_options();
  build_backbone([&](int64_t i) { return GemmaDecoderLayer(o, i, t); },
                 Norm(o.hidden_size, NormType::kOffsetRMSNorm, o.rms_norm_eps, false, t));
  inv_freq_ = rotary_inv_freq(o.head_dim, o.rope_theta) / o.rope_linear_factor;
  local_inv_freq_ = rotary_inv_freq(o.head_dim, o.rope_local_base_freq);
  window_ = o.sliding_window;
}

at::Tensor GemmaForCausalLMImpl::embed(const at::Tensor& ids, const DecoderCall& /*call*/) {
  // transformers multiplies by sqrt(hidden_size) as a tensor of the hidden states' dtype.
  const at::Tensor x = model->embed_tokens(ids);
  return x * at::scalar_tensor(std::sqrt(static_cast<double>(o_.hidden_size)), x.options());
}

GlobalLocalInputs GemmaForCausalLMImpl::attention_inputs(const DecoderCall& call) {
  GlobalLocalInputs in = HfDecoderLM::attention_inputs(call);
  in.global.softcap = in.local.softcap = o_.attn_logit_softcapping.value_or(0.0);
  return in;
}

at::Tensor GemmaForCausalLMImpl::head(const at::Tensor& h) {
  at::Tensor logits = head_logits(model->norm(h), lm_head);
  if (o_.final_logit_softcapping) {
    logits = at::tanh(logits / *o_.final_logit_softcapping) * *o_.final_logit_softcapping;
  }
  return logits;
}

std::string GemmaForCausalLMImpl::describe_more() const {
  const auto sliding = std::count(o_.layer_types.begin(), o_.layer_types.end(), "sliding_attention");
  return fmt::format(
      ", {} sliding layers, window {}{}{}", sliding, o_.sliding_window,
      o_.attn_logit_softcapping ? fmt::format(", attention soft-cap {}", *o_.attn_logit_softcapping) : "",
      o_.final_logit_softcapping ? fmt::format(", logit soft-cap {}", *o_.final_logit_softcapping) : "");
}

void GemmaForCausalLMImpl::plan_layer(TensorParallelPlan& plan, const std::string& p, int64_t i) const {
  plan.layer(p,
             {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"},
             {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"},
             {"self_attn.o_proj", "mlp.down_proj"});
  if (model->layers->ptr(i)->as<GemmaDecoderLayerImpl>()->self_attn->q_norm) {
    plan.head_norm(p + "self_attn.q_norm");
    plan.head_norm(p + "self_attn.k_norm");
  }
}

}  // namespace tessera::models
