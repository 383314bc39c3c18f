// The Llama family: options (recipe and config.json), modules, masks and rotary tables, initialisation.
#include "models/llama/llama.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "tessera/config/value.h"
#include "tessera/models/blocks/layers.h"
#include "tessera/models/family_support.h"
#include "tessera/util/error.h"

namespace tessera::models {
// ---- Options --------------------------------------------------------------------------------------------------------

LlamaOptions parse_llama_options(config::Section& s) {
  LlamaOptions o;
  o.model_type =
      s.get_choice("model_type", o.model_type, {"llama", "mistral", "qwen2", "mixtral", "qwen2_moe", "qwen3_moe"});
  o.qk_norm = o.model_type == "qwen3_moe";
  if (o.model_type == "mixtral") {  // MixtralConfig's defaults where they differ from LlamaConfig's
    o.rms_norm_eps = 1e-5;
    o.rope_theta = 1e6;
  }
  o.vocab_size = s.get_int("vocab_size", o.vocab_size);
  o.hidden_size = s.get_int("hidden_size", o.hidden_size);
  o.intermediate_size = s.get_int("intermediate_size", o.intermediate_size);
  o.num_hidden_layers = s.get_int("num_hidden_layers", o.num_hidden_layers);
  o.num_attention_heads = s.get_int("num_attention_heads", o.num_attention_heads);
  o.num_key_value_heads = s.get_optional_int("num_key_value_heads").value_or(o.num_attention_heads);
  s.check(o.num_attention_heads > 0, "num_attention_heads", "must be positive");
  o.head_dim = s.get_optional_int("head_dim").value_or(o.hidden_size / o.num_attention_heads);
  o.max_position_embeddings = s.get_int("max_position_embeddings", o.max_position_embeddings);
  o.rms_norm_eps = s.get_double("rms_norm_eps", o.rms_norm_eps);
  o.rope_theta = s.get_double("rope_theta", o.rope_theta);
  o.tie_word_embeddings = s.get_bool("tie_word_embeddings", o.tie_word_embeddings);
  o.attention_bias = s.get_bool("attention_bias", o.attention_bias);
  o.qkv_bias = s.get_bool("qkv_bias", o.model_type == "qwen2" || o.model_type == "qwen2_moe");
  o.mlp_bias = s.get_bool("mlp_bias", o.mlp_bias);
  o.sliding_window = s.get_optional_int("sliding_window").value_or(0);
  o.attention_dropout = s.get_double("attention_dropout", o.attention_dropout);
  o.initializer_range = s.get_double("initializer_range", o.initializer_range);
  o.bos_token_id = s.get_optional_int("bos_token_id");
  o.eos_token_id = s.get_optional_int("eos_token_id");
  o.pad_token_id = s.get_optional_int("pad_token_id");
  o.init_device = s.get_choice("init_device", o.init_device, {"cpu", "meta", "cuda"});
  if (o.model_type == "mixtral") {
    o.num_experts = s.get_int("num_local_experts", 8);
    o.num_experts_per_tok = s.get_int("num_experts_per_tok", 2);
    o.router_jitter_noise = s.get_double("router_jitter_noise", 0.0);
    s.check(o.router_jitter_noise >= 0 && o.router_jitter_noise < 1, "router_jitter_noise", "must lie in [0, 1)");
  } else if (o.model_type == "qwen2_moe" || o.model_type == "qwen3_moe") {
    const bool qwen3 = o.model_type == "qwen3_moe";  // Qwen3MoeConfig's defaults, and no shared expert
    o.num_experts = s.get_int("num_experts", qwen3 ? 128 : 60);
    o.num_experts_per_tok = s.get_int("num_experts_per_tok", qwen3 ? 8 : 4);
    o.moe_intermediate_size = s.get_int("moe_intermediate_size", qwen3 ? 768 : 1408);
    o.shared_expert_intermediate_size = qwen3 ? 0 : s.get_int("shared_expert_intermediate_size", 5632);
    o.norm_topk_prob = s.get_bool("norm_topk_prob", false);
    o.decoder_sparse_step = s.get_int("decoder_sparse_step", 1);
    s.check(o.decoder_sparse_step >= 1, "decoder_sparse_step", "must be at least 1");
    if (const config::Value* dense = s.raw("mlp_only_layers"); dense && !dense->is_null()) {
      for (const config::Value& v : dense->items()) {
        const auto i = v.as_int();
        if (!i) s.fail("mlp_only_layers", "expected a list of layer indices, got " + dense->brief());
        o.mlp_only_layers.push_back(*i);
      }
    }
    s.check(o.moe_intermediate_size > 0 && o.shared_expert_intermediate_size >= 0, "moe_intermediate_size",
            "must be positive");
  }
  if (o.num_experts > 0) {
    o.router_aux_loss_coef = s.get_double("router_aux_loss_coef", 0.001);
    o.output_router_logits = s.get_bool("output_router_logits", false);
    s.check(o.num_experts_per_tok >= 1 && o.num_experts_per_tok <= o.num_experts, "num_experts_per_tok",
            fmt::format("must lie in [1, {}] (the number of experts)", o.num_experts));
  }
  const std::string act = s.get_string("hidden_act", "silu");
  s.check(act == "silu", "hidden_act", "only silu (SwiGLU) is implemented");
  if (s.has("rope_scaling")) {
    config::Section r = s.section("rope_scaling");
    std::string type = r.get_optional_string("rope_type").value_or(r.get_string("type", "default"));
    r.check(type == "default" || type == "linear" || type == "llama3", "rope_type",
            "expected default, linear or llama3, got " + type);
    o.rope_scaling.type = type;
    o.rope_scaling.factor = r.get_double("factor", 1.0);
    o.rope_scaling.low_freq_factor = r.get_double("low_freq_factor", 1.0);
    o.rope_scaling.high_freq_factor = r.get_double("high_freq_factor", 4.0);
    o.rope_scaling.original_max_position_embeddings =
        r.get_int("original_max_position_embeddings", o.max_position_embeddings);
    r.check(o.rope_scaling.factor > 0, "factor", "must be positive");
    r.finish();
  }
  s.check(o.hidden_size > 0 && o.vocab_size > 0 && o.intermediate_size > 0 && o.num_hidden_layers > 0, "hidden_size",
          "hidden_size, vocab_size, intermediate_size and num_hidden_layers must be positive");
  s.check(o.num_key_value_heads > 0 && o.num_attention_heads % o.num_key_value_heads == 0, "num_key_value_heads",
          fmt::format("must divide num_attention_heads ({})", o.num_attention_heads));
  s.check(o.head_dim > 0 && o.head_dim % 2 == 0, "head_dim", "must be positive and even (rotary embeddings)");
  return o;
}

LlamaOptions llama_options_from_hf_config(const nlohmann::json& raw, const std::string& where) {
  static const std::set<std::string> kKeys = {"model_type",
                                              "vocab_size",
                                              "hidden_size",
                                              "intermediate_size",
                                              "num_hidden_layers",
                                              "num_attention_heads",
                                              "num_key_value_heads",
                                              "head_dim",
                                              "max_position_embeddings",
                                              "rms_norm_eps",
                                              "rope_theta",
                                              "rope_scaling",
                                              "tie_word_embeddings",
                                              "attention_bias",
                                              "mlp_bias",
                                              "sliding_window",
                                              "attention_dropout",
                                              "initializer_range",
                                              "bos_token_id",
                                              "eos_token_id",
                                              "pad_token_id",
                                              "hidden_act",
                                              "num_local_experts",
                                              "num_experts",
                                              "num_experts_per_tok",
                                              "router_jitter_noise",
                                              "moe_intermediate_size",
                                              "shared_expert_intermediate_size",
                                              "norm_topk_prob",
                                              "decoder_sparse_step",
                                              "mlp_only_layers",
                                              "router_aux_loss_coef",
                                              "output_router_logits",
                                              "qkv_bias"};
  const std::string type = raw.value("model_type", "");
  if (type != "llama" && type != "mistral" && type != "qwen2" && type != "mixtral" && type != "qwen2_moe" &&
      type != "qwen3_moe") {
    throw Error("hf", fmt::format("{}: model_type is \"{}\", expected llama, mistral, qwen2, mixtral, qwen2_moe or "
                                  "qwen3_moe",
                                  where, type));
  }
  // The Qwen2 types' window keys are read below; pretraining_tp is one transformers no longer reads.
  std::set<std::string> accepted = {"pretraining_tp"};
  if (type == "qwen2" || type == "qwen2_moe")
    accepted.insert({"layer_types", "max_window_layers", "use_sliding_window"});
  if (type == "qwen3_moe") accepted.insert("use_sliding_window");
  nlohmann::json cfg = hf_config_keys(raw, kKeys, where, accepted);  // Llama 3.1's list of eos ids reads as none
  // Mistral and Qwen2 write sliding_window even when it is off (use_sliding_window: false in Qwen2). Qwen2 slides in
  // the layers its layer_types names (by default those >= max_window_layers); Tessera's window covers every layer or
  // none.
  if (type == "qwen2" || type == "qwen2_moe") {
    const int64_t layers = raw.value("num_hidden_layers", int64_t{0});
    int64_t sliding = 0;
    if (raw.contains("layer_types") && raw["layer_types"].is_array()) {
      for (const auto& t : raw["layer_types"]) sliding += t == "sliding_attention" ? 1 : 0;
    } else if (raw.value("use_sliding_window", false)) {
      sliding = std::max<int64_t>(0, layers - raw.value("max_window_layers", int64_t{28}));
    }
    if (raw.value("sliding_window", nlohmann::json()).is_null()) sliding = 0;
    if (sliding == 0) {
      cfg.erase("sliding_window");
    } else if (sliding != layers) {
      throw Error("hf", fmt::format("{}: a sliding window in {} of {} layers (layer_types, max_window_layers); "
                                    "Tessera's sliding window covers every layer or none",
                                    where, sliding, layers));
    }
  }
  if (type == "qwen3_moe" && !raw.value("use_sliding_window", false)) cfg.erase("sliding_window");
  LlamaOptions o;
  read_hf_config(cfg, where, [&](config::Section& s) { o = parse_llama_options(s); });
  o.init_device = "cpu";
  return o;
}

nlohmann::ordered_json llama_hf_config(const LlamaOptions& o, at::ScalarType dtype) {
  static const std::map<std::string, std::string> kArch = {
      {"llama", "LlamaForCausalLM"},     {"mistral", "MistralForCausalLM"},    {"qwen2", "Qwen2ForCausalLM"},
      {"mixtral", "MixtralForCausalLM"}, {"qwen2_moe", "Qwen2MoeForCausalLM"}, {"qwen3_moe", "Qwen3MoeForCausalLM"}};
  auto optional = [](const std::optional<int64_t>& v) { return v ? nlohmann::ordered_json(*v) : nullptr; };
  nlohmann::ordered_json j = {{"architectures", {kArch.at(o.model_type)}},
                              {"model_type", o.model_type},
                              {"vocab_size", o.vocab_size},
                              {"hidden_size", o.hidden_size},
                              {"intermediate_size", o.intermediate_size},
                              {"num_hidden_layers", o.num_hidden_layers},
                              {"num_attention_heads", o.num_attention_heads},
                              {"num_key_value_heads", o.num_key_value_heads},
                              {"head_dim", o.head_dim},
                              {"hidden_act", "silu"},
                              {"max_position_embeddings", o.max_position_embeddings},
                              {"rms_norm_eps", o.rms_norm_eps},
                              {"rope_theta", o.rope_theta},
                              {"tie_word_embeddings", o.tie_word_embeddings},
                              {"attention_dropout", o.attention_dropout},
                              {"initializer_range", o.initializer_range},
                              {"bos_token_id", optional(o.bos_token_id)},
                              {"eos_token_id", optional(o.eos_token_id)},
                              {"pad_token_id", optional(o.pad_token_id)},
                              {"use_cache", true},
                              {"torch_dtype", hf_torch_dtype(dtype)}};
  if (o.rope_scaling.type == "default") {
    j["rope_scaling"] = nullptr;
  } else {
    nlohmann::ordered_json r = {{"rope_type", o.rope_scaling.type}, {"factor", o.rope_scaling.factor}};
    if (o.rope_scaling.type == "llama3") {
      r["low_freq_factor"] = o.rope_scaling.low_freq_factor;
      r["high_freq_factor"] = o.rope_scaling.high_freq_factor;
      r["original_max_position_embeddings"] = o.rope_scaling.original_max_position_embeddings;
    }
    j["rope_scaling"] = r;
  }
  if (o.model_type == "llama") {
    j["attention_bias"] = o.attention_bias;
    j["mlp_bias"] = o.mlp_bias;
  } else if (o.model_type == "qwen3_moe") {
    j["attention_bias"] = o.attention_bias;
    j["use_sliding_window"] = o.sliding_window > 0;
    j["sliding_window"] = o.sliding_window > 0 ? nlohmann::ordered_json(o.sliding_window) : nullptr;
  } else {
    j["sliding_window"] = o.sliding_window > 0 ? nlohmann::ordered_json(o.sliding_window) : nullptr;
    if (o.model_type == "qwen2" || o.model_type == "qwen2_moe") {
      j["use_sliding_window"] = o.sliding_window > 0;
      j["max_window_layers"] = 0;  // every layer slides when the window is on
    }
  }
  if (o.model_type == "mixtral") {
    j["num_local_experts"] = o.num_experts;
    j["router_jitter_noise"] = o.router_jitter_noise;
  } else if (o.model_type == "qwen2_moe" || o.model_type == "qwen3_moe") {
    j["num_experts"] = o.num_experts;
    j["moe_intermediate_size"] = o.moe_intermediate_size;
    if (o.model_type == "qwen2_moe") j["shared_expert_intermediate_size"] = o.shared_expert_intermediate_size;
    j["norm_topk_prob"] = o.norm_topk_prob;
    j["decoder_sparse_step"] = o.decoder_sparse_step;
    j["mlp_only_layers"] = o.mlp_only_layers;
    if (o.model_type == "qwen2_moe") j["qkv_bias"] = o.qkv_bias;
  }
  if (o.num_experts > 0) {
    j["num_experts_per_tok"] = o.num_experts_per_tok;
    j["router_aux_loss_coef"] = o.router_aux_loss_coef;
    j["output_router_logits"] = o.output_router_logits;
  }
  return j;
}

bool LlamaOptions::is_sparse_layer(int64_t i) const {
  if (num_experts <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), i) != mlp_only_layers.end()) return false;
  return (i + 1) % decoder_sparse_step == 0;
}

