// Tensor parallelism's groups, slices and layouts for the sharding engine (see tensor_parallel.h).
#include "tessera/distributed/tensor_parallel.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <utility>

#include "tessera/distributed/parallel_styles.h"
#include "tessera/distributed/split_groups.h"
#include "tessera/util/error.h"

namespace tessera::dist {
namespace {

// The group's all-reduce over its communicator. `sync` runs first: the engine's sync point (agree_on_oom), so that a
// rank that ran out of memory between two collectives is agreed on at the next one instead of leaving the others
// waiting in it.
class GroupAllReduce : public dist::TensorParallelGroup {
 public:
  GroupAllReduce(std::shared_ptr<Communicator> comm, std::function<void()> sync)
      : comm_(std::move(comm)), sync_(std::move(sync)) {}
  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  void all_reduce(at::Tensor& t) override {
    sync_();
    comm_->all_reduce(t).wait();
  }
  at::Tensor all_gather(const at::Tensor& t) override {
    std::vector<int64_t> shape = t.sizes().vec();
    shape[0] *= comm_->size();
    at::Tensor out = at::empty(shape, t.options());
    at::Tensor in = t.contiguous();
    sync_();
    comm_->all_gather(out, in).wait();
    return out;
  }
  at::Tensor reduce_scatter(const at::Tensor& t) override {
    std::vector<int64_t> shape = t.sizes().vec();
    shape[0] /= comm_->size();
    at::Tensor out = at::empty(shape, t.options());
    at::Tensor in = t.contiguous();
    sync_();
    comm_->reduce_scatter(out, in).wait();
    return out;
  }

 private:
  std::shared_ptr<Communicator> comm_;
  std::function<void()> sync_;
};

// Context parallelism's exchange over a group: a layer's keys and values gathered along the sequence.
class GroupContextExchange : public models::ContextExchange {
 public:
  explicit GroupContextExchange(std::shared_ptr<dist::TensorParallelGroup> group) : group_(std::move(group)) {}
  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }
  at::Tensor whole_sequence(const at::Tensor& t, int64_t dim) override {
    return dist::gather_along(t, dim, group_, /*sum_gradient=*/true);
  }

 private:
  std::shared_ptr<dist::TensorParallelGroup> group_;
};

std::vector<int64_t> blocks_of(const dist::TensorParallelSplit& split, int64_t size) {
  return split.blocks.empty() ? std::vector<int64_t>{size} : split.blocks;
}

}  // namespace

std::shared_ptr<dist::TensorParallelGroup> group_collectives(std::shared_ptr<Communicator> comm) {
  return std::make_shared<GroupAllReduce>(std::move(comm), [] {});
}

std::shared_ptr<models::ContextExchange> context_exchange(std::shared_ptr<Communicator> comm) {
  return std::make_shared<GroupContextExchange>(group_collectives(std::move(comm)));
}

std::shared_ptr<models::ContextExchange> setup_context_parallel(const models::CausalLM& model, int degree,
                                                                int tp_degree, Communicator& world,
                                                                std::function<void()> sync) {
  if (degree <= 1) return nullptr;
  const std::string key = fmt::format("parallelism.context_parallel_degree {}", degree);
  const int n = world.size(), block = degree * tp_degree;
  if (n % block != 0) {
    throw ConfigError(
        "dist",
        fmt::format("{}: the job's {} rank(s) do not split into context-parallel groups of {}{}", key, n, degree,
                    tp_degree > 1 ? fmt::format(" x tensor-parallel groups of {}", tp_degree) : std::string()));
  }
  if (!model.supports_context_parallel()) {
    throw ConfigError("dist", fmt::format("{}: model family \"{}\" does not run on context shards "
                                          "(CausalLM::supports_context_parallel: every built-in family does but "
                                          "with mixture-of-experts layers)",
                                          key, model.family()));
  }
  std::shared_ptr<Communicator> mine;
  for (int b = 0; b < n / block; ++b) {
    for (int t = 0; t < tp_degree; ++t) {
      std::vector<int> ranks;
      for (int c = 0; c < degree; ++c) ranks.push_back(b * block + c * tp_degree + t);
      if (auto g = world.new_group(ranks)) mine = g;
    }
  }
  if (world.rank() == 0) {
    spdlog::info("context parallelism over groups of {} ranks (keys and values all-gathered per attention layer)",
                 degree);
  }
  return std::make_shared<GroupContextExchange>(std::make_shared<GroupAllReduce>(std::move(mine), std::move(sync)));
}

