// GLM-4's entries: the `glm4` recipe and its model_type.
#include "tessera/models/family.h"
#include "models/glm4/glm4.h"

namespace tessera::models {

void register_family_glm4(FamilyRegistrar& r) {
  add_keyed_family<Glm4ForCausalLM>(r, glm4_keys());
  // transformers 5: rope_parameters, with partial_rotary_factor inside it.
  r.config_forms["glm4"] = {.rope = HfConfigForm::Rope{.partial_key = "partial_rotary_factor", .scaling = false}};
}

}  // namespace tessera::models