int64_t LlamaOptions::sparse_layers() const {
  int64_t n = 0;
  for (int64_t i = 0; i < num_hidden_layers; ++i) n += is_sparse_layer(i) ? 1 : 0;
  return n;
}

SparseMoeOptions LlamaOptions::sparse_moe() const {
  SparseMoeOptions m;
  m.num_experts = num_experts;
  m.top_k = num_experts_per_tok;
  m.hidden_size = hidden_size;
  const bool qwen = model_type == "qwen2_moe" || model_type == "qwen3_moe";
  m.ffn_hidden = qwen ? moe_intermediate_size : intermediate_size;
  m.shared_ffn_hidden = model_type == "qwen2_moe" ? shared_expert_intermediate_size : 0;
  m.qwen_names = qwen;
  m.norm_topk_prob = norm_topk_prob;
  m.jitter_noise = router_jitter_noise;
  return m;
}

namespace {
int64_t llama_layer_params(const LlamaOptions& o, int64_t index, bool active = false) {
  const int64_t d = o.hidden_size, hd = o.head_dim, h = o.num_attention_heads, kv = o.num_key_value_heads;
  const int64_t f = o.intermediate_size;
  int64_t attn = d * h * hd + 2 * d * kv * hd + h * hd * d;
  if (o.q_bias()) attn += h * hd + 2 * kv * hd;
  if (o.o_bias()) attn += d;
  if (o.qk_norm) attn += 2 * hd;
  int64_t mlp = 3 * d * f;
  if (o.mlp_bias) mlp += 2 * f + d;
  if (o.is_sparse_layer(index))
    mlp = active ? sparse_moe_active_params(o.sparse_moe()) : sparse_moe_params(o.sparse_moe());
  return attn + mlp + 2 * d;  // + the two RMSNorm weights
}

int64_t llama_count(const LlamaOptions& o, bool active) {
  const int64_t embeddings = o.vocab_size * o.hidden_size * (o.tie_word_embeddings ? 1 : 2);
  int64_t n = embeddings + o.hidden_size;
  for (int64_t i = 0; i < o.num_hidden_layers; ++i) n += llama_layer_params(o, i, active);
  return n;
}
}  // namespace