TensorGroups setup_tensor_parallel(models::CausalLM& model, int degree, bool sequence_parallel,
                                   ShardingStrategy strategy, int ranks_per_node, Communicator& world_comm,
                                   std::function<void()> sync) {
  TensorGroups out;
  if (degree <= 1) return out;
  out.degree = degree;
  const std::string key = fmt::format("parallelism.tensor_parallel_degree {}", degree);
  SplitGroups groups = make_split_groups(world_comm, degree, strategy, ranks_per_node, key, "tensor");
  const models::TensorParallelPlan plan = tensor_parallel_plan_of(model, degree, key);
  out.splits = tensor_parallel_splits(model, plan, degree, key);
  out.group = std::move(groups.group);
  out.holders = std::move(groups.holders);
  out.state = std::make_shared<TensorParallelState>();
  out.state->group = std::make_shared<GroupAllReduce>(out.group, std::move(sync));
  out.state->sequence_parallel = sequence_parallel;
  install_tensor_parallel_styles(model, plan, out.state);
  spdlog::info("dist: tensor parallelism over groups of {} ranks ({} weights split), sequence parallelism {}", degree,
               out.splits.size(), sequence_parallel ? "on" : "off");
  return out;
}

at::Tensor tensor_parallel_slice(const at::Tensor& full, const dist::TensorParallelSplit& split, int rank, int degree) {
  std::vector<at::Tensor> parts;
  int64_t at = 0;
  for (int64_t b : blocks_of(split, full.size(split.dim))) {
    const int64_t share = b / degree;
    parts.push_back(full.narrow(split.dim, at + rank * share, share));
    at += b;
  }
  return at::cat(parts, split.dim).contiguous();
}

at::Tensor tensor_parallel_join(const std::vector<at::Tensor>& slices, const dist::TensorParallelSplit& split) {
  const auto degree = static_cast<int64_t>(slices.size());
  const int64_t local = slices.at(0).size(split.dim);
  std::vector<at::Tensor> parts;
  int64_t at = 0;  // where the block starts in a slice
  for (int64_t b : blocks_of(split, local * degree)) {
    const int64_t share = b / degree;
    for (const at::Tensor& s : slices) parts.push_back(s.narrow(split.dim, at, share));
    at += share;
  }
  return at::cat(parts, split.dim);
}

std::vector<ShardSpan> tensor_parallel_spans(const std::string& name, const std::vector<int64_t>& shape,
                                             const dist::TensorParallelSplit& split, int rank, int degree, int64_t a,
                                             int64_t b) {
  std::vector<ShardSpan> out;
  if (a >= b) return out;
  if (split.dim == 1) {
    // The slice is the sub-matrix [:, rank * cols, (rank + 1) * cols): its row-major order is the slice's own.
    const int64_t cols = shape[1] / degree;
    out.push_back({name, shape, a, b - a, 0, rank * cols, cols});
    return out;
  }
  int64_t row = 1;  // elements per row of dim 0
  for (size_t d = 1; d < shape.size(); ++d) row *= shape[d];
  int64_t local_rows = 0, global_rows = 0;  // where the block starts in the slice and in the whole parameter
  for (int64_t blk : blocks_of(split, shape[0])) {
    const int64_t share = blk / degree;
    const int64_t lo = std::max(a, local_rows * row), hi = std::min(b, (local_rows + share) * row);
    if (lo < hi) {
      out.push_back({name, shape, (global_rows + rank * share) * row + (lo - local_rows * row), hi - lo, lo - a});
    }
    local_rows += share;
    global_rows += blk;
  }
  return out;
}

}  // namespace tessera::dist
