// GPT-NeoX's entries: the `gpt_neox` recipe and its model_type.
#include "tessera/models/family.h"
#include "models/gpt_neox/gpt_neox.h"

namespace tessera::models {

void register_family_gpt_neox(FamilyRegistrar& r) {
  add_recipe_family<GPTNeoXOptions>(r.recipes, "gpt_neox", &parse_gpt_neox_options, &build_gpt_neox);
  // A tied head is stored as embed_out.weight; older transformers saved mask and rotary buffers beside the weights.
  r.model_types.add(
      "gpt_neox", hf_builder(&gpt_neox_options_from_hf_config, &build_gpt_neox),
      HfAdapter{.tied_head = "embed_out.weight",
                .dropped_buffers = {".attention.bias", ".attention.masked_bias", ".rotary_emb.inv_freq"}});
  r.config_forms["gpt_neox"] = {.rope =
                                    HfConfigForm::Rope{.theta_key = "rotary_emb_base", .partial_key = "rotary_pct"}};
}

}  // namespace tessera::models
