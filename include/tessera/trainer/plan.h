// The dry-run plan: what a recipe would do on a given world size, computed without building anything.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/dist/sharding.h"
#include "tessera/trainer/train_config.h"

namespace tessera::trainer {

struct MemoryRow {
  dist::ShardingStrategy strategy;
  dist::StateMemory state;      // parameters, gradients, optimizer state per rank
  double activations = 0;       // per microbatch, without activation checkpointing
  double activations_ckpt = 0;  // per microbatch, with activation checkpointing
};

struct Plan {
  int64_t world_size = 1;
  int64_t ranks_per_node = 1;
  std::string model;  // the model's one-line description
  int64_t n_params = 0;
  double flops_per_token = 0;
  int64_t seq_len = 0;
  int64_t tokens_per_step = 0;          // global_train_batch_size * seq_len
  int64_t device_train_batch_size = 0;  // per rank
  bool auto_microbatch = false;
  int64_t microbatch_size = 0;            // clipped to the device batch; 0 when auto
  int64_t microbatches_per_step = 0;      // gradient-accumulation steps; 0 when auto
  std::vector<int64_t> microbatch_sizes;  // one step's microbatches (the last may be smaller)
  std::vector<MemoryRow> memory;          // NO_SHARD, SHARD_GRAD_OP, FULL_SHARD
};

// Throws ConfigError when the recipe cannot run on `world_size` ranks (global batch not divisible, ...).
Plan make_plan(const TrainConfig& cfg, int64_t world_size, int64_t ranks_per_node);

// Human-readable plan, as printed by `train --dry-run`.
std::string render_plan(const TrainConfig& cfg, const Plan& plan, const std::string& device_line);

}  // namespace tessera::trainer
