// Granite's entries: the `granite` recipe and its model_type.
#include "tessera/models/family.h"
#include "models/granite/granite.h"

namespace tessera::models {

void register_family_granite(FamilyRegistrar& r) {
  add_recipe_family<GraniteOptions>(r.recipes, "granite", &parse_granite_options, &build_granite);
  r.model_types.add("granite", hf_builder(&granite_options_from_hf_config, &build_granite));
  r.config_forms["granite"] = {.rope = HfConfigForm::Rope{}};  // transformers 5: rope_parameters
}

}  // namespace tessera::models
