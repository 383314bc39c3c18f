// The GPT-Neo family: options (recipe and config.json, attention_types expanded as transformers expands them),
// modules with global and local (windowed) attention layers, initialisation.
#include "models/gpt_neo/gpt_neo.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "tessera/config/value.h"
#include "tessera/models/family_keys.h"
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

// GPTNeoConfig's keys (classifier_dropout only serves other heads).
const FamilyKeys<GPTNeoOptions>& gpt_neo_keys() {
  using O = GPTNeoOptions;
  static const FamilyKeys<O> keys =
      FamilyKeys<O>({"gpt_neo"}, [](const std::string&) { return "GPTNeoForCausalLM"; })
          .field("vocab_size", &O::vocab_size, positive())
          .field("max_position_embeddings", &O::max_position_embeddings, positive())
          .field("hidden_size", &O::hidden_size, positive())
          .field("num_layers", &O::num_hidden_layers, positive())
          .custom(
              "attention_types",
              [](config::Section& s, O& o) {
                o.attention_layers = expand_attention_types(s);
                s.check(static_cast<int64_t>(o.attention_layers.size()) == o.num_hidden_layers, "attention_types",
                        fmt::format("expands to {} layers, but num_layers is {} (transformers refuses this too)",
                                    o.attention_layers.size(), o.num_hidden_layers));
              },
              [](const O& o) { return o.attention_types(); })
          // A config.json also stores the expansion; transformers' PretrainedConfig then sets it over its own.
          .field("attention_layers", &O::attention_layers,
                 KeyCheck<std::vector<std::string>>([](const std::vector<std::string>& layers) {
                   for (const std::string& kind : layers) {
                     if (kind != "global" && kind != "local")
                       return fmt::format("each entry is \"global\" or \"local\", got \"{}\"", kind);
                   }
                   return std::string();
                 }))
          .field("num_heads", &O::num_attention_heads, positive())
          .divides("num_heads", &O::num_attention_heads, "hidden_size", &O::hidden_size)
          .resolved(
              "intermediate_size", &O::intermediate_size, [](const O& o) { return 4 * o.hidden_size; }, positive())
          .field("window_size", &O::window_size, positive())
          .field("activation_function", &O::activation_function, hf_activation_check())
          .field("resid_dropout", &O::resid_dropout, probability())
          .field("embed_dropout", &O::embed_dropout, probability())
          .field("attention_dropout", &O::attention_dropout, probability())
          .field("layer_norm_epsilon", &O::layer_norm_epsilon)
          .field("initializer_range", &O::initializer_range)
          .fixed("tie_word_embeddings", true, "Tessera's GPT-Neo ties its head to wte, as every published GPT-Neo does")
          .token_ids()
          .finally([](config::Section& s, O& o) {
            s.check(static_cast<int64_t>(o.attention_layers.size()) == o.num_hidden_layers, "attention_layers",
                    fmt::format("has {} entries for {} layers", o.attention_layers.size(), o.num_hidden_layers));
          });
  return keys;
}

// ---- Modules --------------------------------------------------------------------------------------------------------

GPTNeoAttentionImpl::GPTNeoAttentionImpl(const GPTNeoOptions& o, const at::TensorOptions& t) {
  // GPT-Neo does not scale its scores (scale 1).
  attention = register_module("attention", SelfAttention(SelfAttentionOptions{.hidden_size = o.hidden_size,
                                                                              .heads = o.num_attention_heads,
                                                                              .out_bias = true,
                                                                              .out_name = "out_proj",
                                                                              .kv_first = true,
                                                                              .scale = 1.0,
                                                                              .dropout = o.attention_dropout},
                                                         t));
}

GPTNeoMLPImpl::GPTNeoMLPImpl(const GPTNeoOptions& o, const at::TensorOptions& t)
    : act_(o.activation_function), dropout_(o.resid_dropout) {
  c_fc = register_module("c_fc", Linear(o.hidden_size, o.intermediate_size, true, t));
  c_proj = register_module("c_proj", Linear(o.intermediate_size, o.hidden_size, true, t));
}

at::Tensor GPTNeoMLPImpl::forward(const at::Tensor& x) {
  return at::dropout(c_proj(hf_activation(act_, c_fc(x))), dropout_, is_training());
}

GPTNeoBlockImpl::GPTNeoBlockImpl(const GPTNeoOptions& o, bool local, const at::TensorOptions& t)
    : local_(local), resid_dropout_(o.resid_dropout) {
  ln_1 = register_module("ln_1", Norm(o.hidden_size, NormType::kLayerNorm, o.layer_norm_epsilon, true, t));
  attn = register_module("attn", GPTNeoAttention(o, t));
  ln_2 = register_module("ln_2", Norm(o.hidden_size, NormType::kLayerNorm, o.layer_norm_epsilon, true, t));
  mlp = register_module("mlp", GPTNeoMLP(o, t));
}

at::Tensor GPTNeoBlockImpl::forward(const at::Tensor& x, const GlobalLocalInputs& in, LayerCache* cache) {
  const at::Tensor a = attn->attention(ln_1(x), local_ ? in.local : in.global, cache);
  const at::Tensor h = x + at::dropout(a, resid_dropout_, is_training());
  return h + mlp(ln_2(h));
}

GPTNeoForCausalLMImpl::GPTNeoForCausalLMImpl(const GPTNeoOptions& o)
    : HfDecoderLM(o, gpt_neo_keys(), HfDecoderLayout::gpt2()) {
  const at::TensorOptions t = tensor_options();
  build_backbone([&](int64_t i) { return GPTNeoBlock(o, o.attention_layers[i] == "local", t); },
                 Norm(o.hidden_size, NormType::kLayerNorm, o.layer_norm_epsilon, true, t));
  window_ = o.window_size;
}

at::Tensor GPTNeoForCausalLMImpl::embed(const at::Tensor& ids, const DecoderCall& call) {
  return at::dropout(HfDecoderLM::embed(ids, call), o_.embed_dropout, is_training());
}

void GPTNeoForCausalLMImpl::plan_layer(TensorParallelPlan& plan, const std::string& p, int64_t /*i*/) const {
  plan.layer(p, {"ln_1", "ln_2"},
             {"attn.attention.q_proj", "attn.attention.k_proj", "attn.attention.v_proj", "mlp.c_fc"},
             {"attn.attention.out_proj", "mlp.c_proj"});
}

std::string GPTNeoForCausalLMImpl::describe_more() const {
  const auto local = std::count(o_.attention_layers.begin(), o_.attention_layers.end(), "local");
  return fmt::format(", {} local layers (window {}), {}", local, o_.window_size, o_.activation_function);
}

}  // namespace tessera::models
