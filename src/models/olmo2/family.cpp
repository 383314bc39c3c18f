// OLMo 2's entries: the `olmo2` recipe and the model_types olmo2 and olmo3.
#include "tessera/models/family.h"
#include "models/olmo2/olmo2.h"

namespace tessera::models {

void register_family_olmo2(FamilyRegistrar& r) {
  add_keyed_family<Olmo2ForCausalLM>(r, olmo2_keys());
  for (const char* type : {"olmo2", "olmo3"}) r.config_forms[type] = {.rope = HfConfigForm::Rope{}};  // rope_parameters
}

}  // namespace tessera::models
