// Pre-flight: every input a run will read and every place it will write, checked before anything is built or started,
// with every problem reported at once, each with its recipe key and file:line. `train` runs it before step 0 (the
// Trainer's constructor, on every rank; the launcher before it starts ranks) and in --dry-run.
//
//   for (const auto& p : preflight(cfg, {.rank = 0, .probe_writes = true})) ...   // or:
//   require_preflight(cfg, options);   // throws PreflightError (exit 2) listing them
//
// What it checks: the data (an MDS stream's index.json and shards, a remote's index.json through the store with its
// credentials, fine-tuning data files); the tokenizer (it loads, and the model's vocabulary holds its tokens); ICL
// task and gauntlet files (they parse, their datasets exist); load_path (it exists, validates, and its tensors have
// the model's shapes); save_folder (writable, a probe object on object stores; room on local disk for the
// checkpoints it keeps); and what every logger and callback declares (config::Registry::set_check: output folders,
// the HF export folder, the MLflow server). Nothing is written, except a probe object that is deleted at once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/trainer/train_config.h"
#include "tessera/util/error.h"

namespace tessera::trainer {

struct PreflightProblem {
  std::string key;      // the recipe key path ("train_loader.dataset.local")
  std::string where;    // the recipe file and line of that key (or the command-line override that set it)
  std::string message;  // what is wrong, naming the file or URI
};

struct PreflightOptions {
  int64_t rank = 0;           // the other ranks skip what rank 0 alone writes (the HF export, rank-0 loggers)
  bool probe_writes = false;  // write-and-delete a probe object where an object store's save folder is
};

std::vector<PreflightProblem> preflight(const TrainConfig& cfg, const PreflightOptions& options = {});

// "N problem(s) ..." and one line per problem.
std::string render_preflight(const TrainConfig& cfg, const std::vector<PreflightProblem>& problems);

// A recipe whose inputs will fail: exit 2 (kExitUsageError), nothing started or written.
class PreflightError : public ConfigError {
 public:
  PreflightError(const TrainConfig& cfg, std::vector<PreflightProblem> problems);
  const std::vector<PreflightProblem>& problems() const { return problems_; }

 private:
  std::vector<PreflightProblem> problems_;
};

// Throws PreflightError when preflight() finds anything.
void require_preflight(const TrainConfig& cfg, const PreflightOptions& options = {});

}  // namespace tessera::trainer
