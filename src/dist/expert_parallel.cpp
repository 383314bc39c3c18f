// Expert parallelism's groups and token exchange for the sharding engine (see expert_parallel.h).
#include "tessera/dist/expert_parallel.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <utility>
#include <vector>

#include "tessera/dist/split_groups.h"
#include "tessera/models/moe.h"
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

ExpertGroups setup_expert_parallel(models::CausalLM& model, ShardingStrategy strategy, int ranks_per_node,
                                   Communicator& world_comm, std::function<void()> sync) {
  ExpertGroups out;
  int& degree = out.degree;
  std::vector<std::pair<std::string, std::shared_ptr<models::MoEImpl>>> layers;
  for (const auto& m : model.named_modules()) {
    auto moe = std::dynamic_pointer_cast<models::MoEImpl>(m.value());
    if (!moe || moe->options().world_size <= 1) continue;
    const int64_t ep = moe->options().world_size;
    if (degree > 1 && ep != degree) {
      throw ConfigError("dist",
                        fmt::format("model.ffn_config.moe_world_size: MoE layers disagree ({} and {})", degree, ep));
    }
    degree = static_cast<int>(ep);
    layers.emplace_back(m.key(), moe);
  }
  std::set<std::string>& names = out.weight_names;
  if (layers.empty()) return out;
  const std::string key = fmt::format("model.ffn_config.moe_world_size {}", degree);
  SplitGroups groups = make_split_groups(world_comm, degree, strategy, ranks_per_node, key, "expert");
  out.group = std::move(groups.group);
  out.holders = std::move(groups.holders);
  auto exchange = std::make_shared<GroupExchange>(out.group, std::move(sync));
  for (auto& [prefix, moe] : layers) {
    if (moe->options().num_experts % degree != 0) {
      throw ConfigError(
          "dist", fmt::format("{}: {} has {} experts, not a multiple of it", key, prefix, moe->options().num_experts));
    }
    const std::string base = prefix.empty() ? "experts.mlp." : prefix + ".experts.mlp.";
    for (const char* w : {"w1", "v1", "w2"}) {
      if (std::string(w) == "v1" && !moe->options().glu) continue;
      names.insert(base + w);
    }
    moe->set_expert_exchange(exchange);
  }
  spdlog::info("dist: expert parallelism over groups of {} ranks ({} MoE layers, {} experts each per rank)", degree,
               layers.size(), layers[0].second->options().num_experts / degree);
  return out;
}

}  // namespace tessera::dist
