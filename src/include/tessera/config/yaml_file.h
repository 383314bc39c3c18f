// Reading a YAML file that is not a recipe (an ICL tasks file, a jobs or cluster file, a gauntlet), with errors that
// say which kind of file it is.
#pragma once

#include <string>

#include "tessera/config/value.h"

namespace tessera::config {

// load_yaml_file() for a `what` ("ICL tasks file", "jobs file", ...): its errors name `component` and `what` instead of
// the recipe.
Value load_yaml_file(const std::string& path, const std::string& component, const std::string& what);

}  // namespace tessera::config
