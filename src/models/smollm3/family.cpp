// SmolLM3's entries: the `smollm3` recipe and its model_type.
#include "tessera/models/family.h"
#include "models/smollm3/smollm3.h"

namespace tessera::models {

void register_family_smollm3(FamilyRegistrar& r) {
  add_keyed_family<SmolLM3ForCausalLM>(r, smollm3_keys());
  r.config_forms["smollm3"] = {.rope = HfConfigForm::Rope{}};  // transformers 5: rope_parameters
}

}  // namespace tessera::models
