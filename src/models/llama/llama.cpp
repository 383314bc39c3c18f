// The Llama family: options (recipe and config.json), modules, masks and rotary tables, initialisation.
#include "models/llama/llama.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "tessera/config/value.h"
#include "tessera/models/blocks/layers.h"
#include "tessera/models/family_keys.h"
#include "tessera/models/family_support.h"
#include "tessera/util/error.h"

namespace tessera::models {
// ---- Options --------------------------------------------------------------------------------------------------------

namespace {

// The transformers class of each model_type.
std::string llama_architecture(const std::string& type) {
  static const std::map<std::string, std::string> kArch = {
      {"llama", "LlamaForCausalLM"},     {"mistral", "MistralForCausalLM"},    {"qwen2", "Qwen2ForCausalLM"},
      {"mixtral", "MixtralForCausalLM"}, {"qwen2_moe", "Qwen2MoeForCausalLM"}, {"qwen3_moe", "Qwen3MoeForCausalLM"},
      {"qwen3", "Qwen3ForCausalLM"}};
  return kArch.at(type);
}

// The model_types' own defaults, where they differ from LlamaConfig's.
void llama_type_defaults(const std::string& type, LlamaOptions& o) {
  o.model_type = type;
  o.qk_norm = type == "qwen3_moe" || type == "qwen3";
  o.qkv_bias = type == "qwen2";  // Qwen2's q, k and v always have biases
  if (type == "qwen3") {         // Qwen3Config's
    o.vocab_size = 151936;
    o.hidden_size = 4096;
    o.intermediate_size = 22016;
    o.head_dim = 128;
    o.max_position_embeddings = 32768;
  } else if (type == "mixtral") {
    o.rms_norm_eps = 1e-5;
    o.rope_theta = 1e6;
    o.num_experts = 8;
    o.num_experts_per_tok = 2;
  } else if (type == "qwen2_moe" || type == "qwen3_moe") {
    const bool qwen3 = type == "qwen3_moe";
    o.num_experts = qwen3 ? 128 : 60;
    o.num_experts_per_tok = qwen3 ? 8 : 4;
    o.moe_intermediate_size = qwen3 ? 768 : 1408;
    o.shared_expert_intermediate_size = qwen3 ? 0 : 5632;
    o.qkv_bias = !qwen3;
    o.norm_topk_prob = false;
  }
}

void read_rope_scaling(config::Section& s, LlamaOptions& o) {
  if (!s.has("rope_scaling")) return;
  config::Section r = s.section("rope_scaling");
  const std::string type = r.get_optional_string("rope_type").value_or(r.get_string("type", "default"));
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

nlohmann::ordered_json rope_scaling_json(const LlamaOptions& o) {
  if (o.rope_scaling.type == "default") return nullptr;
  nlohmann::ordered_json r = {{"rope_type", o.rope_scaling.type}, {"factor", o.rope_scaling.factor}};
  if (o.rope_scaling.type == "llama3") {
    r["low_freq_factor"] = o.rope_scaling.low_freq_factor;
    r["high_freq_factor"] = o.rope_scaling.high_freq_factor;
    r["original_max_position_embeddings"] = o.rope_scaling.original_max_position_embeddings;
  }
  return r;
}

}  // namespace

// The keys of LlamaConfig, MistralConfig, Qwen2Config, MixtralConfig, Qwen2MoeConfig and Qwen3MoeConfig, each row
// for the model_types whose class reads it. pretraining_tp is one transformers no longer reads.
const FamilyKeys<LlamaOptions>& llama_keys() {
  using O = LlamaOptions;
  const FamilyKeys<O>::Types windowed = {"mistral", "qwen2", "mixtral", "qwen2_moe", "qwen3_moe", "qwen3"};
  const FamilyKeys<O>::Types moe = {"mixtral", "qwen2_moe", "qwen3_moe"}, qwen_moe = {"qwen2_moe", "qwen3_moe"};
  static const FamilyKeys<O> keys =
      FamilyKeys<O>(llama_model_types(), &llama_architecture)
          .defaults(&llama_type_defaults)
          .field("vocab_size", &O::vocab_size, positive())
          .field("hidden_size", &O::hidden_size, positive())
          .field("intermediate_size", &O::intermediate_size, positive())
          .field("num_hidden_layers", &O::num_hidden_layers, positive())
          .field("num_attention_heads", &O::num_attention_heads, positive())
          .resolved(
              "num_key_value_heads", &O::num_key_value_heads, [](const O& o) { return o.num_attention_heads; },
              positive())
          .divides("num_key_value_heads", &O::num_key_value_heads, "num_attention_heads", &O::num_attention_heads)
          .resolved(
              "head_dim", &O::head_dim,
              [](const O& o) { return o.head_dim > 0 ? o.head_dim : o.hidden_size / o.num_attention_heads; },
              KeyCheck<int64_t>([](const int64_t& d) {
                return d > 0 && d % 2 == 0 ? "" : std::string("must be positive and even (rotary embeddings)");
              }))
          .fixed("hidden_act", std::string("silu"), "only silu (SwiGLU) is implemented")
          .field("max_position_embeddings", &O::max_position_embeddings, positive())
          .field("rms_norm_eps", &O::rms_norm_eps)
          .field("rope_theta", &O::rope_theta)
          .custom("rope_scaling", &read_rope_scaling, &rope_scaling_json)
          .field("tie_word_embeddings", &O::tie_word_embeddings)
          .field("attention_bias", &O::attention_bias, {}, {"llama", "qwen3_moe", "qwen3"})
          .field("qkv_bias", &O::qkv_bias, {}, {"qwen2_moe"})
          .field("mlp_bias", &O::mlp_bias, {}, {"llama"})
          .custom(
              "sliding_window",
              [](config::Section& s, O& o) {
                o.sliding_window = s.get_optional_int("sliding_window").value_or(0);
                s.check(o.sliding_window >= 0, "sliding_window", "must be positive (or null for none)");
              },
              [](const O& o) { return o.sliding_window > 0 ? nlohmann::ordered_json(o.sliding_window) : nullptr; },
              windowed)
          // Qwen2 and Qwen3 slide in the layers layer_types names; written in full (every layer's type) for
          // transformers.
          .custom(
              "layer_types",
              [](config::Section& s, O& o) {
                o.layer_types = s.get_strings("layer_types", o.layer_types);
                if (o.layer_types.empty()) return;
                check_layer_types(s, o.layer_types, o.num_hidden_layers);
              },
              [](const O& o) {
                std::vector<std::string> types;
                for (int64_t i = 0; i < o.num_hidden_layers; ++i)
                  types.emplace_back(o.windowed_layer(i) ? "sliding_attention" : "full_attention");
                return nlohmann::ordered_json(types);
              },
              {"qwen2", "qwen3"})
          // Written for transformers: Qwen2 and Qwen3 slide only where use_sliding_window and max_window_layers say so.
          .written("use_sliding_window", [](const O& o) { return nlohmann::ordered_json(o.sliding_window > 0); },
                   {"qwen2", "qwen2_moe", "qwen3_moe", "qwen3"})
          .written("max_window_layers", [](const O&) { return nlohmann::ordered_json(0); },
                   {"qwen2", "qwen2_moe", "qwen3"})
          .field("attention_dropout", &O::attention_dropout, probability())
          .field("initializer_range", &O::initializer_range)
          .field("num_local_experts", &O::num_experts, positive(), {"mixtral"})
          .field("num_experts", &O::num_experts, positive(), qwen_moe)
          .field("num_experts_per_tok", &O::num_experts_per_tok, positive(), moe)
          .field("router_jitter_noise", &O::router_jitter_noise, probability(), {"mixtral"})
          .field("moe_intermediate_size", &O::moe_intermediate_size, positive(), qwen_moe)
          .field("shared_expert_intermediate_size", &O::shared_expert_intermediate_size,
                 KeyCheck<int64_t>([](const int64_t& v) { return v >= 0 ? "" : std::string("must not be negative"); }),
                 {"qwen2_moe"})
          .field("norm_topk_prob", &O::norm_topk_prob, {}, qwen_moe)
          .field("decoder_sparse_step", &O::decoder_sparse_step, positive(), qwen_moe)
          .field("mlp_only_layers", &O::mlp_only_layers, {}, qwen_moe)
          .field("router_aux_loss_coef", &O::router_aux_loss_coef, {}, moe)
          .field("output_router_logits", &O::output_router_logits, {}, moe)
          .token_ids();
  return keys;
}

LlamaOptions parse_llama_options(config::Section& s) {
  LlamaOptions o;
  llama_keys().read(s, o);
  if (o.num_experts > 0) {
    s.check(o.num_experts_per_tok <= o.num_experts, "num_experts_per_tok",
            fmt::format("must lie in [1, {}] (the number of experts)", o.num_experts));
  }
  return o;
}

LlamaOptions llama_options_from_hf_config(const nlohmann::json& raw, const std::string& where) {
  const std::string type = raw.value("model_type", "");
  std::set<std::string> accepted = {"pretraining_tp"};
  const bool per_layer_windows = type == "qwen2" || type == "qwen2_moe" || type == "qwen3";
  const bool layer_list = type == "qwen2" || type == "qwen3";
  if (per_layer_windows && !layer_list) accepted.insert("layer_types");
  // Mistral and Qwen2 write sliding_window even when it is off (use_sliding_window: false in Qwen2). Qwen2 and Qwen3
  // slide in the layers their layer_types names (by default those >= max_window_layers), which Tessera reads as they
  // are; Qwen2-MoE's window covers every layer or none. Llama 3.1's list of eos ids reads as none.
  return llama_keys().from_hf(
      raw, where, &parse_llama_options, accepted, [&](const nlohmann::json& config, nlohmann::json& cfg) {
        if (per_layer_windows) {
          const int64_t layers = config.value("num_hidden_layers", int64_t{0});
          std::vector<std::string> types;
          if (config.contains("layer_types") && config["layer_types"].is_array()) {
            for (const auto& t : config["layer_types"]) {
              if (!t.is_string()) throw Error("hf", fmt::format("{}: layer_types: each entry is a string", where));
              types.push_back(t.get<std::string>());
            }
          } else {
            const bool on = config.value("use_sliding_window", false);
            const int64_t from = config.value("max_window_layers", int64_t{28});
            for (int64_t i = 0; i < layers; ++i)
              types.emplace_back(on && i >= from ? "sliding_attention" : "full_attention");
          }
          const int64_t sliding = config.value("sliding_window", nlohmann::json()).is_null()
                                      ? 0
                                      : std::count(types.begin(), types.end(), "sliding_attention");
          cfg.erase("layer_types");
          if (layer_list) cfg["layer_types"] = types;  // read and checked as the recipe's
          if (sliding == 0) {
            cfg.erase("sliding_window");
          } else if (!layer_list && sliding != layers) {
            throw Error("hf", fmt::format("{}: a sliding window in {} of {} layers "
                                          "(layer_types, max_window_layers); Tessera's "
                                          "sliding window covers every layer or none",
                                          where, sliding, layers));
          }
        }
        if (type == "qwen3_moe" && !config.value("use_sliding_window", false)) cfg.erase("sliding_window");
      });
}

nlohmann::ordered_json llama_hf_config(const LlamaOptions& o, at::ScalarType dtype) {
  return llama_keys().hf_config(o, o.model_type, dtype);
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

namespace {

// q/k/v/o projections (Qwen2's biases on q/k/v only), Qwen3's q/k norms per head before rotary.
SelfAttentionOptions llama_attention(const LlamaOptions& o) {
  return {.hidden_size = o.hidden_size,
          .heads = o.num_attention_heads,
          .kv_heads = o.num_key_value_heads,
          .head_dim = o.head_dim,
          .qkv_bias = o.q_bias(),
          .out_bias = o.o_bias(),
          .qk_norm = o.qk_norm ? QKNorm::kPerHead : QKNorm::kNone,
          .qk_norm_eps = o.rms_norm_eps,
          .dropout = o.attention_dropout};
}

}  // namespace

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaOptions& o, const at::TensorOptions& t, int64_t index,
                                             std::shared_ptr<HfRouterLoss> router_loss,
                                             std::shared_ptr<AuxLossScale> aux_scale)
    : windowed_(o.windowed_layer(index)) {
  input_layernorm =
      register_module("input_layernorm", Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t));
  self_attn = register_module("self_attn", SelfAttention(llama_attention(o), t));
  post_attention_layernorm =
      register_module("post_attention_layernorm", Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t));
  if (o.is_sparse_layer(index)) {
    moe = register_module(o.model_type == "mixtral" ? "block_sparse_moe" : "mlp",
                          SparseMoeBlock(o.sparse_moe(), t, std::move(router_loss),
                                         aux_scale ? std::move(aux_scale) : std::make_shared<AuxLossScale>()));
  } else {
    mlp = register_module("mlp", GatedMLP(o.hidden_size, o.intermediate_size, "silu", o.mlp_bias, t));
  }
}

