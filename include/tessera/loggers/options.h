// Options of the loggers a recipe can list under `loggers:`.
#pragma once

#include <cstdint>
#include <string>

#include "tessera/config/component.h"
#include "tessera/core/callback.h"

namespace tessera::loggers {

// `jsonl`: metrics as JSON lines. Console output is `log_to_console` / `progress_bar` (not a logger entry).
struct JsonlLoggerOptions {
  std::string filename = "{run_name}/metrics.jsonl";
};

// `tensorboard`: TensorBoard event files (Composer's TensorboardLogger).
struct TensorBoardLoggerOptions {
  std::string log_dir = "{run_name}/tensorboard";  // folder of the event file; {run_name} and {rank} are filled in
  int64_t flush_interval = 100;                    // batches between flushes to disk (also at eval, epoch, fit end)
  bool rank_zero_only = true;                      // only rank 0 writes
};

// Registered: jsonl, tensorboard. LLM Foundry's names (wandb, mlflow, file, ...) are reported as not supported yet.
core::CallbackRegistry& logger_registry();

}  // namespace tessera::loggers
