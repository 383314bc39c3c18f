// What the model families share when they read their options and number their units: config.json in transformers
// 4's form (transformers 5's rewritten into it), the keys a transformers config class reads, the refusal of any other
// key that can change the model, parsed through the family's own recipe reader (so config.json and recipes are
// validated by the same code), rope_scaling of the default or linear kind, and the unit of a layer's parameter.
// Included by the families' sources only.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tessera/config/reader.h"

namespace tessera::models {

// How transformers 5 writes one model_type's config.json where it differs from transformers 4's form, which the
// families read: declared by the family that registers the model_type (FamilyRegistrar::config_forms, family.h) and
// applied by hf_config_v4().
struct HfConfigForm {
  // Where the keys of transformers 5's rope_parameters go.
  struct Rope {
    std::string theta_key = "rope_theta";  // rope_theta (GPT-NeoX: rotary_emb_base)
    std::string theta_section{};           // ... inside this sub-object (DBRX: attn_config); empty: top level
    std::string partial_key{};             // partial_rotary_factor; empty: the family rotates whole heads (1 only)
    bool scaling = true;                   // the rest becomes rope_scaling; false: only rope_type default is read
  };
  // A family with rotary embeddings reads rope_parameters (one object); nullopt: it keeps the key, which
  // refuse_unread_hf_keys() then names.
  std::optional<Rope> rope{};
  // One parameter set per layer type instead (Gemma 3: full_attention, sliding_attention).
  std::map<std::string, Rope> rope_per_layer_type{};
  // Keys of rope_parameters that transformers 5 fills in from elsewhere and no class reads there (Phi-3's copy of
  // original_max_position_embeddings).
  std::vector<std::string> rope_ignored{};
  // transformers 5's name of a key -> transformers 4's (Qwen3-MoE: num_local_experts -> num_experts).
  std::map<std::string, std::string> renamed{};
};

// The forms the families registered, by model_type (filled when the model registries are first used).
const std::map<std::string, HfConfigForm>& hf_config_forms();

// config.json `raw` in transformers 4's form, which the families read: transformers 5 writes the rotary settings as
// one `rope_parameters` object ({rope_theta, rope_type, partial_rotary_factor, factor, ...}, or one per layer type),
// `dtype` for `torch_dtype`, and some keys under new names; the model_type's HfConfigForm says where each goes. A
// config that gives a setting in both forms with different values, a partial rotary factor other than 1 for a family
// that rotates whole heads, and per-layer-type parameters for a family with one rotary table are refused
// (Error("hf") naming `where`, the config.json's path, and the key). A config in transformers 4's form comes back
// unchanged but for `dtype`.
nlohmann::json hf_config_v4(const nlohmann::json& raw, const std::string& where);

// A family's config.json (hf_config(), transformers 4's form) as transformers 5 writes it: `dtype` for
// `torch_dtype`, the model_type's renamed keys under their new names, and the rotary settings (its rope_theta,
// partial rotary factor and rope_scaling) as one rope_parameters object, or one per layer type: what hf_config_v4()
// reads back. transformers 4 does not read rope_parameters (it would take its default rope base: another model).
nlohmann::ordered_json hf_config_v5(const nlohmann::ordered_json& v4);

// config.json for transformers `version` (4 or 5) from a family's hf_config() (transformers 4's form): hf_config_v5()
// for 5; for 4 the form itself, except where transformers 5 takes the rotary base from rope_parameters only and 4
// from a sub-object (DBRX's attn_config.rope_theta): there rope_parameters is written too, so that both read it.
nlohmann::ordered_json hf_config_for(const nlohmann::ordered_json& v4, int version);

// Refuses (Error("hf") naming `where` and the key, `prefix` before it for a nested object) every key of `config`
// that is neither in `read` (what the family reads) nor in `accepted` (keys its transformers class does not read, or
// that Tessera reads otherwise) nor one that changes no causal LM's function: PretrainedConfig's bookkeeping, output
// switches, token ids, other heads' and generate()'s settings, initialisation; keys such as pruned_heads,
// add_cross_attention or use_sliding_window only at their default value; any key whose value is null. Whatever else
// a config.json carries may change the model (quantization_config, a rotary setting the family does not read, an
// alias transformers maps onto a field), so Tessera refuses it rather than compute another model. `family` names the
// family in the message (the model_type).
void refuse_unread_hf_keys(const nlohmann::json& config, const std::set<std::string>& read,
                           const std::set<std::string>& accepted, const std::string& where, const std::string& family,
                           const std::string& prefix = "");

// The keys of config.json `raw` (hf_config_v4() of it) that the family's transformers config class reads (`keys`),
// after refuse_unread_hf_keys() with `accepted`. A null is left out (the key takes transformers' default), except for
// the `nullable` keys (the family's optional fields: token ids, soft-caps, DeepSeek-V3's q_lora_rank), where it means
// "none". A list of token ids (Llama 3.1's eos_token_id) becomes null: the families hold one id.
nlohmann::json hf_config_keys(const nlohmann::json& raw, const std::set<std::string>& keys, const std::string& where,
                              const std::set<std::string>& accepted, const std::set<std::string>& nullable);

// Parses `cfg` (hf_config_keys()) as a recipe section through `parse`, which reads the family's options from it;
// then every key must have been read. A ConfigError, an unread key or an unsupported value becomes Error("hf")
// naming `where` (the config.json's path) and the key.
void read_hf_config(const nlohmann::json& cfg, const std::string& where,
                    const std::function<void(config::Section&)>& parse);

// rope_scaling of the default or linear kind ({rope_type or type, factor}): the linear factor, 1 when the section is
// absent or default. Other kinds are refused naming `family`.
double read_linear_rope_scaling(config::Section& s, const std::string& family);

// Refuses tensor parallelism over `degree` ranks for the family's reason `why`: ConfigError("models",
// "tensor_parallel_degree <degree>: <why>"), which the engine and the planner report naming the key.
[[noreturn]] void refuse_tensor_parallel(int64_t degree, const std::string& why);
// Refuses `degree` unless `heads` query and `kv_heads` key/value heads and `hidden` MLP units split into equal shares
// (`family` names the model in the message).
void check_tensor_parallel_split(int64_t degree, const std::string& family, int64_t heads, int64_t kv_heads,
                                 int64_t hidden);

// The unit of parameter `name` in a family whose decoder layers are named `prefix`{i}.…: i + 1; 0 (the root) for
// every other parameter.
int64_t layer_unit(const std::string& name, const std::string& prefix);

// A family's model built from its options on options.init_device and, unless that is meta, initialised from `seed`
// (the family's init_weights: transformers' scheme, each module from its own generator).
template <class Model, class Options>
Model build_initialised(const Options& options, uint64_t seed) {
  Model model(options);
  if (options.init_device != "meta") model->init_weights(seed);
  return model;
}

}  // namespace tessera::models
