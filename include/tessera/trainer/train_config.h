// A training recipe, fully parsed: LLM Foundry's top-level schema mapped onto each component's typed Options.
//
//   TrainConfig cfg = load_train_config("recipes/mpt-125m.yaml", {"optimizer.lr=3e-4"});
//
// Precedence: command-line overrides > recipe > defaults. Loading throws ConfigError naming the file, the key path and
// the line for any unknown key, wrong type, missing required key, bad duration, unresolvable interpolation or value out
// of range; keys of LLM Foundry's schema that Tessera does not implement yet are reported together in one message.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/callbacks/checkpoint_saver.h"
#include "tessera/callbacks/profiler.h"
#include "tessera/config/component.h"
#include "tessera/config/time.h"
#include "tessera/config/value.h"
#include "tessera/core/precision.h"
#include "tessera/data/options.h"
#include "tessera/distributed/sharding.h"
#include "tessera/models/causal_lm.h"
#include "tessera/optim/options.h"

namespace tessera::trainer {

// `device_train_microbatch_size`: a number of samples, or `auto` (halve on out-of-memory).
struct MicrobatchSize {
  bool automatic = true;
  int64_t samples = 0;  // when !automatic
};

// One entry of `icl_tasks` (LLM Foundry's schema); evaluated by the ICL evaluator.
struct IclTaskOptions {
  std::string label;
  std::string dataset_uri;
  std::vector<int64_t> num_fewshot;
  std::string icl_task_type;  // language_modeling | multiple_choice | schema | generation_task_with_answers
  config::Value raw;          // the entry as written, for task-specific keys
};

struct TrainConfig {
  std::string recipe_path;
  config::Value resolved;  // the whole recipe after overrides and interpolation (stored in checkpoints)

  int64_t max_seq_len = 0;
  models::ModelOptions model;  // `model`: the registered family's options (models::model_registry())
  // `loss`: a registered loss (models::loss_registry()) in place of the model's own (CausalLM::loss).
  std::optional<models::LossOptions> loss;
  // `metrics`: registered evaluation metrics (models::metric_registry()) beside LanguageCrossEntropy.
  std::vector<config::ComponentOptions> metrics;
  data::TokenizerOptions tokenizer;
  data::LoaderOptions train_loader;
  std::optional<data::LoaderOptions> eval_loader;
  optim::OptimizerOptions optimizer;
  optim::SchedulerOptions scheduler;
  std::vector<config::ComponentOptions> algorithms;
  std::vector<config::ComponentOptions> callbacks;
  std::vector<config::ComponentOptions> loggers;
  dist::ShardingOptions fsdp;                      // Composer's defaults when `fsdp_config` is absent
  bool fsdp_configured = false;                    // whether the recipe has an `fsdp_config`
  std::chrono::milliseconds dist_timeout{600000};  // `dist_timeout` (seconds, default 600): every collective's limit
  // LLM Foundry's `python_log_level` (debug, info, warning, error, critical) as spdlog's level name ("warn", ...);
  // empty when absent. `train` uses it unless --log-level is given.
  std::string log_level;

  config::Time max_duration;
  config::Time eval_interval = config::Time::epochs(1);  // 0 disables evaluation
  bool eval_first = false;
  // LLM Foundry's default: microbatch losses are weighted by their loss-generating tokens (exact gradient
  // accumulation for padded fine-tuning batches); false weights them by samples, as Composer's own default.
  bool accumulate_train_batch_on_tokens = true;
  // CUDA allocator and module loading (LLM Foundry sets PYTORCH_CUDA_ALLOC_CONF / CUDA_MODULE_LOADING from these
  // before CUDA starts; so does the trainer, unless the environment already sets them).
  std::optional<int64_t> max_split_size_mb;
  bool expandable_segments = false;
  bool cuda_load_lazy = false;
  // Tessera's `cuda_graphs` (bool, default false): each training step's microbatches run as one captured CUDA graph
  // (docs/gpu.md#cuda-graphs).
  bool cuda_graphs = false;
  int64_t eval_subset_num_batches = -1;  // -1: the whole eval set
  int64_t global_train_batch_size = 0;
  MicrobatchSize device_train_microbatch_size;
  int64_t device_eval_batch_size = 0;
  core::Precision precision = core::Precision::kAmpBf16;
  // `precision: auto`: the trainer picks amp_bf16 on a GPU or on a CPU that computes bf16 natively
  // (util::CpuBf16::native), else fp32; `precision` holds amp_bf16 until then (the dry run's plan).
  bool precision_auto = false;
  std::string device = "auto";  // Composer's Trainer `device`: auto (a GPU when there is one), cpu or gpu
  int64_t seed = 17;
  bool deterministic_mode = false;  // deterministic kernels only (Composer's deterministic_mode)
  std::string run_name;             // recipe value, else $RUN_NAME, else the recipe's file name without extension

  // Checkpoints (docs/checkpointing.md): Composer's save_* and load_* keys, read into the options the checkpoint
  // saver and loader take.
  std::optional<std::string> save_folder;  // {run_name} is filled in; none: no checkpoints
  // save_filename, save_latest_filename, save_interval, save_num_checkpoints_to_keep, save_overwrite,
  // save_weights_only, save_async (save.folder is save_folder filled in, by the trainer).
  callbacks::SaveOptions save;
  std::optional<std::string> load_path;  // a Tessera checkpoint directory or a Hugging Face folder
  callbacks::LoadOptions load;           // load_weights_only, load_strict_model_weights
  bool autoresume = false;               // continue from the newest valid checkpoint in save_folder
  // With save_folder: on these signals every rank finishes its batch, the job saves a checkpoint and exits with
  // util::kExitPreempted (75); [] keeps the default disposition (the process dies).
  std::vector<int> preemption_signals = {SIGTERM, SIGUSR1};

  std::optional<std::string> icl_tasks_path;  // `icl_tasks: path/to/tasks.yaml`
  std::vector<IclTaskOptions> icl_tasks;      // inline list
  std::optional<int64_t> icl_seq_len;         // prompts' max_seq_len for tasks without their own (default max_seq_len)
  // Batches per rank of each ICL evaluator of a task without categories (eval::icl_subset_num_batches_for; unset:
  // eval_subset_num_batches applies, as to the per-category evaluators).
  std::optional<int64_t> icl_subset_num_batches;
  std::optional<config::Value> eval_gauntlet;  // `eval_gauntlet`: a path (scalar) or the inline mapping

  std::optional<callbacks::ProfilerOptions> profiler;  // `profiler:` (callbacks/profiler.h)

  config::Time console_log_interval = config::Time::batches(1);
  bool progress_bar = false;
  bool log_to_console = true;
  bool console_verbose = false;  // every metric on each console line (`tessera train --verbose`; no recipe key)
  // Check every input and output before anything is built (trainer/preflight.h); `tessera train --no-preflight`
  // turns it off (no recipe key).
  bool preflight = true;
};

// Loads `path`, applies `overrides` ("key.sub=value"), resolves interpolation and parses the result.
TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides = {});

// Parses an already loaded and resolved recipe tree; `path` is used in messages.
TrainConfig parse_train_config(config::Value resolved, const std::string& path);

// The resolved recipe as it leaves the process: what the loggers record, what each checkpoint stores and what
// --print-config shows. Secrets are hidden (util::redact_secrets: "***" for a token or password, URIs' user-info);
// `cfg.resolved`, which the components were built from, keeps the real values.
nlohmann::ordered_json recorded_config(const TrainConfig& cfg);

}  // namespace tessera::trainer
