// GPT-Neo's entries: the `gpt_neo` recipe and its model_type.
#include "tessera/models/family.h"
#include "models/gpt_neo/gpt_neo.h"

namespace tessera::models {

void register_family_gpt_neo(FamilyRegistrar& r) {
  // Older transformers saved the attention's causal-mask buffers beside the weights.
  add_keyed_family<GPTNeoForCausalLM>(
      r, gpt_neo_keys(),
      {.adapter = HfAdapter{.dropped_buffers = {".attn.attention.bias", ".attn.attention.masked_bias"}}});
}

}  // namespace tessera::models