int64_t llama_param_count(const LlamaOptions& o) {
  return llama_count(o, false);
}

int64_t llama_active_param_count(const LlamaOptions& o) {
  return llama_count(o, true);
}

double llama_flops_per_token(const LlamaOptions& o, int64_t seq_len) {
  int64_t n = llama_active_param_count(o);
  if (!o.tie_word_embeddings) n -= o.vocab_size * o.hidden_size;
  return 6.0 * static_cast<double>(n) + 12.0 * static_cast<double>(o.num_hidden_layers) *
                                            static_cast<double>(o.num_attention_heads * o.head_dim) *
                                            static_cast<double>(seq_len);
}

int64_t llama_largest_unit_params(const LlamaOptions& o) {
  int64_t largest = o.vocab_size * o.hidden_size * (o.tie_word_embeddings ? 1 : 2) + o.hidden_size;
  for (int64_t i = 0; i < o.num_hidden_layers; ++i) largest = std::max(largest, llama_layer_params(o, i));
  return largest;
}

double llama_activation_bytes(const LlamaOptions& o, int64_t batch, int64_t seq_len, int bytes_per_value,
                              bool activation_checkpointing) {
  const double tokens = static_cast<double>(batch) * static_cast<double>(seq_len);
  const double d = static_cast<double>(o.hidden_size), f = static_cast<double>(o.intermediate_size);
  const double q = static_cast<double>(o.num_attention_heads * o.head_dim);
  const double kv = static_cast<double>(o.num_key_value_heads * o.head_dim);
  const double p = bytes_per_value;
  double mlp = 4 * f;
  if (o.num_experts > 0) {  // each token's top-k experts (and the shared one), plus a copy of its input per slot
    const SparseMoeOptions m = o.sparse_moe();
    mlp = static_cast<double>(m.top_k) * (4 * static_cast<double>(m.ffn_hidden) + 2 * d) +
          4 * static_cast<double>(m.shared_ffn_hidden) + 2 * static_cast<double>(m.num_experts);
  }
  const double block = tokens * (4 * d + 2 * q + 2 * kv + mlp) * p;
  const double layers = static_cast<double>(o.num_hidden_layers);
  const double stored = activation_checkpointing ? layers * tokens * d * p + block : layers * block;
  return stored + tokens * static_cast<double>(o.vocab_size) * (p + 4);
}

