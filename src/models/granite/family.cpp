// Granite's entries: the `granite` recipe and its model_type.
#include "tessera/models/family.h"
#include "models/granite/granite.h"

namespace tessera::models {

void register_family_granite(FamilyRegistrar& r) {
  add_keyed_family<GraniteForCausalLM>(r, granite_keys());
  r.config_forms["granite"] = {.rope = HfConfigForm::Rope{}};  // transformers 5: rope_parameters
}

}  // namespace tessera::models
