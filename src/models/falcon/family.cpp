// Falcon's entries: the `falcon` recipe and its model_type.
#include "tessera/models/family.h"
#include "models/falcon/falcon.h"

namespace tessera::models {

void register_family_falcon(FamilyRegistrar& r) {
  add_recipe_family<FalconOptions>(r.recipes, "falcon", &parse_falcon_options, &build_falcon);
  r.model_types.add("falcon", hf_builder(&falcon_options_from_hf_config, &build_falcon));
  r.config_forms["falcon"] = {.rope = HfConfigForm::Rope{}};
}

}  // namespace tessera::models