at::Tensor llama_inv_freq(const LlamaOptions& o) {
  at::Tensor inv = rotary_inv_freq(o.head_dim, o.rope_theta);
  const RopeScaling& r = o.rope_scaling;
  if (r.type == "linear") return inv / r.factor;
  if (r.type != "llama3") return inv;
  const double old_len = static_cast<double>(r.original_max_position_embeddings);
  const double low_wavelen = old_len / r.low_freq_factor, high_wavelen = old_len / r.high_freq_factor;
  const at::Tensor wavelen = 2 * M_PI / inv;
  at::Tensor scaled = at::where(wavelen > low_wavelen, inv / r.factor, inv);
  const at::Tensor smooth = (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  const at::Tensor smoothed = (1 - smooth) * scaled / r.factor + smooth * scaled;
  const at::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
  return at::where(medium, smoothed, scaled);
}

// ---- Modules --------------------------------------------------------------------------------------------------------

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaOptions& o, const at::TensorOptions& t) : o_(o) {
  const int64_t d = o.hidden_size, hd = o.head_dim;
  q_proj = register_module("q_proj", Linear(d, o.num_attention_heads * hd, o.q_bias(), t));
  k_proj = register_module("k_proj", Linear(d, o.num_key_value_heads * hd, o.q_bias(), t));
  v_proj = register_module("v_proj", Linear(d, o.num_key_value_heads * hd, o.q_bias(), t));
  o_proj = register_module("o_proj", Linear(o.num_attention_heads * hd, d, o.o_bias(), t));
  if (o.qk_norm) {
    q_norm = register_module("q_norm", Norm(hd, NormType::kRMSNorm, o.rms_norm_eps, false, t));
    k_norm = register_module("k_norm", Norm(hd, NormType::kRMSNorm, o.rms_norm_eps, false, t));
  }
}

