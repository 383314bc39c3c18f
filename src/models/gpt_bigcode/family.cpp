// GPT-BigCode's entries: the `gpt_bigcode` recipe and its model_type.
#include "tessera/models/family.h"
#include "models/gpt_bigcode/gpt_bigcode.h"

namespace tessera::models {

void register_family_gpt_bigcode(FamilyRegistrar& r) {
  add_keyed_family<GPTBigCodeForCausalLM>(r, gpt_bigcode_keys());
}

}  // namespace tessera::models
