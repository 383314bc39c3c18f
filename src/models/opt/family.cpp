// OPT's entries: the `opt` recipe and its model_type.
#include "tessera/models/family.h"
#include "models/opt/opt.h"

namespace tessera::models {

void register_family_opt(FamilyRegistrar& r) {
  add_keyed_family<OPTForCausalLM>(r, opt_keys());
}

}  // namespace tessera::models
