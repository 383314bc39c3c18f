// Expert parallelism's groups and token exchange for the sharding engine (see expert_parallel.h).
#include "tessera/distributed/expert_parallel.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <utility>
#include <vector>

#include "tessera/distributed/split_groups.h"
#include "tessera/util/error.h"

namespace tessera::dist {
namespace {

// The token exchange of an expert-parallel group over its communicator. `sync` runs before each exchange: the engine's
// sync point (agree_on_oom), so that a rank that ran out of memory between two exchanges is agreed on at the next one
// instead of leaving the others waiting in it.
class GroupExchange : public models::ExpertExchange {
 public:
  GroupExchange(std::shared_ptr<Communicator> comm, std::function<void()> sync)
      : comm_(std::move(comm)), sync_(std::move(sync)) {}
  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  at::Tensor all_gather(const at::Tensor& counts) override {
    at::Tensor in = counts.to(at::kLong).contiguous();
    at::Tensor out = at::empty({comm_->size() * in.numel()}, in.options());
    sync_();
    comm_->all_gather(out, in).wait();
    return out.view({comm_->size(), in.numel()}).cpu();
  }
  at::Tensor all_to_all(const at::Tensor& in, const std::vector<int64_t>& send,
                        const std::vector<int64_t>& recv) override {
    at::Tensor src = in.contiguous();
    std::vector<int64_t> shape = src.sizes().vec();
    shape[0] = 0;
    for (int64_t r : recv) shape[0] += r;
    at::Tensor out = at::empty(shape, src.options());
    sync_();
    comm_->all_to_all(out, src, recv, send).wait();
    return out;
  }

 private:
  std::shared_ptr<Communicator> comm_;
  std::function<void()> sync_;
};

}  // namespace

ExpertLayers find_expert_layers(const models::CausalLM& model, int64_t configured) {
  ExpertLayers out;
  int64_t requested = 1;
  std::string requested_by;
  for (const auto& m : model.named_modules()) {
    auto* layer = dynamic_cast<models::ExpertParallelLayer*>(m.value().get());
    if (layer == nullptr) continue;
    out.layers.push_back({m.key(), m.value(), layer});
    const int64_t asks = layer->requested_expert_parallel_degree();
    if (asks <= 1) continue;
    if (requested > 1 && asks != requested) {
      throw ConfigError("dist", fmt::format("the MoE layers ask for different expert-parallel degrees: {} ({}) and {} "
                                            "({})",
                                            requested, requested_by, asks, m.key()));
    }
    requested = asks;
    requested_by = m.key();
  }
  if (configured > 1) {
    if (out.layers.empty()) {
      throw ConfigError("dist",
                        fmt::format("parallelism.expert_parallel_degree {}: the model has no mixture-of-experts "
                                    "layers whose experts split over ranks",
                                    configured));
    }
    if (requested > 1 && requested != configured) {
      throw ConfigError("dist", fmt::format("parallelism.expert_parallel_degree {} but the model's MoE layers ask for "
                                            "{} in their own options",
                                            configured, requested));
    }
    out.degree = configured;
    out.key = fmt::format("parallelism.expert_parallel_degree {}", configured);
  } else if (requested > 1) {
    out.degree = requested;
    out.key = fmt::format("expert-parallel degree {} (the MoE layers' own option)", requested);
  }
  if (out.degree <= 1) {
    out.layers.clear();
    return out;
  }
  for (const ExpertLayer& l : out.layers) {
    if (l.capability->num_experts() % out.degree != 0) {
      throw ConfigError("dist", fmt::format("{}: {} has {} experts, not a multiple of it", out.key, l.name,
                                            l.capability->num_experts()));
    }
  }
  return out;
}

ExpertGroups setup_expert_parallel(models::CausalLM& model, int64_t configured, ShardingStrategy strategy,
                                   int ranks_per_node, Communicator& world_comm, std::function<void()> sync) {
  ExpertGroups out;
  const ExpertLayers found = find_expert_layers(model, configured);
  if (found.layers.empty()) return out;
  out.degree = static_cast<int>(found.degree);
  SplitGroups groups = make_split_groups(world_comm, out.degree, strategy, ranks_per_node, found.key, "expert");
  out.group = std::move(groups.group);
  out.holders = std::move(groups.holders);
  auto exchange = std::make_shared<GroupExchange>(out.group, std::move(sync));
  for (const ExpertLayer& l : found.layers) {
    const std::string prefix = l.name.empty() ? "" : l.name + ".";
    for (const std::string& w : l.capability->expert_weight_names()) out.weight_names.insert(prefix + w);
    const auto experts = l.capability->expert_module_weights();
    const size_t per_rank = experts.size() / static_cast<size_t>(out.degree);
    for (size_t e = 0; e < experts.size(); ++e) {
      for (const std::string& w : experts[e]) out.expert_owner[prefix + w] = static_cast<int>(e / per_rank);
    }
    l.capability->set_expert_exchange(exchange);
  }
  spdlog::info("dist: expert parallelism over groups of {} ranks ({} MoE layers, {} experts each per rank)", out.degree,
               found.layers.size(), found.layers[0].capability->num_experts() / out.degree);
  return out;
}

}  // namespace tessera::dist
