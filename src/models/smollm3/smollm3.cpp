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

SmolLM3Options parse_smollm3_options(config::Section& s) {
  SmolLM3Options o;
  smollm3_keys().read(s, o);
  return o;
}

SmolLM3Options smollm3_options_from_hf_config(const nlohmann::json& raw, const std::string& where) {
  return smollm3_keys().from_hf(raw, where, &parse_smollm3_options);
}

nlohmann::ordered_json smollm3_hf_config(const SmolLM3Options& o, at::ScalarType dtype) {
  return smollm3_keys().hf_config(o, "smollm3", dtype);
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

SmolLM3ModelImpl::SmolLM3ModelImpl(const SmolLM3Options& o, const at::TensorOptions& t) {
  embed_tokens = register_module("embed_tokens", Embedding(o.vocab_size, o.hidden_size, t));
  if (o.pad_token_id) embed_tokens->padding_idx = *o.pad_token_id;  // nn.Embedding(..., padding_idx)
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.num_hidden_layers; ++i) layers->push_back(SmolLM3DecoderLayer(o, i, t));
  norm = register_module("norm", Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t));
}

SmolLM3ForCausalLMImpl::SmolLM3ForCausalLMImpl(const SmolLM3Options& o)
    : DecoderLM("model.layers."), o_(o), inv_freq_(rotary_inv_freq(o.head_dim(), o.rope_theta) / o.rope_factor) {
  const at::TensorOptions t = at::TensorOptions().dtype(at::kFloat).device(at::Device(o.init_device));
  model = register_module("model", SmolLM3Model(o, t));
  if (!o.tie_word_embeddings) lm_head = register_module("lm_head", Linear(o.hidden_size, o.vocab_size, false, t));
}

GlobalLocalInputs SmolLM3ForCausalLMImpl::attention_inputs(const DecoderCall& call) {
  GlobalLocalInputs in{
      causal_attention_inputs(call.ids, call.fo, call.past, call.key_mask, call.dtype),
      causal_attention_inputs(call.ids, call.fo, call.past, call.key_mask, call.dtype, o_.sliding_window.value_or(0))};
  set_rope_tables(in.global, call.positions, inv_freq_);  // in float32, as transformers computes them
  set_rope_tables(in.local, call.positions, inv_freq_);
  return in;
}

double SmolLM3ForCausalLMImpl::flops_per_token(int64_t seq_len) const {
  int64_t n = num_params();
  if (!o_.tie_word_embeddings) n -= o_.vocab_size * o_.hidden_size;
  double attention = 0;
  for (int64_t i = 0; i < o_.num_hidden_layers; ++i) {
    const int64_t keys = o_.sliding(i) ? std::min(seq_len, *o_.sliding_window) : seq_len;
    attention += 12.0 * static_cast<double>(o_.hidden_size) * static_cast<double>(keys);
  }
  return 6.0 * static_cast<double>(n) + attention;
}

void SmolLM3ForCausalLMImpl::init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select) {
  init_like_transformers(*this, seed, o_.initializer_range, select, std::nullopt);  // zeroes the padding_idx row
}

std::shared_ptr<CausalLM> SmolLM3ForCausalLMImpl::rebuild(const std::string& device,
                                                          std::optional<uint64_t> seed) const {
  SmolLM3Options o = o_;
  o.init_device = device;
  return seed ? build_smollm3(o, *seed).ptr() : SmolLM3ForCausalLM(o).ptr();
}

std::string SmolLM3ForCausalLMImpl::describe() const {
  const auto nope = std::count(o_.no_rope_layers.begin(), o_.no_rope_layers.end(), 0);
  int64_t sliding = 0;
  for (int64_t i = 0; i < o_.num_hidden_layers; ++i) sliding += o_.sliding(i) ? 1 : 0;
  return fmt::format(
      "smollm3: hidden {}, heads {} (kv {}, head_dim {}), layers {} ({} without rotary, {} windowed), "
      "intermediate {}, vocab {}, rope theta {}",
      o_.hidden_size, o_.num_attention_heads, o_.num_key_value_heads, o_.head_dim(), o_.num_hidden_layers, nope,
      sliding, o_.intermediate_size, o_.vocab_size, o_.rope_theta);
}

std::optional<std::string> SmolLM3ForCausalLMImpl::tied_embedding_name() const {
  if (!o_.tie_word_embeddings) return std::nullopt;
  return "model.embed_tokens.weight";
}

SmolLM3ForCausalLM build_smollm3(const SmolLM3Options& options, uint64_t seed) {
  return build_initialised<SmolLM3ForCausalLM>(options, seed);
}

TensorParallelPlan SmolLM3ForCausalLMImpl::tensor_parallel_plan(int64_t degree) const {
  check_tensor_parallel_split(degree, "SmolLM3", o_.num_attention_heads, o_.num_key_value_heads, o_.intermediate_size);
  TensorParallelPlan plan;
  plan.vocabulary(o_.vocab_size, degree, lm_head ? "lm_head" : "", "model.embed_tokens");
  for (int64_t i = 0; i < o_.num_hidden_layers; ++i) {
    plan.layer(fmt::format("model.layers.{}.", i), {"input_layernorm", "post_attention_layernorm"},
               {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"},
               {"self_attn.o_proj", "mlp.down_proj"});
  }
  return plan;
}

}  // namespace tessera::models
