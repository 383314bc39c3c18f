// StarCoder2's entries: the `starcoder2` recipe and its model_type.
#include "tessera/models/family.h"
#include "models/starcoder2/starcoder2.h"

namespace tessera::models {

void register_family_starcoder2(FamilyRegistrar& r) {
  add_recipe_family<Starcoder2Options>(r.recipes, "starcoder2", &parse_starcoder2_options, &build_starcoder2);
  r.model_types.add("starcoder2", hf_builder(&starcoder2_options_from_hf_config, &build_starcoder2));
  r.config_forms["starcoder2"] = {.rope = HfConfigForm::Rope{}};  // transformers 5: rope_parameters
}

}  // namespace tessera::models
