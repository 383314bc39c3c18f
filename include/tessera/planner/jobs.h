// The jobs a multi-job plan schedules (docs/planner.md): a list of Tessera recipes read from a YAML file,
//
//   jobs:
//     - name: mpt-1b-lr3e-4            # unique; default: the recipe's file name and the job's index
//       recipe: recipes/mpt-1b.yaml    # relative to the jobs file's folder, else to the working directory
//       overrides: [optimizer.lr=3e-4] # as on train's command line
//       max_duration: 2000ba           # default: the recipe's; in ba, sp or tok
//       weight: 2                      # priority in the weighted-completion objective (default 1)
//       deadline: 2h                   # end by then, counted from the plan's start (s, m, h or d; a number: s)
//       max_nodes: 1                   # nodes the job may span (default 1: it stays within one node)
//
// and what the planner needs to know of each: its size, FLOPs and memory (JobProfile), read from the recipe the way
// `train --dry-run` reads it, with the model built on `meta`.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "tessera/distributed/sharding.h"

namespace tessera::trainer {
struct TrainConfig;
}  // namespace tessera::trainer

namespace tessera::planner {

struct JobSpec {
  std::string name;
  std::string recipe;                  // the path as resolved (see above)
  std::vector<std::string> overrides;  // "key=value" assignments
  std::string max_duration;            // empty: the recipe's
  double weight = 1;
  int64_t max_nodes = 1;
  double deadline_s = std::numeric_limits<double>::infinity();  // from the plan's start; infinity: none
};

// What the performance model and the memory check use. Filled from a recipe by profile_job, or written directly
// (tests, simulated workloads).
struct JobProfile {
  std::string name;
  int64_t n_params = 0;
  int64_t largest_unit_params = 0;  // parameters of the biggest FSDP unit (a block)
  double flops_per_token = 0;       // training (forward and backward) FLOPs per token
  int64_t seq_len = 0;
  int64_t global_batch = 0;                     // samples per optimizer step
  int64_t steps = 0;                            // optimizer steps to train
  int64_t save_interval_steps = 0;              // steps between the checkpoints a plan run saves (0: none known)
  double activation_bytes_per_sample = 0;       // without activation checkpointing
  double activation_bytes_per_sample_ckpt = 0;  // with it
  bool mixed_precision = true;                  // 2-byte parameters and gradients, a 4-byte master copy
  int optimizer_state_tensors = 2;              // Adam's two moments
  // Expert parallelism: the experts' share of the parameters and degree, and the bytes a rank sends per token it
  // trains in the token exchanges (without activation checkpointing; 1.5 times that with it). Degree 1: none.
  dist::ExpertShare experts;
  int64_t moe_layers = 0;
  double all_to_all_bytes_per_token = 0;
  // Tensor parallelism: the weights the model splits (degree unused: any of tensor_parallel_degrees), the layers whose
  // outputs are all-reduced (or reduce-scattered) and their width. Empty degrees: the model declares no split layers.
  dist::ExpertShare tensor_split;
  std::vector<int64_t> tensor_parallel_degrees;  // the degrees above 1 the model's heads and MLP divide into
  int64_t tensor_parallel_layers = 0;
  int64_t d_model = 0;
  // Context parallelism: the degrees above 1 the model runs on context shards with (it supports them and the
  // sequence cuts into 2 C chunks). Empty: none.
  std::vector<int64_t> context_parallel_degrees;
  double weight = 1;
  int64_t max_nodes = 1;
  // Seconds from the start of the plan by which the job should end (infinity: none). Deadlines come before the
  // objective: a plan minimises the total time by which jobs miss theirs first (docs/planner.md).
  double deadline_s = std::numeric_limits<double>::infinity();

  bool has_deadline() const { return deadline_s < std::numeric_limits<double>::infinity(); }
  double tokens_per_step() const { return static_cast<double>(global_batch * seq_len); }
};

// Reads a jobs file. ConfigError naming the file and key for an unknown key, a missing recipe, a duplicate name, a
// deadline that is not a positive time.
std::vector<JobSpec> load_jobs(const std::string& path);

// What the planner needs of a loaded recipe, the model measured on `meta` (steps: 0 when max_duration is in epochs).
JobProfile profile_config(const trainer::TrainConfig& cfg, const std::string& name);
// Reads the job's recipe (with its overrides and max_duration) and measures the model on `meta`. ConfigError when
// the recipe is invalid or its max_duration is in epochs (the planner cannot know the dataset's size).
JobProfile profile_job(const JobSpec& spec);

}  // namespace tessera::planner
