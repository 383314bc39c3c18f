// The GPT-Neo family: options (recipe and config.json, attention_types expanded as transformers expands them),
// modules with global and local (windowed) attention layers, initialisation.
#include "models/gpt_neo/gpt_neo.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "tessera/config/value.h"
#include "tessera/models/family_support.h"
#include "tessera/util/error.h"

namespace tessera::models {
namespace {

// attention_types: a list of [pattern, count] pairs, each pattern a list of "global" / "local", expanded as
// GPTNeoConfig.expand_attention_types_params: the pattern repeated count times.
std::vector<std::string> expand_attention_types(config::Section& s) {
  const config::Value* types = s.raw("attention_types");
  if (types == nullptr) {
    std::vector<std::string> out;
    for (int i = 0; i < 12; ++i) out.insert(out.end(), {"global", "local"});  // [[["global", "local"], 12]]
    return out;
  }
  const std::string shape = R"(expected a list of [pattern, count] pairs, as [[["global", "local"], 12]])";
  s.check(types->is_sequence(), "attention_types", shape);
  std::vector<std::string> out;
  for (const config::Value& pair : types->items()) {
    s.check(pair.is_sequence() && pair.items().size() == 2 && pair.items()[0].is_sequence(), "attention_types", shape);
    const std::optional<int64_t> count = pair.items()[1].as_int();
    s.check(count && *count >= 0, "attention_types", shape);
    for (int64_t i = 0; i < *count; ++i) {
      for (const config::Value& kind : pair.items()[0].items()) {
        s.check(kind.is_scalar() && (kind.text() == "global" || kind.text() == "local"), "attention_types",
                "each attention type is \"global\" or \"local\"");
        out.push_back(kind.text());
      }
    }
  }
  return out;
}

}  // namespace

// ---- Options --------------------------------------------------------------------------------------------------------

nlohmann::ordered_json GPTNeoOptions::attention_types() const {
  // One [["global"] or ["local"], run length] pair per run of equal layers: expands to the same layers.
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (size_t i = 0; i < attention_layers.size();) {
    size_t j = i;
    while (j < attention_layers.size() && attention_layers[j] == attention_layers[i]) ++j;
    out.push_back({{attention_layers[i]}, j - i});
    i = j;
  }
  return out;
}

GPTNeoOptions parse_gpt_neo_options(config::Section& s) {
  GPTNeoOptions o;
  (void)s.get_choice("model_type", "gpt_neo", {"gpt_neo"});
  o.vocab_size = s.get_int("vocab_size", o.vocab_size);
  o.max_position_embeddings = s.get_int("max_position_embeddings", o.max_position_embeddings);
  o.hidden_size = s.get_int("hidden_size", o.hidden_size);
  o.num_layers = s.get_int("num_layers", o.num_layers);
  o.attention_layers = expand_attention_types(s);
  s.check(static_cast<int64_t>(o.attention_layers.size()) == o.num_layers, "attention_types",
          fmt::format("expands to {} layers, but num_layers is {} (transformers refuses this too)",
                      o.attention_layers.size(), o.num_layers));
  // A config.json also stores the expansion; transformers' PretrainedConfig then sets it over its own.
  o.attention_layers = s.get_strings("attention_layers", o.attention_layers);
  s.check(static_cast<int64_t>(o.attention_layers.size()) == o.num_layers, "attention_layers",
          fmt::format("has {} entries for {} layers", o.attention_layers.size(), o.num_layers));
  for (const std::string& kind : o.attention_layers) {
    s.check(kind == "global" || kind == "local", "attention_layers",
            fmt::format("each entry is \"global\" or \"local\", got \"{}\"", kind));
  }
  o.num_heads = s.get_int("num_heads", o.num_heads);
  o.intermediate_size = s.get_optional_int("intermediate_size").value_or(4 * o.hidden_size);
  o.window_size = s.get_int("window_size", o.window_size);
  o.activation_function = s.get_string("activation_function", o.activation_function);
  s.check(is_hf_activation(o.activation_function), "activation_function",
          fmt::format("\"{}\" is not an activation Tessera computes ({})", o.activation_function,
                      fmt::join(hf_activation_names(), ", ")));
  o.resid_dropout = s.get_double("resid_dropout", o.resid_dropout);
  o.embed_dropout = s.get_double("embed_dropout", o.embed_dropout);
  o.attention_dropout = s.get_double("attention_dropout", o.attention_dropout);
  o.layer_norm_epsilon = s.get_double("layer_norm_epsilon", o.layer_norm_epsilon);
  o.initializer_range = s.get_double("initializer_range", o.initializer_range);
  s.check(s.get_bool("tie_word_embeddings", true), "tie_word_embeddings",
          "false: Tessera's GPT-Neo ties its head to wte, as every published GPT-Neo does");
  o.bos_token_id = s.get_nullable_int("bos_token_id", o.bos_token_id);
  o.eos_token_id = s.get_nullable_int("eos_token_id", o.eos_token_id);
  o.pad_token_id = s.get_nullable_int("pad_token_id", o.pad_token_id);
  o.init_device = s.get_choice("init_device", o.init_device, {"cpu", "meta", "cuda"});

  s.check(o.hidden_size > 0 && o.vocab_size > 0 && o.num_layers > 0 && o.intermediate_size > 0, "hidden_size",
          "hidden_size, vocab_size, num_layers and intermediate_size must be positive");
  s.check(o.num_heads > 0 && o.hidden_size % o.num_heads == 0, "num_heads",
          fmt::format("must divide hidden_size ({})", o.hidden_size));
  s.check(o.window_size > 0, "window_size", "must be positive");
  s.check(o.max_position_embeddings > 0, "max_position_embeddings", "must be positive");
  s.check(o.resid_dropout >= 0 && o.resid_dropout < 1, "resid_dropout", "must be in [0, 1)");
  s.check(o.embed_dropout >= 0 && o.embed_dropout < 1, "embed_dropout", "must be in [0, 1)");
  s.check(o.attention_dropout >= 0 && o.attention_dropout < 1, "attention_dropout", "must be in [0, 1)");
  return o;
}

GPTNeoOptions gpt_neo_options_from_hf_config(const nlohmann::json& raw, const std::string& where) {
  // The keys GPTNeoConfig reads (classifier_dropout only serves other heads).
  static const std::set<std::string> kKeys = {"model_type",        "vocab_size",          "max_position_embeddings",
                                              "hidden_size",       "num_layers",          "attention_types",
                                              "attention_layers",  "num_heads",           "intermediate_size",
                                              "window_size",       "activation_function", "resid_dropout",
                                              "embed_dropout",     "attention_dropout",   "layer_norm_epsilon",
                                              "initializer_range", "tie_word_embeddings", "bos_token_id",
                                              "eos_token_id",      "pad_token_id"};
  const std::string type = raw.value("model_type", "");
  if (type != "gpt_neo") throw Error("hf", fmt::format("{}: model_type is \"{}\", expected gpt_neo", where, type));
  nlohmann::json cfg = hf_config_keys(raw, kKeys, where);
  GPTNeoOptions o;
  read_hf_config(cfg, where, [&](config::Section& s) { o = parse_gpt_neo_options(s); });
  o.init_device = "cpu";
  return o;
}

nlohmann::ordered_json gpt_neo_hf_config(const GPTNeoOptions& o, at::ScalarType dtype) {
  auto optional = [](const std::optional<int64_t>& v) { return v ? nlohmann::ordered_json(*v) : nullptr; };
  return {{"architectures", {"GPTNeoForCausalLM"}},
          {"model_type", "gpt_neo"},
          {"vocab_size", o.vocab_size},
          {"max_position_embeddings", o.max_position_embeddings},
          {"hidden_size", o.hidden_size},
          {"num_layers", o.num_layers},
          {"attention_types", o.attention_types()},
          {"attention_layers", o.attention_layers},
          {"num_heads", o.num_heads},
          {"intermediate_size", o.intermediate_size},
          {"window_size", o.window_size},
          {"activation_function", o.activation_function},
          {"resid_dropout", o.resid_dropout},
          {"embed_dropout", o.embed_dropout},
          {"attention_dropout", o.attention_dropout},
          {"layer_norm_epsilon", o.layer_norm_epsilon},
          {"initializer_range", o.initializer_range},
          {"tie_word_embeddings", true},
          {"bos_token_id", optional(o.bos_token_id)},
          {"eos_token_id", optional(o.eos_token_id)},
          {"pad_token_id", optional(o.pad_token_id)},
          {"use_cache", true},
          {"torch_dtype", hf_torch_dtype(dtype)}};
}

// ---- Modules --------------------------------------------------------------------------------------------------------

GPTNeoSelfAttentionImpl::GPTNeoSelfAttentionImpl(const GPTNeoOptions& o, const at::TensorOptions& t) : o_(o) {
  const int64_t d = o.hidden_size;
  k_proj = register_module("k_proj", Linear(d, d, false, t));
  v_proj = register_module("v_proj", Linear(d, d, false, t));
  q_proj = register_module("q_proj", Linear(d, d, false, t));
  out_proj = register_module("out_proj", Linear(d, d, true, t));
}

at::Tensor GPTNeoSelfAttentionImpl::forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache) {
  // The heads and the sequence length come from the projections' outputs (this rank's heads under tensor parallelism).
  const int64_t hd = o_.head_dim();
  auto heads = [&](const at::Tensor& t) { return t.view({t.size(0), t.size(1), -1, hd}).transpose(1, 2); };
  const at::Tensor q = heads(q_proj(x));
  at::Tensor k = heads(k_proj(x)), v = heads(v_proj(x));
  append_to_cache(cache, k, v);
  // GPT-Neo does not scale its scores (scale 1).
  const double dropout = is_training() ? o_.attention_dropout : 0.0;
  const at::Tensor context = attend(q, k, v, in, 1.0, dropout, is_training());
  return at::dropout(out_proj(context.transpose(1, 2).reshape({q.size(0), q.size(2), -1})), o_.resid_dropout,
                     is_training());
}