at::Tensor LlamaAttentionImpl::forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache) {
  // Head counts and the sequence length come from the projections' outputs (this rank's heads under tensor
  // parallelism, the whole sequence of a sharded x under sequence parallelism).
  const int64_t hd = o_.head_dim;
  at::Tensor q = q_proj(x);
  const int64_t b = q.size(0), s = q.size(1);
  q = q.reshape({b, s, -1, hd});
  at::Tensor k = k_proj(x).reshape({b, s, -1, hd});
  if (q_norm) {  // Qwen3: per head, before rotary
    q = q_norm(q).to(q.scalar_type());
    k = k_norm(k).to(k.scalar_type());
  }
  q = apply_rotary(q, in.rope_cos, in.rope_sin).transpose(1, 2);
  k = apply_rotary(k, in.rope_cos, in.rope_sin).transpose(1, 2);
  at::Tensor v = v_proj(x).reshape({b, s, -1, hd}).transpose(1, 2);
  append_to_cache(cache, k, v);
  const double dropout = is_training() ? o_.attention_dropout : 0.0;
  const at::Tensor context =
      attend(q, k, v, in, 1.0 / std::sqrt(static_cast<double>(hd)), dropout, is_training());  // (B, H, s, hd)
  return o_proj(context.transpose(1, 2).reshape({b, s, -1}));
}

