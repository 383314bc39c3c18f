// Phi-3's entries: the `phi3` recipe and its model_type.
#include "tessera/models/family.h"
#include "models/phi3/phi3.h"

namespace tessera::models {

void register_family_phi3(FamilyRegistrar& r) {
  add_keyed_family<Phi3ForCausalLM>(r, phi3_keys());
  // transformers 5 overwrites rope_parameters' copy of original_max_position_embeddings with the top-level one.
  r.config_forms["phi3"] = {.rope = HfConfigForm::Rope{.partial_key = "partial_rotary_factor"},
                            .rope_ignored = {"original_max_position_embeddings"}};
}

}  // namespace tessera::models
