// StarCoder2's entries: the `starcoder2` recipe and its model_type.
#include "tessera/models/family.h"
#include "models/starcoder2/starcoder2.h"

namespace tessera::models {

void register_family_starcoder2(FamilyRegistrar& r) {
  add_keyed_family<Starcoder2ForCausalLM>(r, starcoder2_keys());
  r.config_forms["starcoder2"] = {.rope = HfConfigForm::Rope{}};  // transformers 5: rope_parameters
}

}  // namespace tessera::models
