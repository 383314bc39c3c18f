// Options of the training algorithms a recipe can list under `algorithms:`.
#pragma once

#include <string>

#include "tessera/config/component.h"

namespace tessera::algorithms {

struct GradientClippingOptions {
  std::string clipping_type = "norm";  // norm (global L2 norm) | value | adaptive (AGC)
  double clipping_threshold = 1.0;
};

// Registered: gradient_clipping. Composer's and LLM Foundry's other names are known and reported as not supported yet.
config::ComponentRegistry& algorithm_registry();

}  // namespace tessera::algorithms