LlamaMLPImpl::LlamaMLPImpl(const LlamaOptions& o, const at::TensorOptions& t) {
  gate_proj = register_module("gate_proj", Linear(o.hidden_size, o.intermediate_size, o.mlp_bias, t));
  up_proj = register_module("up_proj", Linear(o.hidden_size, o.intermediate_size, o.mlp_bias, t));
  down_proj = register_module("down_proj", Linear(o.intermediate_size, o.hidden_size, o.mlp_bias, t));
}

at::Tensor LlamaMLPImpl::forward(const at::Tensor& x) {
  return down_proj(at::silu(gate_proj(x)) * up_proj(x));
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaOptions& o, const at::TensorOptions& t, int64_t index,
                                             std::shared_ptr<HfRouterLoss> router_loss,
                                             std::shared_ptr<AuxLossScale> aux_scale) {
  input_layernorm =
      register_module("input_layernorm", Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t));
  self_attn = register_module("self_attn", LlamaAttention(o, t));
  post_attention_layernorm =
      register_module("post_attention_layernorm", Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t));
  if (o.is_sparse_layer(index)) {
    moe = register_module(o.model_type == "mixtral" ? "block_sparse_moe" : "mlp",
                          SparseMoeBlock(o.sparse_moe(), t, std::move(router_loss),
                                         aux_scale ? std::move(aux_scale) : std::make_shared<AuxLossScale>()));
  } else {
    mlp = register_module("mlp", LlamaMLP(o, t));
  }
}

