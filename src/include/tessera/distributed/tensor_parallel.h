// Tensor parallelism's groups and layouts for the sharding engine (distributed/fsdp.h; the model side is its plan,
// models/parallel_plan.h; the collectives are parallel_ops.h): which parameters split over which ranks, this rank's
// slice of each, and where a slice's elements lie in the whole parameter (for checkpoints, which keep one logical
// layout). Internal to the engine.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessera/distributed/communicator.h"
#include "tessera/distributed/fsdp.h"
#include "tessera/distributed/parallel_styles.h"
#include "tessera/distributed/sharding.h"
#include "tessera/models/causal_lm.h"

namespace tessera::dist {

struct TensorGroups {
  int degree = 1;                         // tensor_parallel_degree (1: none)
  std::shared_ptr<Communicator> group;    // this rank's tensor-parallel group: `degree` consecutive ranks
  std::shared_ptr<Communicator> holders;  // the ranks that hold the same slices (HYBRID_SHARD: in the shard group)
  std::map<std::string, dist::TensorParallelSplit> splits;  // by parameter name
  std::shared_ptr<TensorParallelState> state;               // what the styles share with the engine's runner
};

// Asks the model for its plan (models::TensorParallelModel), checks it and the degree against the job (ConfigError
// naming parallelism.tensor_parallel_degree: a world that is not a multiple of it, NO_SHARD, HYBRID_SHARD shard groups
// of `ranks_per_node` that do not hold whole groups, a model that declares no plan, splits that do not divide, a
// layer's Linear or Norm the plan leaves out), makes the groups (every rank of `world` calls this together) and
// installs the plan's styles (distributed/parallel_styles.h) over the group, whose collectives run `sync` first,
// with `sequence_parallel` on or off.
TensorGroups setup_tensor_parallel(models::CausalLM& model, int degree, bool sequence_parallel,
                                   ShardingStrategy strategy, int ranks_per_node, Communicator& world,
                                   std::function<void()> sync);

// Checks parallelism.context_parallel_degree `degree` against the job and the model (ConfigError naming it: a world
// that is not a multiple of degree x `tp_degree`, a model whose forward does not run on context shards) and makes the
// groups: in each block of degree x tp_degree consecutive ranks, the `degree` ranks tp_degree apart (torchtitan's mesh
// order: the context dimension outside the tensor one). Returns this rank's group's exchange (its collectives running
// `sync` first), or none for degree 1. Every rank of `world` calls it together.
std::shared_ptr<models::ContextExchange> setup_context_parallel(const models::CausalLM& model, int degree,
                                                                int tp_degree, Communicator& world,
                                                                std::function<void()> sync);

// Rank `rank`'s slice of the whole parameter `full` under `split` (of `degree` ranks), contiguous.
at::Tensor tensor_parallel_slice(const at::Tensor& full, const dist::TensorParallelSplit& split, int rank, int degree);
// The whole parameter from every rank's slice (`slices` in rank order).
at::Tensor tensor_parallel_join(const std::vector<at::Tensor>& slices, const dist::TensorParallelSplit& split);
// Where elements [a, b) of rank `rank`'s slice (row-major) lie in the whole parameter of shape `shape`: spans named
// `name` whose offsets count from a. Rows (dim 0) map to one contiguous range per block; columns (dim 1) to one span
// with a column window.
std::vector<ShardSpan> tensor_parallel_spans(const std::string& name, const std::vector<int64_t>& shape,
                                             const dist::TensorParallelSplit& split, int rank, int degree, int64_t a,
                                             int64_t b);

}  // namespace tessera::dist
