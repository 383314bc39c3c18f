// Options of the loggers a recipe can list under `loggers:`.
#pragma once

#include <string>

#include "tessera/config/component.h"

namespace tessera::loggers {

// `jsonl`: metrics as JSON lines. Console output is `log_to_console` / `progress_bar` (not a logger entry).
struct JsonlLoggerOptions {
  std::string filename = "{run_name}/metrics.jsonl";
};

// Registered: jsonl. LLM Foundry's names (wandb, tensorboard, mlflow, file, ...) are reported as not supported yet.
config::ComponentRegistry& logger_registry();

}  // namespace tessera::loggers
