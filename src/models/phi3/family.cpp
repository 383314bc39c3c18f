// Phi-3's entries: the `phi3` recipe and its model_type.
#include "tessera/models/family.h"
#include "models/phi3/phi3.h"

namespace tessera::models {

void register_family_phi3(FamilyRegistrar& r) {
  add_recipe_family<Phi3Options>(r.recipes, "phi3", &parse_phi3_options, &build_phi3);
  r.model_types.add("phi3", hf_builder(&phi3_options_from_hf_config, &build_phi3));
  // transformers 5 overwrites rope_parameters' copy of original_max_position_embeddings with the top-level one.
  r.config_forms["phi3"] = {.rope = HfConfigForm::Rope{.partial_key = "partial_rotary_factor"},
                            .rope_ignored = {"original_max_position_embeddings"}};
}

}  // namespace tessera::models
