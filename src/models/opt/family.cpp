// OPT's entries: the `opt` recipe and its model_type.
#include "tessera/models/family.h"
#include "models/opt/opt.h"

namespace tessera::models {

void register_family_opt(FamilyRegistrar& r) {
  add_recipe_family<OPTOptions>(r.recipes, "opt", &parse_opt_options, &build_opt);
  r.model_types.add("opt", hf_builder(&opt_options_from_hf_config, &build_opt));
}

}  // namespace tessera::models
