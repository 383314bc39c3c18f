// Plug-ins: shared libraries whose static initialisers register components (models and their HF model_types, losses,
// metrics, optimizers, schedules, algorithms, callbacks, loggers) in Tessera's registries, so that the tools (`train`,
// `eval`, `convert`, `generate`: --plugin PATH) build a research model, train with its components, and read its
// checkpoints. A plug-in links Tessera::tessera (the shared libtessera the tools use too, so both see one set of
// registries); docs/api.md#plug-ins.
#pragma once

#include <string>
#include <vector>

namespace tessera::util {

// Loads the shared library at `path` (dlopen, RTLD_NOW | RTLD_GLOBAL), running its static initialisers. Throws
// tessera::Error (exit code 2) naming the path and the loader's reason (a missing file, an undefined symbol, a
// library built against another Tessera). Loading the same path twice loads it once.
void load_plugin(const std::string& path);

// load_plugin for each path, in order.
void load_plugins(const std::vector<std::string>& paths);

}  // namespace tessera::util
