// The dry-run plan: what a recipe would do on a given world size, computed without building anything.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/distributed/sharding.h"

namespace tessera::models {
class CausalLM;
}
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
  int64_t shard_group = 1;  // the ranks HYBRID_SHARD shards over (the node, or fsdp_config's shard degree)
  std::string model;        // the model's one-line description
  int64_t n_params = 0;
  int64_t n_active_params = 0;  // those one token uses (fewer than n_params for a mixture of experts)
  double flops_per_token = 0;
  int64_t seq_len = 0;
  int64_t tokens_per_step = 0;          // global_train_batch_size * seq_len
  int64_t device_train_batch_size = 0;  // per rank
  bool auto_microbatch = false;
  int64_t microbatch_size = 0;            // clipped to the device batch; 0 when auto
  int64_t microbatches_per_step = 0;      // gradient-accumulation steps; 0 when auto
  std::vector<int64_t> microbatch_sizes;  // one step's microbatches (the last may be smaller)
  std::vector<MemoryRow> memory;          // NO_SHARD, SHARD_GRAD_OP, FULL_SHARD
  int64_t largest_unit_params = 0;        // the biggest FSDP unit (a block), for the gathered-parameter memory
  // Expert parallelism (MoE layers with moe_world_size > 1): the experts' share, and what the token exchanges send.
  dist::ExpertShare experts;
  int64_t moe_layers = 0;
  int64_t num_experts = 0;
  // Bytes one rank sends in the token exchanges of a step, without and with activation checkpointing (0: none).
  double all_to_all_bytes = 0;
  double all_to_all_bytes_ckpt = 0;
  std::string expert_parallel_problem;  // why this world size cannot run the degree (empty: it can)
  // Tensor parallelism (parallelism.tensor_parallel_degree): the split weights' share (the experts' accounting holds
  // for any part split over a group: degree, split parameters, those of the largest unit), the layers that all-reduce,
  // and what they send per rank and step without and with activation checkpointing.
  dist::ExpertShare tensor_split;
  int64_t tensor_parallel_layers = 0;
  double tensor_all_reduce_bytes = 0;
  double tensor_all_reduce_bytes_ckpt = 0;
  // Context parallelism (parallelism.context_parallel_degree): the degree; the activations in `memory` are then one
  // rank's positions' plus its rows of the attention mask.
  int64_t context_parallel_degree = 1;
  // Pipeline parallelism (parallelism.pipeline_parallel_degree): the stages. The plan is then a stage's mesh (its
  // data-parallel and sharding degrees); memory is still counted for the whole model (an upper bound per stage).
  int64_t pipeline_degree = 1;
};

// The weights `model` splits over `degree` tensor-parallel ranks (its models::TensorParallelModel plan): their
// parameters, those in its largest unit, the units (layers) holding them and the width of their all-reduced outputs (a
// row-parallel weight's rows). All 0 when the model declares no split layers; ConfigError (the model's) when the degree
// does not divide its heads or MLP.
struct TensorSplit {
  int64_t params = 0;
  int64_t largest_unit_params = 0;
  int64_t layers = 0;
  int64_t d_model = 0;
};
TensorSplit measure_tensor_split(const models::CausalLM& model, int64_t degree);

// What a checkpoint costs and how often the job fails: the inputs of the interval advice.
struct CheckpointCosts {
  double mtbf_seconds = 0;      // the job's mean time between failures
  double save_seconds = 0;      // one whole save: snapshot, write and publish
  double blocking_seconds = 0;  // what one save stops training for (the whole save when saves are synchronous)
  double step_seconds = 0;      // one optimizer step
  bool async = true;            // save_async: the write overlaps training, and the next save waits for it
};

// The checkpoint interval that minimises the expected time lost to checkpoints and failures.
struct CheckpointAdvice {
  double young_seconds = 0;             // Young (1974): sqrt(2 delta M), delta = blocking time, M = MTBF
  double daly_seconds = 0;              // Daly (2006): Young's with the higher-order terms, M when delta >= 2M
  int64_t interval_batches = 0;         // Daly's interval in steps, at least 1 and, async, at least one whole save
  double overhead_fraction = 0;         // expected fraction of wall time lost at that interval (saves + rework)
  double lost_per_failure_seconds = 0;  // expected training time redone after a failure at that interval
};

CheckpointAdvice advise_checkpoint_interval(const CheckpointCosts& c);
// The expected fraction of wall time lost with a save every `interval_batches` steps: blocking time per segment plus
// the rework a failure costs (half a segment on average, plus the save in flight when saves are asynchronous).
double checkpoint_overhead(const CheckpointCosts& c, int64_t interval_batches);

// Bytes the busiest rank writes per checkpoint: fp32 weights and optimizer state, its share under `strategy`.
double checkpoint_bytes_per_rank(const TrainConfig& cfg, const Plan& plan, dist::ShardingStrategy strategy);

// Throws ConfigError when the recipe cannot run on `world_size` ranks (global batch not divisible, ...).
Plan make_plan(const TrainConfig& cfg, int64_t world_size, int64_t ranks_per_node);

// Human-readable plan, as printed by `train --dry-run`.
std::string render_plan(const TrainConfig& cfg, const Plan& plan, const std::string& device_line);

// What the dry run knows of a checkpoint's costs: given figures (measured on a real run), else estimates.
struct CheckpointCostInputs {
  std::optional<double> mtbf_hours;        // default: Llama 3's failure rate per GPU over the world size
  std::optional<double> save_seconds;      // default: bytes per rank over the save folder's measured write rate
  std::optional<double> blocking_seconds;  // default: the whole save, or, async, the snapshot's measured copy time
  std::optional<double> step_seconds;      // default: FLOPs per rank over this machine's measured GEMM rate at 40%
};
// Fills in what `given` leaves out, measuring this machine where it must (a 64 MiB probe file written, fsynced and
// removed in the save folder or the nearest existing parent; a host copy; a GEMM). `sources` says where each came
// from.
CheckpointCosts estimate_checkpoint_costs(const TrainConfig& cfg, const Plan& plan, const CheckpointCostInputs& given,
                                          std::vector<std::string>& sources);

// The dry run's checkpoint section: the interval advice and how its inputs were found (`sources`: one line per input).
std::string render_checkpoint_advice(const TrainConfig& cfg, const CheckpointCosts& costs,
                                     const std::vector<std::string>& sources);

}  // namespace tessera::trainer
