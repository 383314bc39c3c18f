// The Llama family's entries: the `llama` recipe (its model_type key picks the variant) and the model_types it reads.
#include "tessera/models/family.h"
#include "models/llama/llama.h"

namespace tessera::models {

const std::vector<std::string>& llama_model_types() {
  static const std::vector<std::string> kTypes = {"llama",   "mistral",   "qwen2",    "qwen3",
                                                  "mixtral", "qwen2_moe", "qwen3_moe"};
  return kTypes;
}

void register_family_llama(FamilyRegistrar& r) {
  add_recipe_family<LlamaOptions>(r.recipes, "llama", &parse_llama_options, &build_llama);
  // transformers 5: rope_parameters as rope_theta and rope_scaling; Qwen3-MoE's expert count under Mixtral's name.
  for (const std::string& type : llama_model_types()) {
    r.model_types.add(type, hf_builder(&llama_options_from_hf_config, &build_llama));
    r.config_forms[type] = {.rope = HfConfigForm::Rope{}};
  }
  r.config_forms["qwen3_moe"].renamed = {{"num_local_experts", "num_experts"}};
}

}  // namespace tessera::models