GPTNeoAttentionImpl::GPTNeoAttentionImpl(const GPTNeoOptions& o, const at::TensorOptions& t) {
  attention = register_module("attention", GPTNeoSelfAttention(o, t));
}

GPTNeoMLPImpl::GPTNeoMLPImpl(const GPTNeoOptions& o, const at::TensorOptions& t)
    : act_(o.activation_function), dropout_(o.resid_dropout) {
  c_fc = register_module("c_fc", Linear(o.hidden_size, o.intermediate_size, true, t));
  c_proj = register_module("c_proj", Linear(o.intermediate_size, o.hidden_size, true, t));
}

at::Tensor GPTNeoMLPImpl::forward(const at::Tensor& x) {
  return at::dropout(c_proj(hf_activation(act_, c_fc(x))), dropout_, is_training());
}

GPTNeoBlockImpl::GPTNeoBlockImpl(const GPTNeoOptions& o, bool local, const at::TensorOptions& t) : local_(local) {
  ln_1 = register_module("ln_1", Norm(o.hidden_size, NormType::kLayerNorm, o.layer_norm_epsilon, true, t));
  attn = register_module("attn", GPTNeoAttention(o, t));
  ln_2 = register_module("ln_2", Norm(o.hidden_size, NormType::kLayerNorm, o.layer_norm_epsilon, true, t));
  mlp = register_module("mlp", GPTNeoMLP(o, t));
}

