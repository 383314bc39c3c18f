// GPT-BigCode's entries: the `gpt_bigcode` recipe and its model_type.
#include "tessera/models/family.h"
#include "models/gpt_bigcode/gpt_bigcode.h"

namespace tessera::models {

void register_family_gpt_bigcode(FamilyRegistrar& r) {
  add_recipe_family<GPTBigCodeOptions>(r.recipes, "gpt_bigcode", &parse_gpt_bigcode_options, &build_gpt_bigcode);
  r.model_types.add("gpt_bigcode", hf_builder(&gpt_bigcode_options_from_hf_config, &build_gpt_bigcode));
}

}  // namespace tessera::models
