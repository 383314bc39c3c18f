// The Gemma 2 / Gemma 3 (text) families: options (recipe and config.json), modules, the (1 + weight) RMSNorm,
// sliding-window and full layers with their rope tables, soft-capping, initialisation.
#include "models/gemma/gemma.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "tessera/config/value.h"
#include "tessera/models/family_support.h"
#include "tessera/util/error.h"

namespace tessera::models {

// ---- Options --------------------------------------------------------------------------------------------------------

GemmaOptions parse_gemma_options(config::Section& s, const std::string& model_type) {
  GemmaOptions o;
  o.model_type = model_type;
  if (o.gemma3()) {  // Gemma3TextConfig's defaults where they differ from Gemma2Config's
    o.vocab_size = 262208;
    o.max_position_embeddings = 131072;
    o.rope_theta = 1e6;
    o.final_logit_softcapping.reset();
    o.attn_logit_softcapping.reset();
  }
  (void)s.get_choice("model_type", model_type, {"gemma2", "gemma3_text"});
  o.vocab_size = s.get_int("vocab_size", o.vocab_size);
  o.hidden_size = s.get_int("hidden_size", o.hidden_size);
  o.intermediate_size = s.get_int("intermediate_size", o.intermediate_size);
  o.num_hidden_layers = s.get_int("num_hidden_layers", o.num_hidden_layers);
  o.num_attention_heads = s.get_int("num_attention_heads", o.num_attention_heads);
  o.num_key_value_heads = s.get_int("num_key_value_heads", o.num_key_value_heads);
  o.head_dim = s.get_int("head_dim", o.head_dim);
  o.hidden_activation = s.get_string("hidden_activation", o.hidden_activation);
  s.check(is_hf_activation(o.hidden_activation), "hidden_activation",
          fmt::format("\"{}\" is not an activation Tessera computes ({})", o.hidden_activation,
                      fmt::join(hf_activation_names(), ", ")));
  o.max_position_embeddings = s.get_int("max_position_embeddings", o.max_position_embeddings);
  o.initializer_range = s.get_double("initializer_range", o.initializer_range);
  o.rms_norm_eps = s.get_double("rms_norm_eps", o.rms_norm_eps);
  o.tie_word_embeddings = s.get_bool("tie_word_embeddings", o.tie_word_embeddings);
  o.rope_theta = s.get_double("rope_theta", o.rope_theta);
  o.rope_local_base_freq = o.gemma3() ? s.get_double("rope_local_base_freq", o.rope_local_base_freq) : o.rope_theta;
  o.attention_bias = s.get_bool("attention_bias", o.attention_bias);
  o.attention_dropout = s.get_double("attention_dropout", o.attention_dropout);
  o.query_pre_attn_scalar = s.get_double("query_pre_attn_scalar", o.query_pre_attn_scalar);
  o.sliding_window = s.get_int("sliding_window", o.sliding_window);
  // transformers' default layer types: Gemma 2 alternates sliding and full layers, sliding first; Gemma 3 makes every
  // sliding_window_pattern-th layer full (6).
  const int64_t pattern = o.gemma3() ? s.get_int("sliding_window_pattern", 6) : 2;
  s.check(pattern > 0, "sliding_window_pattern", "must be positive");
  std::vector<std::string> types;
  for (int64_t i = 0; i < o.num_hidden_layers; ++i) {
    types.emplace_back((i + 1) % pattern != 0 ? "sliding_attention" : "full_attention");
  }
  o.layer_types = s.get_strings("layer_types", types);
  s.check(static_cast<int64_t>(o.layer_types.size()) == o.num_hidden_layers, "layer_types",
          fmt::format("has {} entries for {} layers", o.layer_types.size(), o.num_hidden_layers));
  for (const std::string& t : o.layer_types) {
    s.check(t == "sliding_attention" || t == "full_attention", "layer_types",
            fmt::format("each entry is sliding_attention or full_attention, got \"{}\"", t));
  }
  o.final_logit_softcapping = s.get_nullable_double("final_logit_softcapping", o.final_logit_softcapping);
  o.attn_logit_softcapping = s.get_nullable_double("attn_logit_softcapping", o.attn_logit_softcapping);
  s.check(!s.get_bool("use_bidirectional_attention", false), "use_bidirectional_attention",
          "true (EmbeddingGemma's bidirectional attention) is not a causal language model");
  o.rope_linear_factor = read_linear_rope_scaling(s, "Gemma");
  o.bos_token_id = s.get_nullable_int("bos_token_id", o.bos_token_id);
  o.eos_token_id = s.get_nullable_int("eos_token_id", o.eos_token_id);
  o.pad_token_id = s.get_nullable_int("pad_token_id", o.pad_token_id);
  o.init_device = s.get_choice("init_device", o.init_device, {"cpu", "meta", "cuda"});

  s.check(o.hidden_size > 0 && o.vocab_size > 0 && o.num_hidden_layers > 0 && o.intermediate_size > 0, "hidden_size",
          "hidden_size, vocab_size, num_hidden_layers and intermediate_size must be positive");
  s.check(o.head_dim > 0 && o.head_dim % 2 == 0, "head_dim", "must be positive and even (rotary embeddings)");
  s.check(o.num_key_value_heads > 0 && o.num_attention_heads % o.num_key_value_heads == 0, "num_key_value_heads",
          fmt::format("must divide num_attention_heads ({})", o.num_attention_heads));
  s.check(o.sliding_window > 0, "sliding_window", "must be positive");
  s.check(o.query_pre_attn_scalar > 0, "query_pre_attn_scalar", "must be positive");
  s.check(!o.final_logit_softcapping || *o.final_logit_softcapping > 0, "final_logit_softcapping",
          "must be positive (or null for none)");
  s.check(!o.attn_logit_softcapping || *o.attn_logit_softcapping > 0, "attn_logit_softcapping",
          "must be positive (or null for none)");
  s.check(o.attention_dropout >= 0 && o.attention_dropout < 1, "attention_dropout", "must be in [0, 1)");
  if (o.pad_token_id) {
    s.check(*o.pad_token_id >= 0 && *o.pad_token_id < o.vocab_size, "pad_token_id",
            fmt::format("must be a token id below vocab_size ({})", o.vocab_size));
  }
  return o;
}

GemmaOptions gemma_options_from_hf_config(const nlohmann::json& raw, const std::string& where) {
  // The keys Gemma2Config / Gemma3TextConfig read. Published Gemma 2 configs also carry Gemma 1's hidden_act (which
  // Gemma 2 does not read: hidden_activation decides); Gemma 3's carry _sliding_window_pattern, which transformers
  // overwrites (layer_types decides).
  static const std::set<std::string> kKeys = {"vocab_size",
                                              "hidden_size",
                                              "intermediate_size",
                                              "num_hidden_layers",
                                              "num_attention_heads",
                                              "num_key_value_heads",
                                              "head_dim",
                                              "hidden_activation",
                                              "max_position_embeddings",
                                              "initializer_range",
                                              "rms_norm_eps",
                                              "tie_word_embeddings",
                                              "rope_theta",
                                              "attention_bias",
                                              "attention_dropout",
                                              "query_pre_attn_scalar",
                                              "sliding_window",
                                              "layer_types",
                                              "final_logit_softcapping",
                                              "attn_logit_softcapping",
                                              "rope_scaling",
                                              "bos_token_id",
                                              "eos_token_id",
                                              "pad_token_id",
                                              "use_bidirectional_attention"};
  static const std::set<std::string> kGemma3Keys = {"rope_local_base_freq", "sliding_window_pattern"};
  const std::string type = raw.value("model_type", "");
  if (type != "gemma2" && type != "gemma3_text") {
    throw Error("hf", fmt::format("{}: model_type is \"{}\", expected gemma2 or gemma3_text", where, type));
  }
  std::set<std::string> keys = kKeys;
  if (type == "gemma3_text") keys.insert(kGemma3Keys.begin(), kGemma3Keys.end());
  const nlohmann::json cfg = hf_config_keys(raw, keys, where, {"hidden_act", "_sliding_window_pattern"});
  GemmaOptions o;
  read_hf_config(cfg, where, [&](config::Section& s) { o = parse_gemma_options(s, type); });
  o.init_device = "cpu";
  return o;
}

nlohmann::ordered_json gemma_hf_config(const GemmaOptions& o, at::ScalarType dtype) {
  auto optional = [](const std::optional<int64_t>& v) { return v ? nlohmann::ordered_json(*v) : nullptr; };
  auto optional_double = [](const std::optional<double>& v) { return v ? nlohmann::ordered_json(*v) : nullptr; };
  nlohmann::ordered_json j = {{"architectures", {o.gemma3() ? "Gemma3ForCausalLM" : "Gemma2ForCausalLM"}},
                              {"model_type", o.model_type},
                              {"vocab_size", o.vocab_size},
                              {"hidden_size", o.hidden_size},
                              {"intermediate_size", o.intermediate_size},
                              {"num_hidden_layers", o.num_hidden_layers},
                              {"num_attention_heads", o.num_attention_heads},
                              {"num_key_value_heads", o.num_key_value_heads},
                              {"head_dim", o.head_dim},
                              {"hidden_activation", o.hidden_activation},
                              {"max_position_embeddings", o.max_position_embeddings},
                              {"initializer_range", o.initializer_range},
                              {"rms_norm_eps", o.rms_norm_eps},
                              {"tie_word_embeddings", o.tie_word_embeddings},
                              {"rope_theta", o.rope_theta},
                              {"rope_scaling", nullptr},
                              {"attention_bias", o.attention_bias},
                              {"attention_dropout", o.attention_dropout},
                              {"query_pre_attn_scalar", o.query_pre_attn_scalar},
                              {"sliding_window", o.sliding_window},
                              {"layer_types", o.layer_types},
                              {"final_logit_softcapping", optional_double(o.final_logit_softcapping)},
                              {"attn_logit_softcapping", optional_double(o.attn_logit_softcapping)},
                              {"bos_token_id", optional(o.bos_token_id)},
                              {"eos_token_id", optional(o.eos_token_id)},
                              {"pad_token_id", optional(o.pad_token_id)},
                              {"use_cache", true},
                              {"torch_dtype", hf_torch_dtype(dtype)}};
  if (o.gemma3()) j["rope_local_base_freq"] = o.rope_local_base_freq;
  if (o.rope_linear_factor != 1.0) j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", o.rope_linear_factor}};
  return j;
}

// ---- Modules --------------------------------------------------------------------------------------------------------

GemmaAttentionImpl::GemmaAttentionImpl(const GemmaOptions& o, const at::TensorOptions& t) : o_(o) {
  const int64_t d = o.hidden_size, hd = o.head_dim, h = o.num_attention_heads, kv = o.num_key_value_heads;
  q_proj = register_module("q_proj", Linear(d, h * hd, o.attention_bias, t));
  k_proj = register_module("k_proj", Linear(d, kv * hd, o.attention_bias, t));
  v_proj = register_module("v_proj", Linear(d, kv * hd, o.attention_bias, t));
  o_proj = register_module("o_proj", Linear(h * hd, d, o.attention_bias, t));
  if (o.gemma3()) {
    q_norm = register_module("q_norm", Norm(hd, NormType::kOffsetRMSNorm, o.rms_norm_eps, false, t));
    k_norm = register_module("k_norm", Norm(hd, NormType::kOffsetRMSNorm, o.rms_norm_eps, false, t));
  }
}

at::Tensor GemmaAttentionImpl::forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache) {
  // The heads and the sequence length come from the projections' outputs (this rank's heads under tensor parallelism).
  const int64_t hd = o_.head_dim;
  at::Tensor q = q_proj(x);
  const int64_t b = q.size(0), s = q.size(1);
  q = q.view({b, s, -1, hd});
  at::Tensor k = k_proj(x).view({b, s, -1, hd});
  at::Tensor v = v_proj(x).view({b, s, -1, hd}).transpose(1, 2);
  if (q_norm) {
    q = q_norm(q);
    k = k_norm(k);
  }
  q = apply_rotary(q, in.rope_cos, in.rope_sin).transpose(1, 2);
  k = apply_rotary(k, in.rope_cos, in.rope_sin).transpose(1, 2);
  append_to_cache(cache, k, v);
  const double dropout = is_training() ? o_.attention_dropout : 0.0;
  const at::Tensor context = attend(q, k, v, in, 1.0 / std::sqrt(o_.query_pre_attn_scalar), dropout, is_training());
  return o_proj(context.transpose(1, 2).reshape({b, s, -1}));
}

GemmaMLPImpl::GemmaMLPImpl(const GemmaOptions& o, const at::TensorOptions& t) : act_(o.hidden_activation) {
  gate_proj = register_module("gate_proj", Linear(o.hidden_size, o.intermediate_size, false, t));
  up_proj = register_module("up_proj", Linear(o.hidden_size, o.intermediate_size, false, t));
  down_proj = register_module("down_proj", Linear(o.intermediate_size, o.hidden_size, false, t));
}

at::Tensor GemmaMLPImpl::forward(const at::Tensor& x) {
  return down_proj(hf_activation(act_, gate_proj(x)) * up_proj(x));
}

GemmaDecoderLayerImpl::GemmaDecoderLayerImpl(const GemmaOptions& o, int64_t layer, const at::TensorOptions& t)
    : sliding_(o.sliding(layer)) {
  self_attn = register_module("self_attn", GemmaAttention(o, t));
  mlp = register_module("mlp", GemmaMLP(o, t));
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
