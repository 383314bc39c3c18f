// GPT-NeoX's entries: the `gpt_neox` recipe and its model_type.
#include "tessera/models/family.h"
#include "models/gpt_neox/gpt_neox.h"

namespace tessera::models {

void register_family_gpt_neox(FamilyRegistrar& r) {
  // A tied head is stored as embed_out.weight; older transformers saved mask and rotary buffers beside the weights.
  add_keyed_family<GPTNeoXForCausalLM>(
      r, gpt_neox_keys(),
      {.adapter = HfAdapter{.tied_head = "embed_out.weight",
                            .dropped_buffers = {".attention.bias", ".attention.masked_bias", ".rotary_emb.inv_freq"}}});
  r.config_forms["gpt_neox"] = {.rope =
                                    HfConfigForm::Rope{.theta_key = "rotary_emb_base", .partial_key = "rotary_pct"}};
}

}  // namespace tessera::models