at::Tensor GPTNeoBlockImpl::forward(const at::Tensor& x, const GlobalLocalInputs& in, LayerCache* cache) {
  const at::Tensor h = x + attn->attention(ln_1(x), local_ ? in.local : in.global, cache);
  return h + mlp(ln_2(h));
}

GPTNeoModelImpl::GPTNeoModelImpl(const GPTNeoOptions& o, const at::TensorOptions& t) {
  wte = register_module("wte", Embedding(o.vocab_size, o.hidden_size, t));
  wpe = register_module("wpe", Embedding(o.max_position_embeddings, o.hidden_size, t));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.num_layers; ++i) h->push_back(GPTNeoBlock(o, o.attention_layers[i] == "local", t));
  ln_f = register_module("ln_f", Norm(o.hidden_size, NormType::kLayerNorm, o.layer_norm_epsilon, true, t));
}

GPTNeoForCausalLMImpl::GPTNeoForCausalLMImpl(const GPTNeoOptions& o) : DecoderLM("transformer.h."), o_(o) {
  const at::TensorOptions t = at::TensorOptions().dtype(at::kFloat).device(at::Device(o.init_device));
  transformer = register_module("transformer", GPTNeoModel(o, t));
}

at::Tensor GPTNeoForCausalLMImpl::embed(const at::Tensor& ids, const DecoderCall& call) {
  const at::Tensor x = transformer->wte(ids) + transformer->wpe(call.positions);
  return at::dropout(x, o_.embed_dropout, is_training());
}

