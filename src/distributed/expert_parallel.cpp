// Expert parallelism's groups and token exchange for the sharding engine (see expert_parallel.h).
#include "tessera/distributed/expert_parallel.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/autograd.h>

#include <utility>
#include <vector>

#include "tessera/distributed/split_groups.h"
#include "tessera/util/error.h"

namespace tessera::dist {
namespace {

// The token routing of an expert-parallel group over its communicator. `sync` runs before each exchange: the
// engine's sync point (agree_on_oom), so that a rank that ran out of memory between two exchanges is agreed on at the
// next one instead of leaving the others waiting in it.
class GroupExchange : public models::ExpertExchange {
 public:
  GroupExchange(std::shared_ptr<Communicator> comm, std::function<void()> sync)
      : comm_(std::move(comm)), sync_(std::move(sync)) {}
  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  at::Tensor route(const at::Tensor& xs, const at::Tensor& counts, int64_t num_experts,
                   const RunExperts& run_experts) override;

  // Every rank's `counts` ((n,) int64): (size(), n) int64 on the CPU, row r from rank r.
  at::Tensor all_gather(const at::Tensor& counts) {
    at::Tensor in = counts.to(at::kLong).contiguous();
    at::Tensor out = at::empty({comm_->size() * in.numel()}, in.options());
    sync_();
    comm_->all_gather(out, in).wait();
    return out.view({comm_->size(), in.numel()}).cpu();
  }
  // Rows of `in` in rank order, send[r] of them to rank r; returns recv[r] rows from each rank r, in rank order.
  at::Tensor all_to_all(const at::Tensor& in, const std::vector<int64_t>& send, const std::vector<int64_t>& recv) {
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

// The expert-parallel token exchange as one autograd node: backward sends the rows' gradients back the way they came.
struct AllToAllFunction : public torch::autograd::Function<AllToAllFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, GroupExchange* exchange,
                            const std::vector<int64_t>& send, const std::vector<int64_t>& recv) {
    ctx->saved_data["exchange"] = reinterpret_cast<int64_t>(exchange);
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    at::Tensor out = exchange->all_to_all(x, send, recv);
    ctx->saved_data["shape"] = out.sizes().vec();
    ctx->saved_data["like"] = at::empty({0}, out.options());
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* exchange = reinterpret_cast<GroupExchange*>(ctx->saved_data["exchange"].toInt());
    const std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    const std::vector<int64_t> recv = ctx->saved_data["recv"].toIntVector();
    const at::Tensor g = grads[0].defined() ? grads[0]
                                            : at::zeros(ctx->saved_data["shape"].toIntVector(),
                                                        ctx->saved_data["like"].toTensor().options());
    // Every rank of the group runs this backward (the exchanged rows always reach the layer's output).
    return {exchange->all_to_all(g.contiguous(), recv, send), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor GroupExchange::route(const at::Tensor& xs, const at::Tensor& counts, int64_t num_experts,
                                const RunExperts& run_experts) {
  const int64_t group = size(), me = rank();
  const int64_t local = num_experts / group;  // experts per rank: rank r holds [r * local, (r + 1) * local)
  // Every rank's rows per expert: all[r][e] rows go from rank r to expert e (on the CPU).
  const at::Tensor all = all_gather(counts);
  const at::Tensor mine = all.narrow(1, me * local, local);  // (group, local): rows coming to this rank's experts
  const at::Tensor to_send = all[me].view({group, local}).sum(1), to_recv = mine.sum(1);
  const std::vector<int64_t> send(to_send.data_ptr<int64_t>(), to_send.data_ptr<int64_t>() + group);
  const std::vector<int64_t> recv(to_recv.data_ptr<int64_t>(), to_recv.data_ptr<int64_t>() + group);
  // The received rows come by source rank, each source's grouped by expert; the experts want them by expert, in
  // source order within each: a stable sort of the rows by local expert.
  const at::Device dev = xs.device();
  const at::Tensor expert_of_row =
      at::arange(local, at::kLong).repeat({group}).repeat_interleave(mine.contiguous().view({-1})).to(dev);
  const at::Tensor perm_t = at::argsort(expert_of_row, /*stable=*/true, /*dim=*/0);
  const at::Tensor n = mine.sum(0).to(dev);
  const at::Tensor off = n.cumsum(0).to(at::kInt);
  const at::Tensor received = AllToAllFunction::apply(xs.contiguous(), this, send, recv);
  const at::Tensor out_local = run_experts(received.index_select(0, perm_t), n, off);
  // Back to the received order (the inverse permutation), then to the ranks the rows came from.
  const at::Tensor back = out_local.index_select(0, at::argsort(perm_t));
  return AllToAllFunction::apply(back.contiguous(), this, recv, send);
}

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
