// Falcon's entries: the `falcon` recipe and its model_type.
#include "tessera/models/family.h"
#include "models/falcon/falcon.h"

namespace tessera::models {

void register_family_falcon(FamilyRegistrar& r) {
  add_keyed_family<FalconForCausalLM>(r, falcon_keys());
  r.config_forms["falcon"] = {.rope = HfConfigForm::Rope{}};
}

}  // namespace tessera::models