double GPTNeoForCausalLMImpl::flops_per_token(int64_t seq_len) const {
  const int64_t n = num_params() - o_.max_position_embeddings * o_.hidden_size;
  double attention = 0;
  for (const std::string& kind : o_.attention_layers) {
    const int64_t keys = kind == "local" ? std::min(seq_len, o_.window_size) : seq_len;
    attention += 12.0 * static_cast<double>(o_.hidden_size) * static_cast<double>(keys);
  }
  return 6.0 * static_cast<double>(n) + attention;
}

void GPTNeoForCausalLMImpl::init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select) {
  init_like_transformers(*this, seed, o_.initializer_range, select, std::nullopt);
}

std::shared_ptr<CausalLM> GPTNeoForCausalLMImpl::rebuild(const std::string& device,
                                                         std::optional<uint64_t> seed) const {
  GPTNeoOptions o = o_;
  o.init_device = device;
  return seed ? build_gpt_neo(o, *seed).ptr() : GPTNeoForCausalLM(o).ptr();
}

std::string GPTNeoForCausalLMImpl::describe() const {
  int64_t local = 0;
  for (const std::string& kind : o_.attention_layers) local += kind == "local" ? 1 : 0;
  return fmt::format(
      "gpt_neo: hidden {}, heads {} (head_dim {}), layers {} ({} local, window {}), ffn {}, vocab {}, {}",
      o_.hidden_size, o_.num_heads, o_.head_dim(), o_.num_layers, local, o_.window_size, o_.intermediate_size,
      o_.vocab_size, o_.activation_function);
}

GPTNeoForCausalLM build_gpt_neo(const GPTNeoOptions& options, uint64_t seed) {
  return build_initialised<GPTNeoForCausalLM>(options, seed);
}

TensorParallelPlan GPTNeoForCausalLMImpl::tensor_parallel_plan(int64_t degree) const {
  check_tensor_parallel_split(degree, "GPT-Neo", o_.num_heads, o_.num_heads, o_.intermediate_size);
  TensorParallelPlan plan;
  plan.vocabulary(o_.vocab_size, degree, "", "transformer.wte");  // the head is tied
  for (int64_t i = 0; i < o_.num_layers; ++i) {
    const std::string p = fmt::format("transformer.h.{}.", i);
    plan.layer(p, {"ln_1", "ln_2"},
               {"attn.attention.q_proj", "attn.attention.k_proj", "attn.attention.v_proj", "mlp.c_fc"},
               {"attn.attention.out_proj", "mlp.c_proj"});
  }
  return plan;
}

}  // namespace tessera::models
