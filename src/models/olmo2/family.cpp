// OLMo 2's entries: the `olmo2` recipe and the model_types olmo2 and olmo3.
#include "tessera/models/family.h"
#include "models/olmo2/olmo2.h"

namespace tessera::models {

void register_family_olmo2(FamilyRegistrar& r) {
  add_recipe_family<Olmo2Options>(r.recipes, "olmo2", &parse_olmo2_options, &build_olmo2);
  for (const char* type : {"olmo2", "olmo3"}) {
    r.model_types.add(type, hf_builder(&olmo2_options_from_hf_config, &build_olmo2));
    r.config_forms[type] = {.rope = HfConfigForm::Rope{}};  // transformers 5: rope_parameters
  }
}

}  // namespace tessera::models
