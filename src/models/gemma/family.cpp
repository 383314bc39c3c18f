// Gemma 2 and 3's entries: a recipe name per version, which is its model_type too.
#include "tessera/models/family.h"
#include "models/gemma/gemma.h"

#include <string>

namespace tessera::models {

void register_family_gemma(FamilyRegistrar& r) {
  add_keyed_family<GemmaForCausalLM>(r, gemma_keys(),
                                     {.recipes = {"gemma2", "gemma3_text"}, .recipe_is_model_type = true});
  // transformers 5: Gemma 3's rotary parameters per layer type, the sliding layers' base under its own key.
  r.config_forms["gemma2"] = {.rope = HfConfigForm::Rope{}};
  r.config_forms["gemma3_text"] = {
      .rope_per_layer_type = {
          {"full_attention", HfConfigForm::Rope{}},
          {"sliding_attention", HfConfigForm::Rope{.theta_key = "rope_local_base_freq", .scaling = false}}}};
}

}  // namespace tessera::models
