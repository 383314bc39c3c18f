// What a component's pre-flight check reports: the inputs and outputs it will touch, checked before the first step
// (trainer/preflight.h gathers them with the recipe key and line of each, and reports them all at once).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::config {

// One thing that would fail once the run is under way: `key` is the component's own key ("save_folder",
// "dataset.local"), which the caller prefixes with the component's place in the recipe.
struct Problem {
  std::string key;
  std::string message;
};
using Problems = std::vector<Problem>;

// Where the check runs. Only `probe_writes` may write anything, and only a probe object it deletes at once (object
// stores have no permission to ask for without trying): the launcher and rank 0 probe, the other ranks do not.
struct CheckContext {
  std::string run_name;
  int64_t rank = 0;
  bool probe_writes = false;
};

}  // namespace tessera::config
