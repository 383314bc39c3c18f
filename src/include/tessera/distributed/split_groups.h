// The groups of ranks that split some of the model's weights among themselves (expert parallelism's experts, tensor
// parallelism's slices) for the sharding engine (distributed/fsdp.h). Internal to the engine.
#pragma once

#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

#include "tessera/distributed/communicator.h"
#include "tessera/distributed/sharding.h"
#include "tessera/util/error.h"

namespace tessera::dist {

struct SplitGroups {
  std::shared_ptr<Communicator> group;    // this rank's group: `degree` consecutive ranks
  std::shared_ptr<Communicator> holders;  // the ranks at the same position in their groups, which hold the same share
};

// Checks `degree` against the job -- ConfigError naming `key` for a world that is not a multiple of it, NO_SHARD, or
// HYBRID_SHARD shard groups of `ranks_per_node` that do not hold whole groups; `what` ("expert", "tensor") names the
// parallelism -- and makes the groups: `degree` consecutive ranks (the innermost mesh dimension, as torchtitan places
// it), and the holders of each share, all of them or under HYBRID_SHARD those in this shard group (their copies then
// replicate across shard groups as the dense shards do). Every rank of `world` calls it together.
inline SplitGroups make_split_groups(Communicator& world, int degree, ShardingStrategy strategy, int ranks_per_node,
                                     const std::string& key, const std::string& what) {
  const int n = world.size();
  if (n % degree != 0) {
    throw ConfigError("dist", fmt::format("{}: the job's {} rank(s) do not split into {}-parallel groups of {}", key, n,
                                          what, degree));
  }
  if (strategy == ShardingStrategy::kNoShard) {
    throw ConfigError("dist", fmt::format("{}: {} parallelism needs a sharded strategy (FULL_SHARD, SHARD_GRAD_OP or "
                                          "HYBRID_SHARD), not NO_SHARD",
                                          key, what));
  }
  const bool hybrid = strategy == ShardingStrategy::kHybridShard && ranks_per_node < n;
  if (hybrid && ranks_per_node % degree != 0) {
    throw ConfigError("dist", fmt::format("{}: HYBRID_SHARD keeps a {}-parallel group within a shard group, and shard "
                                          "groups of {} ranks do not split into groups of {}",
                                          key, what, ranks_per_node, degree));
  }
  SplitGroups out;
  for (int g = 0; g < n / degree; ++g) {
    std::vector<int> ranks;
    for (int i = 0; i < degree; ++i) ranks.push_back(g * degree + i);
    if (auto c = world.new_group(ranks)) out.group = c;
  }
  const int span = hybrid ? ranks_per_node : n;
  for (int s = 0; s < n / span; ++s) {
    for (int i = 0; i < degree; ++i) {
      std::vector<int> ranks;
      for (int r = i; r < span; r += degree) ranks.push_back(s * span + r);
      if (auto c = world.new_group(ranks)) out.holders = c;
    }
  }
  return out;
}

}  // namespace tessera::dist
