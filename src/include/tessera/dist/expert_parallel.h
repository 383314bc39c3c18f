// Expert parallelism's groups for the sharding engine (dist/fsdp.h): which MoE layers split their experts, over
// which ranks, and the token exchange installed on them. Internal to the engine.
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>

#include "tessera/dist/communicator.h"
#include "tessera/dist/sharding.h"
#include "tessera/models/causal_lm.h"

namespace tessera::dist {

struct ExpertGroups {
  int degree = 1;                         // moe_world_size (1: no layer splits its experts)
  std::shared_ptr<Communicator> group;    // this rank's expert-parallel group: `degree` consecutive ranks
  std::shared_ptr<Communicator> holders;  // the ranks that hold the same experts (HYBRID_SHARD: in the shard group)
  std::set<std::string> weight_names;     // the expert weights split (experts.mlp.w1 / v1 / w2 of each layer)
};

// Finds the model's MoE layers (models/moe.h) with moe_world_size > 1, checks the degree against the job (ConfigError
// naming the key: a world that is not a multiple of it, NO_SHARD, HYBRID_SHARD shard groups of `ranks_per_node` that
// do not hold whole groups, experts not a multiple of it), makes the groups (every rank of `world` calls this
// together) and installs on every such layer a token exchange over its group that runs `sync` before each exchange.
ExpertGroups setup_expert_parallel(models::CausalLM& model, ShardingStrategy strategy, int ranks_per_node,
                                   Communicator& world, std::function<void()> sync);

}  // namespace tessera::dist
