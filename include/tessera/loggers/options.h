// Options of the loggers a recipe can list under `loggers:`.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

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

// `mlflow`: an MLflow tracking server (Composer's MLFlowLogger keys).
struct MlflowLoggerOptions {
  std::string experiment_name;  // default: MLFLOW_EXPERIMENT_NAME, else Composer's "my-mlflow-experiment"
  std::string run_name;         // default: the trainer's run name
  std::string tracking_uri;     // http(s)://host:port of the server; default: MLFLOW_TRACKING_URI
  std::map<std::string, std::string> tags;
  bool rank_zero_only = true;  // only rank 0 logs; otherwise each rank logs a run "<run_name>-rank<r>"
  double flush_interval = 10;  // seconds between batches of metrics sent (also at eval end, fit end and close)
  bool synchronous = false;    // true: every log call is sent at once
  bool resume = false;         // continue the run tagged run_name=<this run name> in the experiment, if there is one
  std::map<std::string, std::string> rename_metrics;  // exact name -> the name logged
  std::vector<std::string> ignore_metrics;            // glob patterns of metrics not logged
  std::vector<std::string> ignore_hyperparameters;    // glob patterns of top-level recipe keys not logged as params
  std::string run_group;                              // tagged run_group when set
  int64_t log_duplicated_metric_every_n_steps = 100;  // an unchanged value is sent again only this many steps later
  // An absolute folder under which a local (file:) artifact location that the tracking server gives a run may be
  // written (a server run with --no-serve-artifacts and its artifact root on a shared file system). Empty (default):
  // a local artifact location is refused; the server's artifact proxy (mlflow-artifacts:) needs nothing.
  std::string local_artifact_root;
};

// `wandb`: Weights & Biases (Composer's WandBLogger keys), written as the `wandb` package writes an offline run
// (WANDB_MODE=offline): <dir>/wandb/offline-run-<time>-<id>/run-<id>.wandb, which `wandb sync` uploads unchanged.
struct WandbLoggerOptions {
  std::string project;  // default: WANDB_PROJECT, else "uncategorized" (wandb's)
  std::string entity;   // default: WANDB_ENTITY, else none (sync picks the account's)
  std::string group;
  std::string name;  // default: the trainer's run name
  std::vector<std::string> tags;
  bool rank_zero_only = true;  // otherwise every rank writes a run "<name>-rank<r>" grouped under the name
  // init_kwargs that mean something here: dir (default WANDB_DIR, else the working directory), id (default: a new
  // one, kept for the run name so that an autoresumed run continues it), notes, job_type, resume.
  std::string dir;
  std::string id;
  std::string notes;
  std::string job_type;
  bool resume = false;  // init_kwargs.resume: allow / must / true: mark the run as resumed even on a fresh start
};

// Registered: jsonl, tensorboard, mlflow, wandb. LLM Foundry's other names (file, comet_ml, neptune, ...) are reported
// as not supported yet.
core::CallbackRegistry& logger_registry();

}  // namespace tessera::loggers
