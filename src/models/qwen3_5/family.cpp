// Qwen3.5's entries: the `qwen3_5` recipe and its text model's model_type, qwen3_5_text.
#include "tessera/models/family.h"
#include "models/qwen3_5/qwen3_5.h"

namespace tessera::models {

void register_family_qwen3_5(FamilyRegistrar& r) {
  add_keyed_family<Qwen35ForCausalLM>(r, qwen3_5_keys(), {.recipes = {"qwen3_5"}});
  // transformers 5's rope_parameters; mrope_section and mrope_interleaved place image and video positions, which a
  // text model never has (its three position rows are the same), so they change nothing here.
  r.config_forms["qwen3_5_text"] = {
      .rope = HfConfigForm::Rope{.partial_key = "partial_rotary_factor", .scaling = false},
      .rope_ignored = {"mrope_section", "mrope_interleaved"}};
}

}  // namespace tessera::models
