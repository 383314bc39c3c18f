// Expert parallelism's groups for the sharding engine (distributed/fsdp.h): which MoE layers split their experts, over
// which ranks, and the token exchange installed on them. Internal to the engine and the planner.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "tessera/distributed/communicator.h"
#include "tessera/distributed/sharding.h"
#include "tessera/models/blocks/moe.h"
#include "tessera/models/causal_lm.h"

namespace tessera::dist {

// The model's layers with the expert-parallel capability (models::ExpertParallelLayer, whatever family they belong to)
// and the degree their experts split over: `configured` (parallelism.expert_parallel_degree) when above 1, else what
// the layers' own options ask for (LLM Foundry's moe_world_size). ConfigError naming the key for a degree the model
// cannot take: layers that ask for different degrees or for another one than `configured`, a configured degree with no
// such layer, experts that do not divide into it. Degree 1 and no layers when nothing splits.
struct ExpertLayer {
  std::string name;                           // the module's name in the model
  std::shared_ptr<torch::nn::Module> module;  // the layer
  models::ExpertParallelLayer* capability;    // the same layer, through its capability
};
struct ExpertLayers {
  int64_t degree = 1;
  std::string key;  // what set the degree, for messages ("parallelism.expert_parallel_degree 4")
  std::vector<ExpertLayer> layers;
};
ExpertLayers find_expert_layers(const models::CausalLM& model, int64_t configured);

struct ExpertGroups {
  int degree = 1;                         // the expert-parallel degree (1: no layer splits its experts)
  std::shared_ptr<Communicator> group;    // this rank's expert-parallel group: `degree` consecutive ranks
  std::shared_ptr<Communicator> holders;  // the ranks that hold the same experts (HYBRID_SHARD: in the shard group)
  std::set<std::string> weight_names;     // the expert weights split (each layer's expert_weight_names())
  // The weights of experts held as modules of their own (expert_module_weights()) -> the rank of the group that holds
  // each whole.
  std::map<std::string, int> expert_owner;
};

// find_expert_layers(model, configured), then checks the degree against the job (ConfigError naming the key: a world
// that is not a multiple of it, NO_SHARD, HYBRID_SHARD shard groups of `ranks_per_node` that do not hold whole groups),
// makes the groups (every rank of `world` calls this together) and installs on every such layer a token exchange over
// its group that runs `sync` before each exchange.
ExpertGroups setup_expert_parallel(models::CausalLM& model, int64_t configured, ShardingStrategy strategy,
                                   int ranks_per_node, Communicator& world, std::function<void()> sync);

}  // namespace tessera::dist