at::Tensor LlamaDecoderLayerImpl::forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache) {
  const at::Tensor h = x + self_attn(input_layernorm(x), in, cache);
  const at::Tensor normed = post_attention_layernorm(h);
  return h + (moe ? moe(normed) : mlp(normed));
}

LlamaModelImpl::LlamaModelImpl(const LlamaOptions& o, const at::TensorOptions& t,
                               std::shared_ptr<HfRouterLoss> router_loss, std::shared_ptr<AuxLossScale> aux_scale) {
  embed_tokens = register_module("embed_tokens", Embedding(o.vocab_size, o.hidden_size, t));
  // transformers' nn.Embedding(vocab, hidden, padding_idx=pad_token_id): that row gets no gradient.
  if (o.pad_token_id && *o.pad_token_id >= 0 && *o.pad_token_id < o.vocab_size) {
    embed_tokens->padding_idx = *o.pad_token_id;
  }
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.num_hidden_layers; ++i)
    layers->push_back(LlamaDecoderLayer(o, t, i, router_loss, aux_scale));
  norm = register_module("norm", Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t));
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaOptions& o)
    : DecoderLM("model.layers."), o_(o), inv_freq_(llama_inv_freq(o)) {
  const at::TensorOptions t = at::TensorOptions().dtype(at::kFloat).device(at::Device(o.init_device));
  router_loss_->coef = o.output_router_logits ? o.router_aux_loss_coef : 0.0;
  router_loss_->sparse_layers = o.sparse_layers();
  model = register_module("model", LlamaModel(o, t, router_loss_, aux_scale_));
  if (!o.tie_word_embeddings) lm_head = register_module("lm_head", Linear(o.hidden_size, o.vocab_size, false, t));
}

AttentionInputs LlamaForCausalLMImpl::attention_inputs(const DecoderCall& call) {
  AttentionInputs in =
      causal_attention_inputs(call.ids, call.fo, call.past, call.key_mask, call.dtype, o_.sliding_window);
  set_rope_tables(in, call.positions, inv_freq_);  // in float32, as transformers computes them
  return in;
}

void LlamaForCausalLMImpl::begin_forward(const DecoderCall& call) {
  moe_training_ = o_.num_experts > 0 && is_training();
  if (o_.num_experts == 0) return;
  for (const auto& layer : *model->layers) {
    if (auto& moe = layer->as<LlamaDecoderLayerImpl>()->moe) moe->records.clear();
  }
  aux_loss_ = at::Tensor();
  if (moe_training_) {
    router_loss_->start(o_.num_experts, call.key_mask.defined() ? call.key_mask.reshape({-1}) : at::Tensor(),
                        call.ids.numel(), call.ids.device());
  }
}

void LlamaForCausalLMImpl::end_forward() {
  if (moe_training_) aux_loss_ = router_loss_->finish();
}

std::map<std::string, at::Tensor> LlamaForCausalLMImpl::auxiliary_losses() const {
  if (!aux_loss_.defined()) return {};
  return {{"aux_loss", aux_loss_}};
}

