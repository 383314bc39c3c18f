// gpt-oss's entries: the `gpt_oss` recipe and its model_type.
#include "tessera/models/family.h"
#include "models/gpt_oss/gpt_oss.h"

namespace tessera::models {

void register_family_gpt_oss(FamilyRegistrar& r) {
  add_keyed_family<GptOssForCausalLM>(r, gpt_oss_keys());
  r.config_forms["gpt_oss"] = {.rope = HfConfigForm::Rope{}};  // transformers 5: rope_parameters
}

}  // namespace tessera::models