at::Tensor LlamaDecoderLayerImpl::forward(const at::Tensor& x, const GlobalLocalInputs& in, LayerCache* cache) {
  const at::Tensor h = x + self_attn(input_layernorm(x), windowed_ ? in.local : in.global, cache);
  const at::Tensor normed = post_attention_layernorm(h);
  return h + (moe ? moe(normed) : mlp(normed));
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaOptions& o) : HfDecoderLM(o, llama_keys()) {
  const at::TensorOptions t = tensor_options();
  routing_.loss->coef = o.output_router_logits ? o.router_aux_loss_coef : 0.0;
  routing_.loss->sparse_layers = o.sparse_layers();
  build_backbone([&](int64_t i) { return LlamaDecoderLayer(o, t, i, routing_.loss, routing_.scale); },
                 Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t));
  // The full layers' causal masks, and the windowed ones for the layers the sliding window applies to (the same set
  // when it applies to every layer or none).
  inv_freq_ = llama_inv_freq(o);
  window_ = o.sliding_window;
}

void LlamaForCausalLMImpl::begin_forward(const DecoderCall& call) {
  if (o_.num_experts == 0) return;
  for (const auto& layer : *model->layers) {
    if (auto& moe = layer->as<LlamaDecoderLayerImpl>()->moe) moe->records.clear();
  }
  routing_.begin(is_training(), o_.num_experts, call.ids, call.key_mask);
}