std::vector<std::pair<std::string, at::Tensor>> LlamaForCausalLMImpl::expert_token_counts() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  int64_t i = 0;
  for (const auto& layer : *model->layers) {
    const auto& moe = layer->as<LlamaDecoderLayerImpl>()->moe;
    if (moe && !moe->records.empty()) out.emplace_back(fmt::format("layer_{}", i), moe->records.front());
    ++i;
  }
  return out;
}

int64_t LlamaForCausalLMImpl::num_active_params() const {
  return llama_active_param_count(o_);
}

void LlamaForCausalLMImpl::init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select) {
  init_like_transformers(*this, seed, o_.initializer_range, select, o_.pad_token_id);
}

std::shared_ptr<CausalLM> LlamaForCausalLMImpl::rebuild(const std::string& device, std::optional<uint64_t> seed) const {
  LlamaOptions o = o_;
  o.init_device = device;
  return seed ? build_llama(o, *seed).ptr() : LlamaForCausalLM(o).ptr();
}

std::string LlamaForCausalLMImpl::describe() const {
  return fmt::format(
             "{}: hidden {}, heads {} (kv {}, head_dim {}), layers {}, intermediate {}, vocab {}, rope theta "
             "{}{}",
             o_.model_type, o_.hidden_size, o_.num_attention_heads, o_.num_key_value_heads, o_.head_dim,
             o_.num_hidden_layers, o_.intermediate_size, o_.vocab_size, o_.rope_theta,
             o_.rope_scaling.type == "default" ? "" : " (" + o_.rope_scaling.type + " scaling)") +
         (o_.num_experts > 0 ? fmt::format(", {} experts of {} (top {}) in {} layers", o_.num_experts,
                                           o_.sparse_moe().ffn_hidden, o_.num_experts_per_tok, o_.sparse_layers())
                             : "");
}

std::optional<std::string> LlamaForCausalLMImpl::tied_embedding_name() const {
  if (!o_.tie_word_embeddings) return std::nullopt;
  return "model.embed_tokens.weight";
}

LlamaForCausalLM build_llama(const LlamaOptions& options, uint64_t seed) {
  LlamaForCausalLM model(options);
  if (options.init_device != "meta") model->init_weights(seed);
  return model;
}

TensorParallelPlan LlamaForCausalLMImpl::tensor_parallel_plan(int64_t degree) const {
  if (o_.num_attention_heads % degree != 0 || o_.num_key_value_heads % degree != 0) {
    refuse_tensor_parallel(
        degree, fmt::format("{}'s {} attention and {} key/value heads do not split into {} equal shares", o_.model_type,
                            o_.num_attention_heads, o_.num_key_value_heads, degree));
  }
  if (o_.intermediate_size % degree != 0) {
    refuse_tensor_parallel(
        degree, fmt::format("the MLP's {} hidden units (intermediate_size) do not split into {} equal shares",
                            o_.intermediate_size, degree));
  }
  TensorParallelPlan plan;
  // The head along the vocabulary, where it divides (else the head stays whole): the embedding table with it when tied.
  if (o_.vocab_size % degree == 0) {
    if (lm_head) {
      plan.vocab_head("lm_head");
    } else {
      plan.vocab_embedding("model.embed_tokens");
    }
  }
  int64_t i = 0;
  for (const auto& l : *model->layers) {
    const auto* layer = l->as<LlamaDecoderLayerImpl>();
    const std::string p = fmt::format("model.layers.{}.", i++);
    if (layer->moe) refuse_tensor_parallel(degree, "the MoE layers' experts do not split over a tensor-parallel group");
    plan.layer(p, {"input_layernorm", "post_attention_layernorm"},
               {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"},
               {"self_attn.o_proj", "mlp.down_proj"});
    if (layer->self_attn->q_norm) {
      plan.head_norm(p + "self_attn.q_norm");
      plan.head_norm(p + "self_attn.k_norm");
    }
  }
  return plan;
}

}  // namespace tessera::models
