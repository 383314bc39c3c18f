// How a model family joins Tessera: its folder src/models/<family>/ defines register_family_<family>() in its
// family.cpp, which adds the family's recipe names (`model.name`) to the model registry and its config.json
// model_types, with their folders' layouts, to the HF model_type registry (causal_lm.h). The build finds the folder
// and calls it (src/CMakeLists.txt generates the list), so no code outside the folder names the family.
// docs/models.md walks through adding one.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tessera/config/reader.h"
#include "tessera/models/causal_lm.h"
#include "tessera/models/family_keys.h"
#include "tessera/models/family_support.h"

namespace tessera::models {

// The registries a family adds itself to. Registration runs once, when either registry is first used.
struct FamilyRegistrar {
  ModelRegistry& recipes;
  HfModelTypeRegistry& model_types;
  // How transformers 5 writes each model_type's config.json, where it differs from transformers 4's form
  // (family_support.h).
  std::map<std::string, HfConfigForm>& config_forms;
};

// Calls every built-in family's register_family_<family>() (generated from the family folders).
void register_builtin_families(FamilyRegistrar& r);

// Adds recipe name `name`: `parse` reads the section into the family's Options (which have max_position_embeddings
// and init_device), and `build` makes the model from them and a seed.
template <class Options, class Model>
void add_recipe_family(ModelRegistry& r, const std::string& name, std::function<Options(config::Section&)> parse,
                       Model (*build)(const Options&, uint64_t)) {
  r.add(
      name,
      [name, parse](config::Section& s) {
        const Options o = parse(s);
        s.finish();
        return ModelOptions{name, o, o.max_position_embeddings, o.init_device, {}};
      },
      [build](const ModelOptions& m, const std::string& device, uint64_t seed) -> std::shared_ptr<CausalLM> {
        Options o = std::any_cast<const Options&>(m.options);
        o.init_device = device;
        return build(o, seed).ptr();
      });
}

// The builder of a model_type whose config.json `read` turns into the family's Options: the model allocated only
// (no seed), or `build` from a seed.
template <class Options, class Model>
HfConfigBuilder hf_builder(Options (*read)(const nlohmann::json&, const std::string&),
                           Model (*build)(const Options&, uint64_t)) {
  return [read, build](const nlohmann::json& config, const std::string& where, const std::string& device,
                       std::optional<uint64_t> seed) -> std::shared_ptr<CausalLM> {
    Options o = read(config, where);
    o.init_device = device;
    return seed ? build(o, *seed).ptr() : Model(o).ptr();
  };
}

// A multimodal model_type whose folders transformers' AutoModelForCausalLM loads as their text model (a
// *ForConditionalGeneration saved with the text model's config in text_config and its weights under another prefix):
// registers `type` to build the text model, of text_config's model_type `text.text_model_type`, and to read its
// weights through `text` (HfAdapter). The wrapper's own keys besides text_config must be `inert` (image token ids, the
// vision tower's config): any other is refused by name; a tie_word_embeddings there must agree with text_config's.
void add_multimodal_text_model(FamilyRegistrar& r, const std::string& type, HfAdapter text,
                               const std::set<std::string>& inert);

// What add_keyed_family() registers besides the key table's model_types.
struct KeyedFamily {
  std::vector<std::string> recipes{};  // recipe model.names; empty: the table's first model_type
  bool recipe_is_model_type = false;   // each recipe name reads as that model_type (Gemma's gemma2, gemma3_text)
  HfAdapter adapter{};                 // every model_type's folder layout
};

// Registers a family whose key table is its spec (family_keys.h): the recipe names of `entries`, parsed by the table,
// and every model_type of the table, read from config.json by it; each builds `Model` (the family's module holder)
// from the options, initialised from the seed unless on meta.
template <class Model, class Options>
void add_keyed_family(FamilyRegistrar& r, const FamilyKeys<Options>& keys, KeyedFamily entries = {}) {
  if (entries.recipes.empty()) entries.recipes = {keys.model_types().front()};
  for (const std::string& name : entries.recipes) {
    const std::string type = entries.recipe_is_model_type ? name : "";
    add_recipe_family<Options>(
        r.recipes, name, [&keys, type](config::Section& s) { return keys.parse(s, type); },
        &build_initialised<Model, Options>);
  }
  for (const std::string& type : keys.model_types()) {
    r.model_types.add(
        type,
        [&keys](const nlohmann::json& config, const std::string& where, const std::string& device,
                std::optional<uint64_t> seed) -> std::shared_ptr<CausalLM> {
          Options o = keys.from_hf(config, where);
          o.init_device = device;
          return seed ? build_initialised<Model>(o, *seed).ptr() : Model(o).ptr();
        },
        entries.adapter);
  }
}

}  // namespace tessera::models
