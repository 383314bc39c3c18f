// Sharding options (`fsdp_config:`, Composer's FSDPConfig schema) and the per-rank memory they imply for parameters,
// gradients and optimizer state (the ZeRO paper's accounting).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "tessera/config/reader.h"

namespace tessera::dist {

enum class ShardingStrategy {
  kNoShard,      // NO_SHARD: replicated, gradients all-reduced (DDP)
  kShardGradOp,  // SHARD_GRAD_OP: gradients and optimizer state sharded (ZeRO-2)
  kFullShard,    // FULL_SHARD: parameters too (ZeRO-3)
  kHybridShard,  // HYBRID_SHARD: FULL_SHARD within a node, replicated across nodes
};
std::string to_string(ShardingStrategy s);

enum class MixedPrecision { kPure, kDefault, kFull };  // PURE, DEFAULT, FULL

struct ShardingOptions {
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  MixedPrecision mixed_precision = MixedPrecision::kDefault;
  bool activation_checkpointing = false;
  bool activation_checkpointing_reentrant = true;
  bool limit_all_gathers = true;
  bool forward_prefetch = false;
  std::string backward_prefetch = "BACKWARD_POST";  // BACKWARD_PRE | BACKWARD_POST | NONE
  bool sync_module_states = false;
  bool use_orig_params = true;
  std::string state_dict_type = "full";  // full | sharded
  bool verbose = false;
  // Tessera's own key: prefetch the next unit's all-gather and reduce gradients asynchronously while computing
  // (default true); false issues one collective at a time and waits for it (for measuring what overlap buys).
  bool overlap_communication = true;
  // Composer's device mesh for HYBRID_SHARD (FSDPConfig.data_parallel_shard_degree / data_parallel_replicate_degree):
  // shard within groups of `shard_degree` consecutive ranks and replicate across `replicate_degree` of them. -1 / 0:
  // not given (HYBRID_SHARD then shards within each node); resolve_mesh fills in the rest for a world size.
  int64_t shard_degree = -1;
  int64_t replicate_degree = 0;
  // The section whose keys gave the degrees (fsdp_config, or torchtitan's parallelism), for messages.
  std::string mesh_keys = "fsdp_config";
  // parallelism.tensor_parallel_degree: groups of this many consecutive ranks split the model's declared layers
  // (distributed/parallel_ops.h); the data-parallel degrees then multiply to world size / this.
  int64_t tensor_parallel_degree = 1;
  // parallelism.sequence_parallel (Tessera's own key; torchtitan always applies it with tensor parallelism): the
  // decoder layers' norms and residuals on sequence shards.
  bool sequence_parallel = true;
  // parallelism.context_parallel_degree: groups of this many ranks (the mesh dimension outside the tensor-parallel one)
  // read the same samples and each runs on its share of the positions (models/context_parallel.h); the data-parallel
  // degrees then multiply to world size / (tensor x context degree).
  int64_t context_parallel_degree = 1;
  // parallelism.expert_parallel_degree: the MoE layers (models::ExpertParallelLayer) of any family split their experts
  // over groups of this many ranks (distributed/expert_parallel.cpp); 1: the degree the layers' own options ask for.
  int64_t expert_parallel_degree = 1;
  // torchtitan's loss parallel (parallelism.disable_loss_parallel: false, the default): under tensor parallelism a head
  // split along the vocabulary feeds the built-in cross-entropy its share of the logits, not gathered ones.
  bool loss_parallel = true;
  // parallelism.pipeline_parallel_degree: the model's decoder blocks split into this many stages
  // (distributed/pipeline.h), the outermost mesh dimension as in torchtitan (pipeline x data x context x tensor):
  // stage s is ranks [s * world / P, (s + 1) * world / P), and everything above shards within a stage.
  int64_t pipeline_parallel_degree = 1;
  // parallelism.pipeline_parallel_schedule (torchtitan's names and default).
  std::string pipeline_schedule = "1F1B";
  // parallelism.pipeline_parallel_microbatch_size: samples per pipeline microbatch; 0 (not given):
  // device_train_microbatch_size.
  int64_t pipeline_microbatch_size = 0;
  // The ranks of one stage that read the same samples: tensor_parallel_degree x context_parallel_degree.
  int64_t batch_replicas() const {
    return std::max<int64_t>(tensor_parallel_degree, 1) * std::max<int64_t>(context_parallel_degree, 1);
  }
  int64_t pipeline_degree() const { return std::max<int64_t>(pipeline_parallel_degree, 1); }
  // The data-parallel ranks of a world: world / (pipeline x tensor x context degree); and rank `rank`'s index among
  // them (ranks that read the same samples share it: a tensor- or context-parallel group, and the same position in
  // every pipeline stage).
  int64_t data_world(int64_t world) const { return world / (pipeline_degree() * batch_replicas()); }
  int64_t data_rank(int64_t rank, int64_t world) const {
    return (rank % (world / pipeline_degree())) / batch_replicas();
  }
};

// Reads an `fsdp_config` section (absent: Composer's defaults).
ShardingOptions parse_sharding_options(config::Section& s);

// torchtitan's `parallelism:` section (JobConfig.Parallelism, its names) applied to `o`: data_parallel_replicate_degree
// R (default 1) and data_parallel_shard_degree S (default -1: the rest of the world) become the strategy and
// HYBRID_SHARD's groups: R > 1 and S != 1 HYBRID_SHARD (torchtitan's HSDP), R > 1 and S == 1 NO_SHARD (DDP), else
// FULL_SHARD, or SHARD_GRAD_OP under fsdp_reshard_after_forward: never. tensor_parallel_degree T makes groups of T
// consecutive ranks inside that mesh and context_parallel_degree C groups of C ranks T apart (R x S x C x T = world
// size, torchtitan's order). `fsdp` is the recipe's fsdp_config section: a
// sharding_strategy there must agree, and its own degrees must not be given as well. expert_parallel_degree is read
// here and checked against the model when the engine finds its MoE layers. Pipeline degrees above
// 1 and the all-to-all context-parallel method are refused as not supported.
void parse_parallelism(config::Section& p, const config::Section& fsdp, ShardingOptions& o);

// The shard-group size HYBRID_SHARD uses on `world_size` ranks with `ranks_per_node` per node: the mesh's shard
// degree when the recipe gives one (a -1 shard degree with a replicate degree R is world_size / (R T C)) times the
// tensor- and context-parallel degrees T x C, else the node.
// Throws ConfigError naming fsdp_config's keys when the degrees do not multiply to the world size, or when a
// replicate degree above 1 comes with a strategy that does not replicate shards (HYBRID_SHARD does).
int64_t shard_group_size(const ShardingOptions& o, int64_t world_size, int64_t ranks_per_node);

// Whether `world_size` ranks shard at all. LLM Foundry's rule for one rank (llmfoundry/command_utils/train.py:
// "FSDP is not applicable for single-GPU training. Reverting to DDP."; utils/config_utils.py: init_device meta
// "is only valid when using FSDP! Reverting to cpu"): a world of one runs as DDP and builds its model on the device.
bool applies_fsdp(int64_t world_size);
// The options that apply on `world_size` ranks: `o` itself when applies_fsdp, else DDP's: NO_SHARD, parameters and
// reductions in full precision (autocast alone lowers the compute) and no activation checkpointing, as with LLM
// Foundry, where the fsdp_config is dropped.
ShardingOptions sharding_for_world(ShardingOptions o, int64_t world_size);

// Bytes per rank for model state, by component.
struct StateMemory {
  double params = 0;  // resident parameters (sharded or not)
  double grads = 0;
  double optimizer = 0;  // fp32 master copy (mixed precision) + optimizer state tensors
  double transient = 0;  // full parameters of the units gathered at once (FULL_SHARD / HYBRID_SHARD)
  double total() const { return params + grads + optimizer + transient; }
};

// ZeRO accounting for `n_params` parameters on `world_size` ranks (`ranks_per_node` for HYBRID_SHARD). With mixed
// precision, params and grads are 2 bytes and the optimizer keeps a 4-byte master copy plus `state_tensors` 4-byte
// tensors (Adam: 2+2+12 bytes per parameter); in fp32 everything is 4 bytes and there is no master copy.
// `largest_unit_params`: parameters of the biggest wrapped unit; FULL_SHARD holds up to two such units gathered
// (the running one and the prefetched next, bounded by limit_all_gathers).
StateMemory state_memory_per_rank(int64_t n_params, ShardingStrategy strategy, int64_t world_size,
                                  int64_t ranks_per_node, bool mixed_precision, int state_tensors,
                                  int64_t largest_unit_params);

// Expert parallelism's share of the model (models/moe.h: moe_world_size).
struct ExpertShare {
  int64_t degree = 1;               // ranks per expert-parallel group (1: none)
  int64_t params = 0;               // expert weights among the model's parameters
  int64_t largest_unit_params = 0;  // expert weights in the largest unit (a block)
};
// The same with expert parallelism: each rank holds 1/degree of the experts, sharded with `strategy` over the
// world_size / degree ranks that hold the same ones (ranks_per_node / degree per node under HYBRID_SHARD), and the
// dense rest as above. `world_size` must be a multiple of the degree.
StateMemory state_memory_per_rank(int64_t n_params, ShardingStrategy strategy, int64_t world_size,
                                  int64_t ranks_per_node, bool mixed_precision, int state_tensors,
                                  int64_t largest_unit_params, const ExpertShare& experts);

// Bytes one rank sends in the expert-parallel token exchanges of one training step over `tokens` tokens (its
// microbatches together): per MoE layer, forward sends each token's top_k rows of d_model values out and takes the
// results back (two all-to-alls), backward does the same with their gradients, and activation checkpointing's
// recomputation adds the forward's two again; (degree - 1) / degree of the rows leave the rank.
double expert_all_to_all_bytes(int64_t tokens, int64_t top_k, int64_t d_model, int64_t moe_layers, int64_t degree,
                               int bytes_per_value, bool activation_checkpointing);

// Bytes one rank sends in tensor parallelism's all-reduces of one training step over `tokens` tokens (its
// microbatches together): per layer that splits, the attention's and the MLP's row-parallel outputs are summed over the
// group in forward, and the column-parallel inputs' gradients in backward (four all-reduces of tokens x d_model values;
// six with activation checkpointing's recomputation), each sending 2 (degree - 1) / degree of its bytes (a ring).
double tensor_parallel_all_reduce_bytes(int64_t tokens, int64_t d_model, int64_t layers, int64_t degree,
                                        int bytes_per_value, bool activation_checkpointing);

}  // namespace tessera::dist
