// What the model families share when they read their options and number their units: the config.json keys a
// transformers config class reads, parsed through the family's own recipe reader (so config.json and recipes are
// validated by the same code), rope_scaling of the default or linear kind, and the unit of a layer's parameter.
// Included by the families' sources only.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <set>
#include <string>

#include "tessera/config/reader.h"

namespace tessera::models {

// The keys of config.json `raw` that the family's transformers config class reads (`keys`). A null is left out (the
// key takes transformers' default), except for token ids and soft-caps, where it means "none". A list of token ids
// (Llama 3.1's eos_token_id) becomes null: the families hold one id.
nlohmann::json hf_config_keys(const nlohmann::json& raw, const std::set<std::string>& keys);

// Parses `cfg` (hf_config_keys()) as a recipe section through `parse`, which reads the family's options from it;
// then every key must have been read. A ConfigError, an unread key or an unsupported value becomes Error("hf")
// naming `where` (the config.json's path) and the key.
void read_hf_config(const nlohmann::json& cfg, const std::string& where,
                    const std::function<void(config::Section&)>& parse);

// rope_scaling of the default or linear kind ({rope_type or type, factor}): the linear factor, 1 when the section is
// absent or default. Other kinds are refused naming `family`.
double read_linear_rope_scaling(config::Section& s, const std::string& family);

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
