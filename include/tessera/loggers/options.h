// Options of the loggers a recipe can list under `loggers:`.
#pragma once

#include "tessera/config/component.h"

namespace tessera::loggers {

// No destination is registered yet (console output is `log_to_console`); LLM Foundry's names (wandb, tensorboard,
// mlflow, file, ...) are reported as not supported yet.
config::ComponentRegistry& logger_registry();

}  // namespace tessera::loggers