void LlamaForCausalLMImpl::end_forward() {
  if (o_.num_experts > 0) routing_.end();
}

std::vector<std::pair<std::string, at::Tensor>> LlamaForCausalLMImpl::expert_token_counts() const {
  return expert_counts_by_layer(o_.num_hidden_layers, [this](int64_t i) -> const std::vector<at::Tensor>* {
    const auto& moe = model->layers->ptr(i)->as<LlamaDecoderLayerImpl>()->moe;
    return moe ? &moe->records : nullptr;
  });
}

std::string LlamaForCausalLMImpl::describe_more() const {
  return fmt::format(", rope theta {}{}", o_.rope_theta,
                     o_.rope_scaling.type == "default" ? "" : " (" + o_.rope_scaling.type + " scaling)") +
         (o_.num_experts > 0 ? fmt::format(", {} experts of {} (top {}) in {} layers", o_.num_experts,
                                           o_.sparse_moe().ffn_hidden, o_.num_experts_per_tok, o_.sparse_layers())
                             : "");
}

LlamaForCausalLM build_llama(const LlamaOptions& options, uint64_t seed) {
  LlamaForCausalLM model(options);
  if (options.init_device != "meta") model->init_weights(seed);
  return model;
}

void LlamaForCausalLMImpl::check_tensor_parallel(int64_t degree) const {
  HfDecoderLM::check_tensor_parallel(degree);
  if (o_.sparse_layers() > 0) {
    refuse_tensor_parallel(degree, "the MoE layers' experts do not split over a tensor-parallel group");
  }
}

void LlamaForCausalLMImpl::plan_layer(TensorParallelPlan& plan, const std::string& p, int64_t i) const {
  HfDecoderLM::plan_layer(plan, p, i);
  if (model->layers->ptr(i)->as<LlamaDecoderLayerImpl>()->self_attn->q_norm) {
    plan.head_norm(p + "self_attn.q_norm");
    plan.head_norm(p + "self_attn.k_norm");
  }
}

}  // namespace tessera::models
