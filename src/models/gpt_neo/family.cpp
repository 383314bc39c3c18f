// GPT-Neo's entries: the `gpt_neo` recipe and its model_type.
#include "tessera/models/family.h"
#include "models/gpt_neo/gpt_neo.h"

namespace tessera::models {

void register_family_gpt_neo(FamilyRegistrar& r) {
  add_recipe_family<GPTNeoOptions>(r.recipes, "gpt_neo", &parse_gpt_neo_options, &build_gpt_neo);
  // Older transformers saved the attention's causal-mask buffers beside the weights.
  r.model_types.add("gpt_neo", hf_builder(&gpt_neo_options_from_hf_config, &build_gpt_neo),
                    HfAdapter{.dropped_buffers = {".attn.attention.bias", ".attn.attention.masked_bias"}});
}

}  // namespace tessera::models
