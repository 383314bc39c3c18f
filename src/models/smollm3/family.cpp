// SmolLM3's entries: the `smollm3` recipe and its model_type.
#include "tessera/models/family.h"
#include "models/smollm3/smollm3.h"

namespace tessera::models {

void register_family_smollm3(FamilyRegistrar& r) {
  add_recipe_family<SmolLM3Options>(r.recipes, "smollm3", &parse_smollm3_options, &build_smollm3);
  r.model_types.add("smollm3", hf_builder(&smollm3_options_from_hf_config, &build_smollm3));
  r.config_forms["smollm3"] = {.rope = HfConfigForm::Rope{}};  // transformers 5: rope_parameters
}

}  // namespace tessera::models
