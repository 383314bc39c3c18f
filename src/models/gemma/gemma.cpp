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
          .field("query_pre_attn_scalar", &O::query_pre_attn_scalar, positive_real())
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
          .pad_token_below_vocab();
  return keys;
}

GemmaOptions parse_gemma_options(config::Section& s, const std::string& model_type) {
  GemmaOptions o;
  gemma_keys().read(s, o, model_type);
  if (!o.gemma3()) o.rope_local_base_freq = o.rope_theta;  // Gemma 2's sliding layers rotate as the full ones
  return o;
}

GemmaOptions gemma_options_from_hf_config(const nlohmann::json& raw, const std::string& where) {
  return gemma_keys().from_hf(raw, where, [](config::Section& s) { return parse_gemma_options(s, ""); },
                              {"hidden_act", "_sliding_window_pattern"});
}

nlohmann::ordered_json gemma_hf_config(const GemmaOptions& o, at::ScalarType dtype) {
  return gemma_keys().hf_config(o, o.model_type, dtype);
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

GemmaModelImpl::GemmaModelImpl(const GemmaOptions& o, const at::TensorOptions& t) {
  embed_tokens = register_module("embed_tokens", Embedding(o.vocab_size, o.hidden_size, t));
  if (o.pad_token_id) embed_tokens->padding_idx = *o.pad_token_id;  // nn.Embedding(..., padding_idx)
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.num_hidden_layers; ++i) layers->push_back(GemmaDecoderLayer(o, i, t));
  norm = register_module("norm", Norm(o.hidden_size, NormType::kOffsetRMSNorm, o.rms_norm_eps, false, t));
}

GemmaForCausalLMImpl::GemmaForCausalLMImpl(const GemmaOptions& o) : DecoderLM("model.layers."), o_(o) {
  inv_freq_global_ = rotary_inv_freq(o.head_dim, o.rope_theta) / o.rope_linear_factor;
  inv_freq_local_ = rotary_inv_freq(o.head_dim, o.rope_local_base_freq);
  const at::TensorOptions t = at::TensorOptions().dtype(at::kFloat).device(at::Device(o.init_device));
  model = register_module("model", GemmaModel(o, t));
  if (!o.tie_word_embeddings) lm_head = register_module("lm_head", Linear(o.hidden_size, o.vocab_size, false, t));
}

at::Tensor GemmaForCausalLMImpl::embed(const at::Tensor& ids, const DecoderCall& /*call*/) {
  // transformers multiplies by sqrt(hidden_size) as a tensor of the hidden states' dtype.
  const at::Tensor x = model->embed_tokens(ids);
  return x * at::scalar_tensor(std::sqrt(static_cast<double>(o_.hidden_size)), x.options());
}

GlobalLocalInputs GemmaForCausalLMImpl::attention_inputs(const DecoderCall& call) {
  GlobalLocalInputs in{
      causal_attention_inputs(call.ids, call.fo, call.past, call.key_mask, call.dtype),
      causal_attention_inputs(call.ids, call.fo, call.past, call.key_mask, call.dtype, o_.sliding_window)};
  set_rope_tables(in.global, call.positions, inv_freq_global_);
  set_rope_tables(in.local, call.positions, inv_freq_local_);
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

double GemmaForCausalLMImpl::flops_per_token(int64_t seq_len) const {
  int64_t n = num_params();
  if (!o_.tie_word_embeddings) n -= o_.vocab_size * o_.hidden_size;
  double attention = 0;
  for (int64_t i = 0; i < o_.num_hidden_layers; ++i) {
    const int64_t keys = o_.sliding(i) ? std::min(seq_len, o_.sliding_window) : seq_len;
    attention += 12.0 * static_cast<double>(o_.num_attention_heads * o_.head_dim) * static_cast<double>(keys);
  }
  return 6.0 * static_cast<double>(n) + attention;
}

void GemmaForCausalLMImpl::init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select) {
  init_like_transformers(*this, seed, o_.initializer_range, select, std::nullopt);  // norms' weights 0
}

std::shared_ptr<CausalLM> GemmaForCausalLMImpl::rebuild(const std::string& device, std::optional<uint64_t> seed) const {
  GemmaOptions o = o_;
  o.init_device = device;
  return seed ? build_gemma(o, *seed).ptr() : GemmaForCausalLM(o).ptr();
}

std::string GemmaForCausalLMImpl::describe() const {
  const auto sliding = std::count(o_.layer_types.begin(), o_.layer_types.end(), "sliding_attention");
  return fmt::format(
      "{}: hidden {}, heads {} (kv {}, head_dim {}), layers {} ({} sliding, window {}), intermediate {}, vocab {}{}{}",
      o_.model_type, o_.hidden_size, o_.num_attention_heads, o_.num_key_value_heads, o_.head_dim, o_.num_hidden_layers,
      sliding, o_.sliding_window, o_.intermediate_size, o_.vocab_size,
      o_.attn_logit_softcapping ? fmt::format(", attention soft-cap {}", *o_.attn_logit_softcapping) : "",
      o_.final_logit_softcapping ? fmt::format(", logit soft-cap {}", *o_.final_logit_softcapping) : "");
}

std::optional<std::string> GemmaForCausalLMImpl::tied_embedding_name() const {
  if (!o_.tie_word_embeddings) return std::nullopt;
  return "model.embed_tokens.weight";
}

GemmaForCausalLM build_gemma(const GemmaOptions& options, uint64_t seed) {
  return build_initialised<GemmaForCausalLM>(options, seed);
}

TensorParallelPlan GemmaForCausalLMImpl::tensor_parallel_plan(int64_t degree) const {
  check_tensor_parallel_split(degree, "Gemma", o_.num_attention_heads, o_.num_key_value_heads, o_.intermediate_size);
  TensorParallelPlan plan;
  plan.vocabulary(o_.vocab_size, degree, lm_head ? "lm_head" : "", "model.embed_tokens");
  for (int64_t i = 0; i < o_.num_hidden_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    plan.layer(
        p, {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"},
        {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"},
        {"self_attn.o_proj", "mlp.down_proj"});
    if (model->layers->ptr(i)->as<GemmaDecoderLayerImpl>()->self_attn->q_norm) {
      plan.head_norm(p + "self_attn.q_norm");
      plan.head_norm(p + "self_attn.k_norm");
    }
  }
  return plan;
}

}  // namespace tessera::models
