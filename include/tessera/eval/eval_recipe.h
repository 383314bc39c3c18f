// LLM Foundry's evaluation YAML (scripts/eval/yamls/hf_eval.yaml; llmfoundry/command_utils/eval.py's EvalConfig),
// read as `tessera eval --recipe FILE` reads it: the models to evaluate, the ICL tasks and the Eval Gauntlet, the
// batch size, sequence length and precision. Unknown keys are refused with the file and line, as in training recipes;
// keys of Foundry's schema that Tessera does not implement are named together as "not supported yet". `loggers` is
// read by the caller (the logger registry sits above this layer), in the same pass.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tessera/config/reader.h"
#include "tessera/config/value.h"
#include "tessera/distributed/sharding.h"
#include "tessera/eval/gauntlet.h"
#include "tessera/eval/icl.h"

namespace tessera::eval {

// One entry of `models:` (or the top-level `model` / `tokenizer` / `load_path` form, which Foundry's
// allow_toplevel_keys turns into one).
struct EvalModelSpec {
  std::string model_name;  // the results table's Model column (default: model.name)
  std::string model_type;  // model.name: hf_causal_lm, or a Tessera model name (then load_path is required)
  // model.pretrained_model_name_or_path: an HF folder or a hub id in the local HF cache (hf_causal_lm).
  std::string pretrained_model_name_or_path;
  // A Tessera checkpoint or save folder (its newest valid checkpoint) whose weights are evaluated instead; its own
  // hf_config gives the architecture.
  std::string load_path;
  std::string tokenizer;  // tokenizer.name: a tokenizer.json, its folder, or a hub id in the local HF cache
};

struct EvalRecipe {
  std::string path;
  std::vector<EvalModelSpec> models;
  std::vector<IclTaskConfig> icl_tasks;  // each task's max_seq_len is the recipe's unless the task sets one
  std::optional<GauntletConfig> gauntlet;
  int64_t device_eval_batch_size = 0;
  int64_t max_seq_len = 0;
  std::string precision = "amp_bf16";  // fp32 | amp_bf16 | amp_fp16 | auto (Foundry's default: amp_bf16)
  int64_t seed = 17;
  // fsdp_config (Composer's schema): on more than one rank the model is sharded as in training; absent, every rank
  // holds the whole model (a world of one never shards: dist::applies_fsdp).
  std::optional<dist::ShardingOptions> fsdp;
  // The loggers' run name: run_name, else RUN_NAME from the environment, else the recipe file's stem (as `train`).
  std::string run_name;
  // The recipe after overrides and interpolation: what the loggers record as hyperparameters.
  config::Value resolved;
};

// Loads `path`, applies `key=value` overrides (as `train`'s), resolves `${variables.x}` interpolations and reads the
// schema. `loggers`, when given, reads the recipe's `loggers` key in the same pass, so that its errors and the rest's
// are reported together. Throws ConfigError naming the file, line and key.
EvalRecipe load_eval_recipe(const std::string& path, const std::vector<std::string>& overrides = {},
                            const std::function<void(config::Section& root)>& loggers = {});

// `icl_tasks` as a recipe writes it: a path to a tasks YAML (relative: to the current directory, else to `base_dir`)
// or an inline list of tasks.
std::vector<IclTaskConfig> icl_tasks_from(const config::Value& value, const std::string& base_dir);

// `eval_gauntlet` as a recipe writes it: a path to a gauntlet YAML (relative: to the current directory, else to
// `base_dir`) or the mapping inline.
GauntletConfig gauntlet_from(const config::Value& value, const std::string& base_dir);

}  // namespace tessera::eval
