// The model registry and the HF model_type registry, which every family fills in for itself (models/family.h).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "tessera/models/causal_lm.h"
#include "tessera/models/family.h"
#include "tessera/models/family_support.h"
#include "tessera/models/hf_causal_lm.h"
#include "tessera/util/error.h"

namespace tessera::models {
namespace {

struct Registries {
  ModelRegistry recipes{"model"};
  HfModelTypeRegistry model_types;
  std::map<std::string, HfConfigForm> config_forms;
};

// Both registries, filled once: every built-in family's entries, and hf_causal_lm.
Registries& registries() {
  static Registries* registries = [] {
    auto* out = new Registries;
    FamilyRegistrar families{out->recipes, out->model_types, out->config_forms};
    register_builtin_families(families);
    out->recipes.add(
        "hf_causal_lm",
        [](config::Section& s) {
          const HfCausalLMOptions o = parse_hf_causal_lm_options(s);
          const std::string where = o.folder + "/config.json";
          int64_t max_seq_len = 0;
          try {
            max_seq_len = build_from_hf_config(o.config, where, "meta")->max_seq_len();
          } catch (const Error& e) {
            s.fail("pretrained_model_name_or_path", e.message());
          }
          ModelOptions m{"hf_causal_lm", o, max_seq_len, o.init_device, {}};
          if (o.pretrained) m.pretrained_weights = o.folder;
          return m;
        },
        [](const ModelOptions& m, const std::string& device, uint64_t seed) -> std::shared_ptr<CausalLM> {
          const auto& o = std::any_cast<const HfCausalLMOptions&>(m.options);
          return build_from_hf_config(o.config, o.folder + "/config.json", device, seed);
        });
    out->recipes.add_foundry_names({"hf_t5", "hf_prefix_lm"});
    return out;
  }();
  return *registries;
}

}  // namespace

ModelRegistry& model_registry() {
  return registries().recipes;
}

bool HfAdapter::drops(const std::string& name) const {
  for (const std::string& suffix : dropped_buffers) {
    if (name.ends_with(suffix)) return true;
  }
  for (const std::string& prefix : ignored_prefixes) {
    if (name.starts_with(prefix)) return true;
  }
  return false;
}

std::string HfAdapter::stored_name(const std::string& param) const {
  const auto& [from, to] = text_prefix;
  if (from.empty() || !param.starts_with(from)) return param;
  return to + param.substr(from.size());
}

void HfModelTypeRegistry::add(const std::string& model_type, HfConfigBuilder build, HfAdapter adapter) {
  entries_[model_type] = Entry{std::move(build), std::move(adapter)};
}

bool HfModelTypeRegistry::contains(const std::string& model_type) const {
  return entries_.count(model_type) > 0;
}

std::vector<std::string> HfModelTypeRegistry::model_types() const {
  std::vector<std::string> out;
  for (const auto& [type, entry] : entries_) out.push_back(type);
  return out;
}

std::shared_ptr<CausalLM> HfModelTypeRegistry::build(const nlohmann::json& config, const std::string& where,
                                                     const std::string& device, std::optional<uint64_t> seed) const {
  const std::string type = config.is_object() ? config.value("model_type", "") : "";
  const auto it = entries_.find(type);
  if (it == entries_.end()) {
    throw Error(
        "hf", fmt::format("{}: model_type is \"{}\"; Tessera reads: {}", where, type, fmt::join(model_types(), ", ")));
  }
  return it->second.build(config, where, device, seed);
}

const HfAdapter& HfModelTypeRegistry::adapter(const std::string& model_type) const {
  static const HfAdapter kDefault;
  const auto it = entries_.find(model_type);
  return it == entries_.end() ? kDefault : it->second.adapter;
}

HfModelTypeRegistry& hf_model_type_registry() {
  return registries().model_types;
}

const std::map<std::string, HfConfigForm>& hf_config_forms() {
  return registries().config_forms;
}

std::shared_ptr<CausalLM> build_from_hf_config(const nlohmann::json& config, const std::string& where,
                                               const std::string& device, std::optional<uint64_t> seed) {
  return hf_model_type_registry().build(config, where, device, seed);
}

}  // namespace tessera::models
