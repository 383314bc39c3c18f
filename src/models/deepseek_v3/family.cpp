// DeepSeek-V3's entries: the `deepseek_v3` recipe and its model_type.
#include "tessera/models/family.h"
#include "models/deepseek_v3/deepseek_v3.h"

namespace tessera::models {

void register_family_deepseek_v3(FamilyRegistrar& r) {
  add_keyed_family<DeepseekV3ForCausalLM>(r, deepseek_v3_keys());
  r.config_forms["deepseek_v3"] = {.rope = HfConfigForm::Rope{}};  // transformers 5: rope_parameters
}

}  // namespace tessera::models
