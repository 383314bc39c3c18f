// ParallelModel's public face (see fsdp.h): the shards the optimizer steps, whole state dicts, the shard layouts
// checkpoints store, memory and sizes.
#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tessera/distributed/fsdp.h"
#include "tessera/distributed/fsdp_impl.h"
#include "tessera/distributed/tensor_parallel.h"

namespace tessera::dist {

// ---- ParallelModel --------------------------------------------------------------------------------------------------

const std::vector<at::Tensor>& ParallelModel::parameters() const {
  return impl_->parameters_;
}

const std::vector<std::pair<std::string, at::Tensor>>& ParallelModel::frozen_parameters() const {
  return impl_->frozen_;
}

void ParallelModel::prepare_backward(bool sync) {
  impl_->sync_ = sync;
}

bool ParallelModel::agree_on_oom(bool this_rank_failed) {
  return impl_->agree(this_rank_failed);
}

void ParallelModel::discard_microbatches() {
  impl_->discard();
}

void ParallelModel::finish_backward() {
  impl_->finish_backward();
}

at::Tensor ParallelModel::sum_over_shards(const at::Tensor& t) {
  at::Tensor out = t.contiguous().clone();
  if (impl_->sharded()) impl_->shard_comm_->all_reduce(out).wait();
  // Pipeline stages hold different blocks (the root's gradient only on the first stage: finish_backward).
  if (impl_->pipelined()) impl_->o_.pipeline.group->all_reduce(out).wait();
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> ParallelModel::full_state_dict() {
  at::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> by_name;
  for (Unit* u : impl_->parts_) {
    at::Tensor full = u->shard.detach();
    if (impl_->sharded() && u->padded > 0) {
      full = at::empty({u->padded}, u->shard.options());
      at::Tensor shard = u->shard.detach().contiguous();
      u->comm->all_gather(full, shard).wait();
    }
    for (size_t i = 0; i < u->params.size(); ++i) {
      at::Tensor part = full.narrow(0, u->offsets[i], u->params[i].numel()).contiguous();
      if (u->tp[i] != nullptr) {
        // A tensor-parallel slice: every rank of the group holds its own; joined they make the whole parameter.
        at::Tensor all = at::empty({part.numel() * impl_->tp_}, part.options());
        impl_->tp_comm_->all_gather(all, part).wait();
        std::vector<at::Tensor> slices;
        for (int r = 0; r < impl_->tp_; ++r)
          slices.push_back(all.narrow(0, r * part.numel(), part.numel()).view(u->params[i].sizes()));
        by_name[u->names[i]] = tensor_parallel_join(slices, *u->tp[i]).contiguous();
        continue;
      }
      if (u->global_shapes[i] != u->params[i].sizes().vec()) {
        // Experts: every rank of the expert-parallel group holds its rows; in rank order they make the whole weight.
        at::Tensor whole = at::empty({part.numel() * impl_->ep_comm_->size()}, part.options());
        impl_->ep_comm_->all_gather(whole, part).wait();
        part = whole;
      }
      by_name[u->names[i]] = part.view(u->global_shapes[i]).clone();
    }
  }
  for (const auto& [name, t] : impl_->frozen_)
    by_name[name] = t.detach().to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
  // Experts held as modules of their own: each whole on one rank of the expert-parallel group, sent to the others (in
  // the model's order, the same on every rank).
  for (const std::string& name : impl_->names_) {
    const auto owner = impl_->expert_owner_.find(name);
    if (owner == impl_->expert_owner_.end()) continue;
    at::Tensor t;
    if (owner->second == impl_->ep_comm_->rank()) {
      t = by_name.at(name).contiguous();
    } else {
      t = at::empty(impl_->remote_expert_shapes_.at(name),
                    at::TensorOptions().dtype(at::kFloat).device(impl_->o_.device));
    }
    impl_->ep_comm_->broadcast(t, owner->second).wait();
    by_name[name] = t;
  }
  // Pipeline stages: each parameter from the stage whose copy counts (the root from the first), in the model's order.
  if (impl_->pipelined()) {
    const PipelineStageOptions& pp = impl_->o_.pipeline;
    std::map<std::string, std::vector<int64_t>> shapes(parameter_shapes().begin(), parameter_shapes().end());
    for (const std::string& name : impl_->names_) {
      const int owner = impl_->stage_of_unit(impl_->unit_of_name_.at(name));
      at::Tensor t = owner == pp.stage
                         ? by_name.at(name).contiguous()
                         : at::empty(shapes.at(name), at::TensorOptions().dtype(at::kFloat).device(impl_->o_.device));
      pp.group->broadcast(t, owner).wait();
      by_name[name] = t;
    }
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const std::string& name : impl_->names_) out.emplace_back(name, by_name.at(name));
  return out;
}

std::vector<std::vector<ShardSpan>> ParallelModel::shard_layout() const {
  std::vector<std::vector<ShardSpan>> out;
  const bool sharded = impl_->sharded();
  for (const Unit* u : impl_->parts_) {
    if (u->index == 0 && impl_->pipelined() && impl_->o_.pipeline.stage > 0) {  // the first stage's copy counts
      out.emplace_back();
      continue;
    }
    // This rank's slice of the unit's flat vector: [lo, lo + shard_numel).
    const int64_t lo = sharded && u->comm ? u->comm->rank() * u->shard_numel : 0;
    const int64_t hi = lo + u->shard_numel;
    std::vector<ShardSpan> spans;
    for (size_t i = 0; i < u->params.size(); ++i) {
      const int64_t p_lo = u->offsets[i], p_hi = p_lo + u->params[i].numel();
      const int64_t a = std::max(lo, p_lo), b = std::min(hi, p_hi);
      if (a >= b) continue;
      if (u->tp[i] != nullptr) {
        for (ShardSpan sp : tensor_parallel_spans(u->names[i], u->global_shapes[i], *u->tp[i], impl_->tp_comm_->rank(),
                                                  impl_->tp_, a - p_lo, b - p_lo)) {
          sp.offset += a - lo;
          spans.push_back(std::move(sp));
        }
        continue;
      }
      spans.push_back({u->names[i], u->global_shapes[i], u->global_starts[i] + a - p_lo, b - a, a - lo});
    }
    out.push_back(std::move(spans));
  }
  return out;
}

bool ParallelModel::stores_shards() const {
  if (!impl_->sharded()) return impl_->comm_->rank() == 0;
  return !impl_->replica_comm_ || impl_->replica_comm_->rank() == 0;
}

ShardMemory ParallelModel::memory() const {
  ShardMemory m;
  for (const at::Tensor& p : impl_->parameters_) {
    m.param_bytes += static_cast<int64_t>(p.nbytes());
    if (p.grad().defined()) m.grad_bytes += static_cast<int64_t>(p.grad().nbytes());
  }
  return m;
}

Communicator& ParallelModel::comm() {
  return *impl_->comm_;
}

const ParallelOptions& ParallelModel::options() const {
  return impl_->o_;
}

std::shared_ptr<models::ContextExchange> ParallelModel::context_exchange() const {
  return impl_->cp_group_;
}

std::shared_ptr<dist::TensorParallelGroup> ParallelModel::vocab_parallel_group() const {
  const auto& state = impl_->tp_state_;
  return state && state->vocab > 0 ? state->group : nullptr;
}

ParallelModel::LocalLogits::LocalLogits(const ParallelModel& model, bool on) : model_(model) {
  if (const auto& state = model_.impl_->tp_state_) {
    before_ = state->local_logits;
    state->local_logits = on && state->vocab > 0;
  }
}

ParallelModel::LocalLogits::~LocalLogits() {
  if (const auto& state = model_.impl_->tp_state_) state->local_logits = before_;
}

const std::vector<std::pair<std::string, std::vector<int64_t>>>& ParallelModel::parameter_shapes() const {
  auto& out = impl_->parameter_shapes_;
  if (!out.empty()) return out;  // fixed since setup: listed once (adaptive clipping asks every step)
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const Unit* u : impl_->parts_) {
    for (size_t i = 0; i < u->names.size(); ++i) shapes[u->names[i]] = u->global_shapes[i];
  }
  for (const auto& [name, t] : impl_->frozen_) shapes[name] = t.sizes().vec();
  for (const auto& [name, shape] : impl_->remote_expert_shapes_) shapes[name] = shape;
  for (const auto& [name, shape] : impl_->other_stage_shapes_) shapes[name] = shape;
  for (const std::string& name : impl_->names_) out.emplace_back(name, shapes.at(name));
  return out;
}

void ParallelModel::set_stage_input(at::Tensor x) {
  impl_->stage_input_ = std::move(x);
}

void ParallelModel::sync_stage_copies() {
  if (!impl_->pipelined() || !impl_->root_pair_) return;
  at::NoGradGuard no_grad;
  each_part(*impl_->units_[0], [&](Unit& part) {
    at::Tensor root = part.shard.detach();
    impl_->root_pair_->broadcast(root, 0).wait();
  });
}

std::vector<int64_t> ParallelModel::unit_sizes() const {
  std::vector<int64_t> out;
  for (const auto& u : impl_->units_) out.push_back(u->numel + (u->split ? u->split->numel : 0));
  return out;
}

}  // namespace tessera::dist
