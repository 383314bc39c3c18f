// Nemotron's entries: the `nemotron` recipe and its model_type.
#include "tessera/models/family.h"
#include "models/nemotron/nemotron.h"

namespace tessera::models {

void register_family_nemotron(FamilyRegistrar& r) {
  add_keyed_family<NemotronForCausalLM>(r, nemotron_keys());
  // transformers 5: rope_parameters, with partial_rotary_factor inside it.
  r.config_forms["nemotron"] = {.rope = HfConfigForm::Rope{.partial_key = "partial_rotary_factor", .scaling = false}};
}

}  // namespace tessera::models
