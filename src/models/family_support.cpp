// Shared option reading and unit numbering for the model families (family_support.h).
#include "tessera/models/family_support.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "tessera/config/value.h"
#include "tessera/models/family.h"
#include "tessera/util/error.h"

namespace tessera::models {
namespace {

// Keys no causal LM's logits depend on, whatever their value: what wrote the file, output switches, token ids, the
// settings of other heads (classification, summaries) and of generate(), initialisation, memory savers; transformers
// ignores the rest of its history (torchscript, use_bfloat16, ...). Nested transformers 5 sub-configs (DBRX's, MPT's
// attn_config) carry PretrainedConfig's fields too, model_type among them.
const std::set<std::string> kInertKeys = {"_name_or_path",
                                          "_commit_hash",
                                          "_attn_implementation",
                                          "_attn_implementation_autoset",
                                          "attn_implementation",
                                          "architectures",
                                          "auto_map",
                                          "custom_pipelines",
                                          "model_type",
                                          "transformers_version",
                                          "torch_dtype",
                                          "dtype",
                                          "use_bfloat16",
                                          "torchscript",
                                          "tf_legacy_loss",
                                          "tokenizer_class",
                                          "prefix",
                                          "task_specific_params",
                                          "use_cache",
                                          "output_attentions",
                                          "output_hidden_states",
                                          "return_dict",
                                          "output_scores",
                                          "return_dict_in_generate",
                                          "bos_token_id",
                                          "eos_token_id",
                                          "pad_token_id",
                                          "sep_token_id",
                                          "decoder_start_token_id",
                                          "id2label",
                                          "label2id",
                                          "num_labels",
                                          "problem_type",
                                          "finetuning_task",
                                          "classifier_dropout",
                                          "summary_type",
                                          "summary_use_proj",
                                          "summary_activation",
                                          "summary_proj_to_labels",
                                          "summary_first_dropout",
                                          "max_length",
                                          "min_length",
                                          "do_sample",
                                          "early_stopping",
                                          "num_beams",
                                          "num_beam_groups",
                                          "diversity_penalty",
                                          "temperature",
                                          "top_k",
                                          "top_p",
                                          "typical_p",
                                          "repetition_penalty",
                                          "length_penalty",
                                          "no_repeat_ngram_size",
                                          "encoder_no_repeat_ngram_size",
                                          "bad_words_ids",
                                          "num_return_sequences",
                                          "forced_bos_token_id",
                                          "forced_eos_token_id",
                                          "remove_invalid_values",
                                          "exponential_decay_length_penalty",
                                          "suppress_tokens",
                                          "begin_suppress_tokens",
                                          "cache_implementation",
                                          "initializer_range",
                                          "chunk_size_feed_forward",
                                          "gradient_checkpointing",
                                          "is_decoder"};

// Keys that change nothing at the value given here (the value every decoder-only config of the families has), and the
// model at any other.
bool inert_at_default(const std::string& key, const nlohmann::json& v) {
  static const std::map<std::string, nlohmann::json> kDefault = {
      {"is_encoder_decoder", false},  {"add_cross_attention", false},
      {"tie_encoder_decoder", false}, {"use_sliding_window", false},
      {"partial_rotary_factor", 1.0}, {"use_bidirectional_attention", false},
      {"prefix_lm", false},           {"pruned_heads", nlohmann::json::object()}};
  if (key == "layer_types" && v.is_array()) {  // every layer full attention: what the families without it compute
    return std::all_of(v.begin(), v.end(), [](const nlohmann::json& t) { return t == "full_attention"; });
  }
  const auto it = kDefault.find(key);
  return it != kDefault.end() && v == it->second;
}

std::string brief(const nlohmann::json& v) {
  std::string s = v.dump();
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

// transformers 5's rope_parameters (one flat object) written into transformers 4's keys of `type`'s class.
class RopeRewriter {
 public:
  RopeRewriter(nlohmann::json& cfg, std::string type, std::string where, std::vector<std::string> ignored)
      : cfg_(cfg), type_(std::move(type)), where_(std::move(where)), ignored_(std::move(ignored)) {}

  // `params` (at `name` in config.json) as `rope` says: rope_theta -> theta_key (in theta_section when set),
  // partial_rotary_factor -> partial_key (none: it must be 1), the rest -> rope_scaling unless it says only rope_type
  // default (scaling false: it must).
  void flat(const nlohmann::json& params, const std::string& name, const HfConfigForm::Rope& rope) {
    const std::string& theta_key = rope.theta_key;
    const std::string& partial_key = rope.partial_key;
    const std::string& section = rope.theta_section;
    const bool scaling = rope.scaling;
    if (!params.is_object()) fail(name, "expected an object, got " + brief(params));
    nlohmann::json rest = params;
    if (rest.contains("rope_theta")) {
      put(section, theta_key, rest["rope_theta"], name + ".rope_theta");
      rest.erase("rope_theta");
    }
    if (rest.contains("partial_rotary_factor")) {
      const nlohmann::json& f = rest["partial_rotary_factor"];
      if (!partial_key.empty()) {
        put("", partial_key, f, name + ".partial_rotary_factor");
      } else if (!f.is_null() && f != 1.0) {
        fail(name + ".partial_rotary_factor", brief(f) + " is not read by Tessera's " + type_ +
                                                  ", which rotates every dimension of a head; it changes "
                                                  "the model");
      }
      rest.erase("partial_rotary_factor");
    }
    for (const std::string& key : ignored_) rest.erase(key);
    // Only {rope_type: default} (or its older name, type) left: no scaling. Anything else goes to the family's reader
    // of rope_scaling, which refuses what it does not compute by name.
    bool plain = true;
    for (const auto& [k, v] : rest.items()) plain = plain && (k == "rope_type" || k == "type") && v == "default";
    if (plain) return;
    if (!scaling) {
      fail(name, brief(params) + ": Tessera's " + type_ +
                     " computes rope_type default only (rope_theta and no scaling); it changes the model");
    }
    put("", "rope_scaling", rest, name);
  }

  [[noreturn]] void fail(const std::string& key, const std::string& message) const {
    throw Error("hf", fmt::format("{}: {}: {}", where_, key, message));
  }

 private:
  // cfg[section][key] = v, refused when transformers 4's own key already holds another value.
  void put(const std::string& section, const std::string& key, const nlohmann::json& v, const std::string& from) {
    if (!section.empty() && (!cfg_.contains(section) || cfg_[section].is_null())) {
      cfg_[section] = nlohmann::json::object();
    }
    nlohmann::json& into = section.empty() ? cfg_ : cfg_[section];
    if (!into.is_object()) fail(section, "expected an object, got " + brief(into));
    const std::string name = section.empty() ? key : section + "." + key;
    if (into.contains(key) && !into[key].is_null() && into[key] != v) {
      fail(from, fmt::format("{} disagrees with {} ({}): transformers 5 reads the first, transformers 4 the second",
                             brief(v), name, brief(into[key])));
    }
    into[key] = v;
  }

  nlohmann::json& cfg_;
  std::string type_;
  std::string where_;
  std::vector<std::string> ignored_;
};

}  // namespace

nlohmann::json hf_config_v4(const nlohmann::json& raw, const std::string& where) {
  if (!raw.is_object()) return raw;
  nlohmann::json cfg = raw;
  const std::string type = raw.value("model_type", "");
  if (cfg.contains("dtype")) {  // transformers 5 keeps dtype when both are given
    if (!cfg["dtype"].is_null()) cfg["torch_dtype"] = cfg["dtype"];
    cfg.erase("dtype");
  }
  static const HfConfigForm kNone;
  const auto& forms = hf_config_forms();
  const auto found = forms.find(type);
  const HfConfigForm& form = found == forms.end() ? kNone : found->second;
  RopeRewriter rope(cfg, type, where, form.rope_ignored);
  for (const auto& [from, to] : form.renamed) {
    if (!cfg.contains(from)) continue;
    const nlohmann::json n = cfg[from];
    cfg.erase(from);
    if (cfg.contains(to) && !cfg[to].is_null() && cfg[to] != n) {
      rope.fail(from, fmt::format("{} disagrees with {} ({}), its other name", brief(n), to, brief(cfg[to])));
    }
    cfg[to] = n;
  }
  if (!cfg.contains("rope_parameters")) return cfg;
  const nlohmann::json params = cfg["rope_parameters"];
  if (params.is_null()) {
    cfg.erase("rope_parameters");
    return cfg;
  }
  // A family without rotary embeddings keeps the key, which refuse_unread_hf_keys() then names.
  if (!form.rope && form.rope_per_layer_type.empty()) return cfg;
  cfg.erase("rope_parameters");
  // Parameters per layer type are keyed by transformers' layer types (full_attention, sliding_attention, ...).
  bool nested = false;
  if (params.is_object()) {
    for (const auto& [key, p] : params.items()) nested = nested || key.ends_with("_attention");
  }
  if (!form.rope_per_layer_type.empty()) {
    // One parameter set per layer type (Gemma 3: the full-attention layers', which may scale, and the sliding
    // layers', default with their own base); transformers fills in a missing one with its defaults.
    std::string expected;
    for (const auto& [layer, r] : form.rope_per_layer_type) {
      expected += fmt::format("{}\"{}\": {{...}}", expected.empty() ? "" : ", ", layer);
    }
    if (!nested) rope.fail("rope_parameters", "expected {" + expected + "}, got " + brief(params));
    for (const auto& [layer, p] : params.items()) {
      const auto r = form.rope_per_layer_type.find(layer);
      if (r == form.rope_per_layer_type.end()) {
        std::string types;
        for (const auto& [known, unused] : form.rope_per_layer_type) types += (types.empty() ? "" : ", ") + known;
        rope.fail("rope_parameters." + layer, fmt::format("not a layer type of {} ({})", type, types));
      }
      if (!p.is_null()) rope.flat(p, "rope_parameters." + layer, r->second);
    }
  } else if (nested) {
    rope.fail("rope_parameters", brief(params) + ": rotary parameters per layer type are not read by Tessera's " +
                                     type + ", which has one rotary table; they change the model");
  } else {
    rope.flat(params, "rope_parameters", *form.rope);
  }
  return cfg;
}

nlohmann::ordered_json hf_config_v5(const nlohmann::ordered_json& v4) {
  if (!v4.is_object()) return v4;
  nlohmann::ordered_json out = v4;
  if (out.contains("torch_dtype")) {
    const nlohmann::ordered_json dtype = out["torch_dtype"];
    out.erase("torch_dtype");
    out["dtype"] = dtype;
  }
  const auto& forms = hf_config_forms();
  const auto found = forms.find(out.value("model_type", ""));
  if (found == forms.end()) return out;
  const HfConfigForm& form = found->second;
  for (const auto& [v5_name, v4_name] : form.renamed) {
    if (!out.contains(v4_name)) continue;
    const nlohmann::ordered_json v = out[v4_name];
    out.erase(v4_name);
    out[v5_name] = v;
  }
  // One parameter set from `rope`'s keys (taken out of the top level), with rope_scaling's keys when it scales.
  auto params_of = [&out](const HfConfigForm::Rope& rope) {
    nlohmann::ordered_json p = nlohmann::ordered_json::object();
    const bool top = rope.theta_section.empty();
    const nlohmann::ordered_json* holder = top ? &out : nullptr;
    if (!top && out.contains(rope.theta_section) && out[rope.theta_section].is_object()) {
      holder = &out[rope.theta_section];  // DBRX's attn_config keeps its rope_theta: transformers 5 reads it there
    }
    if (holder != nullptr && holder->contains(rope.theta_key) && !(*holder)[rope.theta_key].is_null()) {
      p["rope_theta"] = (*holder)[rope.theta_key];
    }
    if (top) out.erase(rope.theta_key);
    if (!rope.partial_key.empty() && out.contains(rope.partial_key)) {
      if (!out[rope.partial_key].is_null()) p["partial_rotary_factor"] = out[rope.partial_key];
      out.erase(rope.partial_key);
    }
    if (rope.scaling && out.contains("rope_scaling") && out["rope_scaling"].is_object()) {
      for (const auto& [k, v] : out["rope_scaling"].items()) p[k == "type" ? "rope_type" : k] = v;
    }
    if (!p.contains("rope_type")) p["rope_type"] = "default";
    return p;
  };
  if (form.rope) {
    nlohmann::ordered_json p = params_of(*form.rope);
    out.erase("rope_scaling");
    out["rope_parameters"] = std::move(p);
  } else if (!form.rope_per_layer_type.empty()) {
    nlohmann::ordered_json all = nlohmann::ordered_json::object();
    for (const auto& [layer, rope] : form.rope_per_layer_type) all[layer] = params_of(rope);
    out.erase("rope_scaling");
    out["rope_parameters"] = std::move(all);
  }
  return out;
}

nlohmann::ordered_json hf_config_for(const nlohmann::ordered_json& v4, int version) {
  if (version != 4) return hf_config_v5(v4);
  const auto& forms = hf_config_forms();
  const auto found = forms.find(v4.value("model_type", ""));
  if (found == forms.end() || !found->second.rope || found->second.rope->theta_section.empty()) return v4;
  nlohmann::ordered_json out = v4;
  out["rope_parameters"] = hf_config_v5(v4)["rope_parameters"];
  return out;
}

void refuse_unread_hf_keys(const nlohmann::json& config, const std::set<std::string>& read,
                           const std::set<std::string>& accepted, const std::string& where, const std::string& family,
                           const std::string& prefix) {
  if (!config.is_object()) return;
  for (const auto& [k, v] : config.items()) {
    if (read.count(k) || accepted.count(k) || kInertKeys.count(k) || v.is_null()) continue;
    if (inert_at_default(k, v)) continue;
    throw Error("hf", fmt::format("{}: {}{}: {} is not read by Tessera's {}, and it can change the model: Tessera "
                                  "refuses it rather than compute another model (if transformers ignores the key "
                                  "too, remove it from config.json)",
                                  where, prefix, k, brief(v), family));
  }
}

nlohmann::json hf_config_keys(const nlohmann::json& raw, const std::set<std::string>& keys, const std::string& where,
                              const std::set<std::string>& accepted, const std::set<std::string>& nullable) {
  const nlohmann::json v4 = hf_config_v4(raw, where);
  refuse_unread_hf_keys(v4, keys, accepted, where, raw.value("model_type", ""));
  nlohmann::json cfg = nlohmann::json::object();
  for (const auto& [k, v] : v4.items()) {
    // A null means "none" for the family's optional fields; elsewhere it is the key left out (transformers' default).
    if (keys.count(k) && (!v.is_null() || nullable.count(k))) cfg[k] = v;
  }
  for (const char* id : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    if (cfg.contains(id) && cfg[id].is_array()) cfg[id] = nullptr;
  }
  return cfg;
}

void read_hf_config(const nlohmann::json& cfg, const std::string& where,
                    const std::function<void(config::Section&)>& parse) {
  config::Origin origin;
  origin.file = where;
  config::Value v = config::parse_yaml(cfg.dump(), origin);
  config::ParseContext ctx(where);
  config::Section s(&v, "", ctx);
  try {
    parse(s);
    s.finish();
    ctx.throw_if_unsupported();
  } catch (const ConfigError& e) {
    // A config.json of transformers 5 gave rope_scaling's keys in rope_parameters (hf_config_v4()).
    const bool rope = e.message().find("rope_scaling") != std::string::npos;
    throw Error("hf", e.message() + (rope ? " (transformers 5 writes rope_scaling's keys in rope_parameters)" : ""));
  }
}

double read_linear_rope_scaling(config::Section& s, const std::string& family) {
  if (!s.has("rope_scaling")) return 1.0;
  config::Section r = s.section("rope_scaling");
  const std::string type = r.get_optional_string("rope_type").value_or(r.get_string("type", "default"));
  r.check(type == "default" || type == "linear", "rope_type",
          "expected default or linear (Tessera's " + family + " computes no other scaling), got " + type);
  const double factor = r.get_double("factor", 1.0);
  r.check(factor > 0, "factor", "must be positive");
  r.finish();
  return type == "linear" ? factor : 1.0;
}

int64_t layer_unit(const std::string& name, const std::string& prefix) {
  if (name.rfind(prefix, 0) != 0) return 0;
  return std::stoll(name.substr(prefix.size(), name.find('.', prefix.size()) - prefix.size())) + 1;
}

void refuse_tensor_parallel(int64_t degree, const std::string& why) {
  throw ConfigError("models", fmt::format("tensor_parallel_degree {}: {}", degree, why));
}

void check_tensor_parallel_split(int64_t degree, const std::string& family, int64_t heads, int64_t kv_heads,
                                 int64_t hidden) {
  if (heads % degree != 0 || kv_heads % degree != 0) {
    refuse_tensor_parallel(degree, fmt::format("{}'s {} attention and {} key/value heads do not split into {} equal "
                                               "shares",
                                               family, heads, kv_heads, degree));
  }
  if (hidden % degree != 0) {
    refuse_tensor_parallel(degree,
                           fmt::format("the MLP's {} hidden units do not split into {} equal shares", hidden, degree));
  }
}

void add_multimodal_text_model(FamilyRegistrar& r, const std::string& type, HfAdapter text,
                               const std::set<std::string>& inert) {
  const std::string text_type = text.text_model_type;
  r.model_types.add(
      type,
      [type, text_type, inert](const nlohmann::json& config, const std::string& where, const std::string& device,
                               std::optional<uint64_t> seed) -> std::shared_ptr<CausalLM> {
        for (const auto& [k, v] : config.items()) {
          if (k == "text_config" || k == "tie_word_embeddings" || inert.count(k) || kInertKeys.count(k)) continue;
          throw Error("hf", fmt::format("{}: {}: {} is not read by Tessera, which reads a {} folder's text model "
                                        "(text_config) only, and it can change the model",
                                        where, k, brief(v), type));
        }
        if (!config.contains("text_config") || !config["text_config"].is_object()) {
          throw Error("hf", fmt::format("{}: a {} config.json holds its text model's config in text_config, a mapping",
                                        where, type));
        }
        nlohmann::json t = config["text_config"];
        const std::string stated = t.value("model_type", text_type);
        if (stated != text_type) {
          throw Error("hf", fmt::format("{}: text_config.model_type is \"{}\"; a {} folder's text model is {}", where,
                                        stated, type, text_type));
        }
        t["model_type"] = text_type;
        if (config.contains("tie_word_embeddings") && !config["tie_word_embeddings"].is_null()) {
          const nlohmann::json& tie = config["tie_word_embeddings"];
          if (t.contains("tie_word_embeddings") && !t["tie_word_embeddings"].is_null() &&
              t["tie_word_embeddings"] != tie) {
            throw Error("hf", fmt::format("{}: tie_word_embeddings ({}) differs from text_config's ({})", where,
                                          tie.dump(), t["tie_word_embeddings"].dump()));
          }
          t["tie_word_embeddings"] = tie;
        }
        return hf_model_type_registry().build(t, where + " (text_config)", device, seed);
      },
      std::move(text));
}

}  // namespace tessera::models
