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

Olmo2Options parse_olmo2_options(config::Section& s) {
  Olmo2Options o;
  olmo2_keys().read(s, o);
  return o;
}

Olmo2Options olmo2_options_from_hf_config(const nlohmann::json& raw, const std::string& where) {
  return olmo2_keys().from_hf(raw, where, &parse_olmo2_options);
}

nlohmann::ordered_json olmo2_hf_config(const Olmo2Options& o, at::ScalarType dtype) {
  return olmo2_keys().hf_config(o, o.model_type, dtype);
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

Olmo2ModelImpl::Olmo2ModelImpl(const Olmo2Options& o, const at::TensorOptions& t) {
  embed_tokens = register_module("embed_tokens", Embedding(o.vocab_size, o.hidden_size, t));
  if (o.pad_token_id) embed_tokens->padding_idx = *o.pad_token_id;  // nn.Embedding(..., padding_idx)
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.num_hidden_layers; ++i) layers->push_back(Olmo2DecoderLayer(o, i, t));
  norm = register_module("norm", Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t));
}

Olmo2ForCausalLMImpl::Olmo2ForCausalLMImpl(const Olmo2Options& o)
    : DecoderLM("model.layers."),
      o_(o),
      inv_freq_(rotary_inv_freq(o.head_dim(), o.rope_theta) / o.rope_factor),
      inv_freq_unscaled_(rotary_inv_freq(o.head_dim(), o.rope_theta)) {
  const at::TensorOptions t = at::TensorOptions().dtype(at::kFloat).device(at::Device(o.init_device));
  model = register_module("model", Olmo2Model(o, t));
  if (!o.tie_word_embeddings) lm_head = register_module("lm_head", Linear(o.hidden_size, o.vocab_size, false, t));
}

GlobalLocalInputs Olmo2ForCausalLMImpl::attention_inputs(const DecoderCall& call) {
  GlobalLocalInputs in;
  in.global = causal_attention_inputs(call.ids, call.fo, call.past, call.key_mask, call.dtype);
  set_rope_tables(in.global, call.positions, inv_freq_);  // in float32, as transformers computes them
  if (o_.model_type == "olmo3") {
    in.local = causal_attention_inputs(call.ids, call.fo, call.past, call.key_mask, call.dtype, o_.sliding_window);
    set_rope_tables(in.local, call.positions, inv_freq_unscaled_);
  }
  return in;
}

double Olmo2ForCausalLMImpl::flops_per_token(int64_t seq_len) const {
  int64_t n = num_params();
  if (!o_.tie_word_embeddings) n -= o_.vocab_size * o_.hidden_size;
  double attention = 0;
  for (int64_t i = 0; i < o_.num_hidden_layers; ++i) {
    const int64_t keys = o_.sliding(i) ? std::min(seq_len, o_.sliding_window) : seq_len;
    attention += 12.0 * static_cast<double>(o_.hidden_size) * static_cast<double>(keys);
  }
  return 6.0 * static_cast<double>(n) + attention;
}

void Olmo2ForCausalLMImpl::init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select) {
  init_like_transformers(*this, seed, o_.initializer_range, select, std::nullopt);  // zeroes the padding_idx row
}

std::shared_ptr<CausalLM> Olmo2ForCausalLMImpl::rebuild(const std::string& device, std::optional<uint64_t> seed) const {
  Olmo2Options o = o_;
  o.init_device = device;
  return seed ? build_olmo2(o, *seed).ptr() : Olmo2ForCausalLM(o).ptr();
}

std::string Olmo2ForCausalLMImpl::describe() const {
  return fmt::format(
      "olmo2: hidden {}, heads {} (kv {}, head_dim {}), layers {}, intermediate {}, vocab {}, rope theta "
      "{}, norms after attention and MLP",
      o_.hidden_size, o_.num_attention_heads, o_.num_key_value_heads, o_.head_dim(), o_.num_hidden_layers,
      o_.intermediate_size, o_.vocab_size, o_.rope_theta);
}

std::optional<std::string> Olmo2ForCausalLMImpl::tied_embedding_name() const {
  if (!o_.tie_word_embeddings) return std::nullopt;
  return "model.embed_tokens.weight";
}

Olmo2ForCausalLM build_olmo2(const Olmo2Options& options, uint64_t seed) {
  return build_initialised<Olmo2ForCausalLM>(options, seed);
}

TensorParallelPlan Olmo2ForCausalLMImpl::tensor_parallel_plan(int64_t degree) const {
  check_tensor_parallel_split(degree, "OLMo 2", o_.num_attention_heads, o_.num_key_value_heads, o_.intermediate_size);
  TensorParallelPlan plan;
  plan.vocabulary(o_.vocab_size, degree, lm_head ? "lm_head" : "", "model.embed_tokens");
  for (int64_t i = 0; i < o_.num_hidden_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    plan.layer(p, {"post_attention_layernorm", "post_feedforward_layernorm"},
               {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"},
               {"self_attn.o_proj", "mlp.down_proj"});
    plan.feature_norm(p + "self_attn.q_norm");
    plan.feature_norm(p + "self_attn.k_norm");
  }
  return plan;
}

}  // namespace tessera::models
