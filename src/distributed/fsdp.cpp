// The sharding engine (see fsdp.h): flat per-unit parameters, gather/free around each unit call, gradients reduced
// asynchronously from inside backward.
#include "tessera/distributed/fsdp.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <ATen/autocast_mode.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "tessera/distributed/expert_parallel.h"
#include "tessera/distributed/fsdp_impl.h"
#include "tessera/distributed/tensor_parallel.h"

namespace tessera::dist {
namespace {

// Sets the styles' per-call sequence-shard flag for one layer call and restores it after, on errors too.
class ShardedFlag {
 public:
  ShardedFlag(TensorParallelState& state, bool sharded) : state_(state), before_(state.sharded) {
    state_.sharded = sharded;
  }
  ~ShardedFlag() { state_.sharded = before_; }
  ShardedFlag(const ShardedFlag&) = delete;
  ShardedFlag& operator=(const ShardedFlag&) = delete;

 private:
  TensorParallelState& state_;
  bool before_;
};

// Frees a buffer's memory while keeping its StorageImpl, which the parameter views and autograd's saved tensors
// share; realloc_storage gives it memory again before the next gather writes into it.
void free_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (s->nbytes() == 0) return;
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

void realloc_storage(const at::Tensor& t, size_t nbytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (s->nbytes() == nbytes) return;
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

}  // namespace

std::pair<at::ScalarType, at::ScalarType> mixed_precision_dtypes(MixedPrecision mp, at::ScalarType low) {
  switch (mp) {
    case MixedPrecision::kFull:
      return {at::kFloat, at::kFloat};
    case MixedPrecision::kDefault:
      return {low, at::kFloat};
    case MixedPrecision::kPure:
      return {low, low};
  }
  return {at::kFloat, at::kFloat};
}

namespace {

// One unit call as one autograd node. Inputs: the unit's input and its shard (an anchor, so that the node exists
// even when the input needs no gradient, as for token ids); gradients for the shard go through the reduction, not
// through autograd.
struct UnitFunction : public torch::autograd::Function<UnitFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& anchor,
                            CallRecord* rec) {
    (void)anchor;
    ctx->saved_data["record"] = reinterpret_cast<int64_t>(rec);
    rec->x_requires_grad = x.requires_grad();
    if (rec->recompute) {
      rec->x_in = x.detach();
      at::Tensor out = rec->fn(rec->x_in);  // grad mode is off inside a custom forward
      return out;
    }
    at::AutoGradMode enable(true);
    rec->x_leaf = x.detach();
    if (rec->x_requires_grad) rec->x_leaf.requires_grad_(true);
    rec->out = rec->fn(rec->x_leaf);
    return rec->out.detach();
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* rec = reinterpret_cast<CallRecord*>(ctx->saved_data["record"].toInt());
    at::Tensor gx = rec->engine->backward_call(*rec, grads[0]);
    return {gx, at::Tensor(), at::Tensor()};
  }
};

// The modules that own parameters of `unit` (init_weights selects modules by name).
std::set<std::string> modules_of_unit(models::CausalLM& model, int64_t unit) {
  std::set<std::string> out;
  for (const auto& m : model.named_modules()) {
    for (const auto& p : m.value()->named_parameters(/*recurse=*/false)) {
      const std::string name = m.key().empty() ? p.key() : m.key() + "." + p.key();
      if (model.unit_of_parameter(name) == unit) out.insert(m.key());
    }
  }
  return out;
}

}  // namespace

void ParallelModel::Impl::build_flat(Unit& u, const std::vector<at::Tensor>& sources, bool split) {
  const int shards = sharded() ? u.comm->size() : 1;
  const int shard_rank = sharded() ? u.comm->rank() : 0;
  std::vector<at::Tensor> flat_parts;
  for (const at::Tensor& p : sources) {
    u.offsets.push_back(u.numel);
    u.numel += p.numel();
    flat_parts.push_back(p.detach().to(at::kFloat).reshape({-1}));
  }
  u.padded = (u.numel + shards - 1) / shards * shards;
  u.shard_numel = u.padded / shards;
  at::Tensor flat = at::zeros({u.padded}, flat_parts[0].options());
  flat.narrow(0, 0, u.numel).copy_(at::cat(flat_parts));
  if (o_.sharding.sync_module_states) {
    // Rank 0's values; for a split part, those of the first rank that holds the same ones.
    if (!split) {
      comm_->broadcast(flat, 0).wait();
    } else {
      holders_comm_->broadcast(flat, 0).wait();
      if (replica_comm_) replica_comm_->broadcast(flat, 0).wait();
    }
  }
  if (!sharded()) {
    u.shard = flat;
    u.full = flat;
    u.gathered = true;
  } else {
    u.shard = flat.narrow(0, shard_rank * u.shard_numel, u.shard_numel).clone();
    u.full = at::empty({u.padded}, flat.options().dtype(o_.param_dtype));
  }
  u.shard.requires_grad_(true);
  for (size_t i = 0; i < u.params.size(); ++i) {
    at::Tensor& p = u.params[i];
    p.set_data(u.full.narrow(0, u.offsets[i], sources[i].numel()).view(sources[i].sizes()));
  }
  if (sharded()) free_storage(u.full);
}

void ParallelModel::Impl::setup(models::CausalLM& model) {
  const int world = comm_->size();
  const ShardingStrategy strategy = o_.sharding.strategy;
  // Groups: HYBRID_SHARD shards within nodes of ranks_per_node consecutive ranks and replicates across them.
  if (strategy == ShardingStrategy::kHybridShard && o_.ranks_per_node < world) {
    const int per_node = o_.ranks_per_node;
    if (per_node < 1 || world % per_node != 0) {
      throw ConfigError("dist", fmt::format("HYBRID_SHARD: {} ranks do not split into nodes of {}", world, per_node));
    }
    const int nodes = world / per_node;
    for (int n = 0; n < nodes; ++n) {
      std::vector<int> ranks;
      for (int r = 0; r < per_node; ++r) ranks.push_back(n * per_node + r);
      if (auto g = comm_->new_group(ranks)) shard_comm_ = g;
    }
    for (int r = 0; r < per_node; ++r) {
      std::vector<int> ranks;
      for (int n = 0; n < nodes; ++n) ranks.push_back(n * per_node + r);
      if (auto g = comm_->new_group(ranks)) replica_comm_ = g;
    }
  } else {
    shard_comm_ = comm_;
  }
  if (pipelined()) {
    const PipelineStageOptions& pp = o_.pipeline;
    if (!pp.group || pp.group->size() != pp.stages || pp.group->rank() != pp.stage) {
      throw Error("dist", fmt::format("pipeline stage {} of {}: the pipeline group must hold one rank per stage, this "
                                      "rank at its stage",
                                      pp.stage, pp.stages));
    }
    const auto refuse = [&](const std::string& what) {
      throw ConfigError(
          "dist", fmt::format("parallelism.pipeline_parallel_degree {} with {}: not supported yet", pp.stages, what));
    };
    if (o_.sharding.expert_parallel_degree > 1) refuse("expert parallelism");
    if (strategy == ShardingStrategy::kHybridShard) refuse("HYBRID_SHARD");
    if (o_.agree_on_oom) refuse("device_train_microbatch_size: auto");
    root_pair_ = pp.group->new_group({0, pp.stages - 1});  // none on the stages in between
    at::Tensor mine = at::tensor(std::vector<int64_t>{pp.first_block, pp.last_block}, at::kLong).to(o_.device);
    at::Tensor all = at::empty({2 * pp.stages}, mine.options());
    pp.group->all_gather(all, mine).wait();
    const at::Tensor blocks = all.cpu();
    for (int st = 0; st < pp.stages; ++st) {
      stage_blocks_.emplace_back(blocks[2 * st].item<int64_t>(), blocks[2 * st + 1].item<int64_t>());
    }
  }
  ExpertGroups ep = setup_expert_parallel(model, o_.sharding.expert_parallel_degree, o_.sharding.strategy,
                                          o_.ranks_per_node, *comm_, [this] { sync_point(); });
  ep_ = ep.degree;
  ep_comm_ = std::move(ep.group);
  holders_comm_ = std::move(ep.holders);
  const std::set<std::string>& expert_names = ep.weight_names;
  expert_owner_ = std::move(ep.expert_owner);
  const int ep_rank = ep_comm_ ? ep_comm_->rank() : 0;
  const int tp_degree = static_cast<int>(o_.sharding.tensor_parallel_degree);
  if (ep_ > 1 && tp_degree > 1) {
    throw ConfigError("dist",
                      fmt::format("parallelism.tensor_parallel_degree {} with expert-parallel degree {}: tensor and "
                                  "expert parallelism together are not supported yet",
                                  tp_degree, ep_));
  }
  TensorGroups tp = setup_tensor_parallel(model, tp_degree, o_.sharding.sequence_parallel, o_.sharding.strategy,
                                          o_.ranks_per_node, *comm_, [this] { sync_point(); });
  tp_ = tp.degree;
  tp_comm_ = std::move(tp.group);
  if (tp.holders) holders_comm_ = std::move(tp.holders);
  tp_splits_ = std::move(tp.splits);
  tp_state_ = std::move(tp.state);
  const int tp_rank = tp_comm_ ? tp_comm_->rank() : 0;
  cp_group_ = setup_context_parallel(model, static_cast<int>(o_.sharding.context_parallel_degree), tp_degree, *comm_,
                                     [this] { sync_point(); });

  // Every parameter by unit; frozen ones (requires_grad false) stay whole, outside the flat vectors.
  std::map<int64_t, std::unique_ptr<Unit>> by_index;
  std::map<int64_t, std::vector<at::Tensor>> unit_frozen;
  for (auto& item : model.named_parameters()) {
    names_.push_back(item.key());
    const int64_t idx = model.unit_of_parameter(item.key());
    unit_of_name_[item.key()] = idx;
    auto& u = by_index[idx];
    if (!u) {
      u = std::make_unique<Unit>();
      u->index = idx;
      u->comm = shard_comm_.get();
      u->replica = replica_comm_.get();
    }
    if (!runs_unit(idx)) {  // another pipeline stage's: never materialised on this rank
      other_stage_shapes_[item.key()] = item.value().sizes().vec();
      if (!item.value().is_meta()) {
        const at::Tensor meta = at::empty(item.value().sizes(), item.value().options().device(at::kMeta));
        item.value().unsafeGetTensorImpl()->shallow_copy_from(meta.getIntrusivePtr());
      }
      continue;
    }
    const auto owner = expert_owner_.find(item.key());
    const bool expert = expert_names.count(item.key()) > 0 || owner != expert_owner_.end();
    auto split = tp_splits_.find(item.key());
    const bool sliced = split != tp_splits_.end();
    if (!item.value().requires_grad()) {
      if (expert || sliced) {
        throw ConfigError("dist", fmt::format("{} parallelism: {} is frozen; frozen weights (the base of LoRA) are not "
                                              "split over ranks",
                                              expert ? "expert" : "tensor", item.key()));
      }
      frozen_.emplace_back(item.key(), item.value());
      unit_frozen[idx].push_back(item.value());
      continue;
    }
    if (owner != expert_owner_.end() && owner->second != ep_rank) {  // another rank's expert, whole
      remote_expert_shapes_[item.key()] = item.value().sizes().vec();
      continue;
    }
    Unit* target = u.get();
    if (expert || sliced) {
      if (!u->split) {
        u->split = std::make_unique<Unit>();
        u->split->index = idx;
        u->split->comm = holders_comm_.get();
        u->split->replica = replica_comm_.get();
        u->split->grad_scale = sliced ? tp_ : 1;
      }
      target = u->split.get();
    }
    target->names.push_back(item.key());
    target->params.push_back(item.value());
    target->tp.push_back(sliced ? &split->second : nullptr);
  }
  at::NoGradGuard no_grad;
  for (auto& [idx, u] : by_index) {
    std::vector<at::Tensor> all = u->params;
    if (u->split) all.insert(all.end(), u->split->params.begin(), u->split->params.end());
    for (const at::Tensor& p : unit_frozen[idx]) all.push_back(p);
    if (!all.empty() && all[0].is_meta()) {
      // Deferred initialisation: allocate this unit only, initialise its modules, shard it below.
      for (at::Tensor& p : all) {
        const at::Tensor real = at::empty(p.sizes(), at::TensorOptions().dtype(at::kFloat).device(o_.device));
        // set_data refuses meta -> real; the shallow copy is what it does after that check.
        p.unsafeGetTensorImpl()->shallow_copy_from(real.getIntrusivePtr());
      }
      const std::set<std::string> modules = modules_of_unit(model, idx);
      model.init_weights(o_.init_seed, [&modules](const std::string& m) { return modules.count(m) > 0; });
    }
    if (o_.sharding.sync_module_states) {
      for (at::Tensor& p : unit_frozen[idx]) {
        at::Tensor t = p.detach();
        comm_->broadcast(t, 0).wait();
      }
    }
    for (const at::Tensor& p : u->params) {
      u->global_shapes.push_back(p.sizes().vec());
      u->global_starts.push_back(0);
    }
    if (u->split) {
      // This rank's experts: rows [ep_rank * rows, (ep_rank + 1) * rows) of each (E * F, d) weight; or its
      // tensor-parallel slices.
      Unit& x = *u->split;
      std::vector<at::Tensor> mine;
      for (size_t i = 0; i < x.params.size(); ++i) {
        const at::Tensor& p = x.params[i];
        x.global_shapes.push_back(p.sizes().vec());
        if (x.tp[i] != nullptr) {
          x.global_starts.push_back(0);
          mine.push_back(tensor_parallel_slice(p.detach(), *x.tp[i], tp_rank, tp_));
          continue;
        }
        if (expert_owner_.count(x.names[i]) > 0) {  // one of this rank's experts, whole
          x.global_starts.push_back(0);
          mine.push_back(p.detach());
          continue;
        }
        const int64_t rows = p.size(0) / ep_;
        x.global_starts.push_back(ep_rank * rows * (p.numel() / p.size(0)));
        mine.push_back(p.detach().narrow(0, ep_rank * rows, rows));
      }
      build_flat(x, mine, /*split=*/true);
    }
    if (u->params.empty()) {  // every parameter of the unit is frozen: an empty flat vector, no collectives
      u->shard = at::zeros({0}, at::TensorOptions().dtype(at::kFloat).device(o_.device)).requires_grad_(true);
      u->full = u->shard.detach();
      u->gathered = true;
    } else {
      build_flat(*u, u->params, /*split=*/false);
    }
    parameters_.push_back(u->shard);
    parts_.push_back(u.get());
    if (u->split) {
      parameters_.push_back(u->split->shard);
      parts_.push_back(u->split.get());
    }
    units_.push_back(std::move(u));
  }
  for (size_t i = 0; i < units_.size(); ++i) {
    TORCH_CHECK(units_[i]->index == static_cast<int64_t>(i), "dist: model units are not numbered 0..n");
  }
}

void ParallelModel::Impl::gather(Unit& u) {
  if (u.gathered || u.gather_in_flight) return;
  realloc_storage(u.full, static_cast<size_t>(u.padded) * u.full.element_size());
  u.send = u.shard.detach().to(o_.param_dtype).contiguous();
  sync_point();
  u.gather_work = u.comm->all_gather(u.full, u.send);
  u.gather_in_flight = true;
}

void ParallelModel::Impl::wait_gathered(Unit& u) {
  if (u.gathered) return;
  gather(u);
  u.gather_work.wait();
  u.send = at::Tensor();
  u.gather_in_flight = false;
  u.gathered = true;
}

void ParallelModel::Impl::reshard(Unit& u) {
  if (!sharded() || !u.gathered || u.padded == 0) return;
  free_storage(u.full);
  u.gathered = false;
}

int ParallelModel::Impl::stage_of_unit(int64_t unit) const {
  for (size_t st = 0; st < stage_blocks_.size(); ++st) {
    if (unit >= stage_blocks_[st].first && unit <= stage_blocks_[st].second) return static_cast<int>(st);
  }
  return 0;  // the root
}

bool ParallelModel::Impl::runs_unit(int64_t unit) const {
  if (!pipelined()) return true;
  const PipelineStageOptions& pp = o_.pipeline;
  if (unit == 0) return pp.stage == 0 || pp.stage == pp.stages - 1;
  return unit >= pp.first_block && unit <= pp.last_block;
}

at::Tensor ParallelModel::Impl::run(int64_t unit_index, const UnitFn& fn, const at::Tensor& x) {
  if (pipelined()) {
    const PipelineStageOptions& pp = o_.pipeline;
    if (unit_index == 0) {
      const bool head_call = root_called_;
      if (!head_call && pp.stage > 0) {  // the embedding call: the previous stage's activation instead
        root_called_ = true;
        if (!stage_input_.defined()) {
          throw Error("dist", fmt::format("pipeline stage {}: a forward without the previous stage's activation "
                                          "(ParallelModel::set_stage_input)",
                                          pp.stage));
        }
        return std::move(stage_input_);  // (moved from: undefined until the next set_stage_input)
      }
      if (head_call && pp.stage < pp.stages - 1) {  // the head call: this stage's output goes to the next one
        root_called_ = false;
        return x;
      }
    } else if (!runs_unit(unit_index)) {
      return x;
    }
  }
  if (tp_state_ && unit_index >= 1) return run_sequence_parallel(unit_index, fn, x);
  return run_unit_call(unit_index, fn, x);
}

// Sequence parallelism applied from outside the model: the decoder layers (units 1..n) run on this rank's share of
// the positions where the sequence divides by the tensor-parallel degree. The sequence is cut before the first layer
// and joined after the last; each layer call (and its recomputation under activation checkpointing) runs with the
// styles told that its activations are shards.
at::Tensor ParallelModel::Impl::run_sequence_parallel(int64_t unit_index, const UnitFn& fn, const at::Tensor& x) {
  // This rank's blocks: all of them, or its pipeline stage's (whose input and output are whole sequences).
  const int64_t first = pipelined() ? o_.pipeline.first_block : 1;
  const int64_t last = pipelined() ? o_.pipeline.last_block : static_cast<int64_t>(units_.size()) - 1;
  at::Tensor in = x;
  if (unit_index == first) {
    const int64_t t = tp_state_->group->size();
    sequence_sharded_ = tp_state_->sequence_parallel && t > 1 && x.dim() >= 2 && x.size(1) % t == 0;
    if (sequence_sharded_) in = dist::sequence_scatter(x, tp_state_->group);
  }
  const std::shared_ptr<TensorParallelState> state = tp_state_;
  const bool sharded = sequence_sharded_;
  const UnitFn layer = [fn, state, sharded](const at::Tensor& h) {
    const ShardedFlag shards(*state, sharded);
    return fn(h);
  };
  at::Tensor out = run_unit_call(unit_index, layer, in);
  if (unit_index == last && sequence_sharded_) {
    out = dist::sequence_gather(out, tp_state_->group);
    sequence_sharded_ = false;
  }
  return out;
}

at::Tensor ParallelModel::Impl::run_unit_call(int64_t unit_index, const UnitFn& fn, const at::Tensor& x) {
  Unit& u = *units_.at(static_cast<size_t>(unit_index));
  const int64_t n_blocks = static_cast<int64_t>(units_.size()) - 1;
  // Which call this is: the root runs first (embedding) and last (head) in every forward.
  bool head_call = false;
  if (unit_index == 0) {
    head_call = root_called_;
    root_called_ = !root_called_;
  }
  const int64_t next_forward = head_call ? -1 : (unit_index < n_blocks ? unit_index + 1 : -1);
  each_part(u, [this](Unit& p) { wait_gathered(p); });
  if (o_.overlap && next_forward >= 0)
    each_part(*units_[static_cast<size_t>(next_forward)], [this](Unit& p) { gather(p); });

  if (!at::GradMode::is_enabled()) {
    at::Tensor out = fn(x);
    // Evaluation: nothing will come back for these parameters.
    if (unit_index != 0 || head_call) each_part(u, [this](Unit& p) { reshard(p); });
    return out;
  }
  auto rec = std::make_unique<CallRecord>();
  rec->engine = this;
  rec->unit = &u;
  rec->fn = fn;
  rec->recompute = o_.sharding.activation_checkpointing && unit_index != 0;
  rec->next_in_backward = head_call ? n_blocks : (unit_index > 1 ? unit_index - 1 : -1);
  if (head_call && n_blocks == 0) rec->next_in_backward = -1;
  rec->device = x.device().type();
  if (rec->device == at::kCPU || rec->device == at::kCUDA) {
    rec->autocast = at::autocast::is_autocast_enabled(rec->device);
    rec->autocast_dtype = at::autocast::get_autocast_dtype(rec->device);
  }
  if (rec->recompute) rec->rng_state = at::detail::getDefaultCPUGenerator().get_state();
  u.pending_calls++;
  CallRecord* raw = rec.get();
  records_.push_back(std::move(rec));
  at::Tensor out = UnitFunction::apply(x, u.shard, raw);
  // FULL_SHARD frees a block's parameters after its forward (the root stays until its backward).
  if (o_.sharding.strategy != ShardingStrategy::kShardGradOp && unit_index != 0) {
    each_part(u, [this](Unit& p) { reshard(p); });
  }
  return out;
}

at::Tensor ParallelModel::Impl::backward_call(CallRecord& rec, const at::Tensor& grad_out) {
  Unit& u = *rec.unit;
  each_part(u, [this](Unit& p) { wait_gathered(p); });
  if (o_.overlap && rec.next_in_backward >= 0) {
    each_part(*units_[static_cast<size_t>(rec.next_in_backward)], [this](Unit& p) { gather(p); });
  }
  at::AutoGradMode enable(true);
  if (rec.recompute) {
    // Activation checkpointing: run the forward again, with the same randomness and precision.
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    const at::Tensor now = gen.get_state();
    gen.set_state(rec.rng_state);
    const bool prev_enabled = at::autocast::is_autocast_enabled(rec.device);
    const at::ScalarType prev_dtype = at::autocast::get_autocast_dtype(rec.device);
    at::autocast::set_autocast_enabled(rec.device, rec.autocast);
    at::autocast::set_autocast_dtype(rec.device, rec.autocast_dtype);
    rec.x_leaf = rec.x_in;
    if (rec.x_requires_grad) rec.x_leaf.requires_grad_(true);
    rec.out = rec.fn(rec.x_leaf);
    at::autocast::set_autocast_enabled(rec.device, prev_enabled);
    at::autocast::set_autocast_dtype(rec.device, prev_dtype);
    at::autocast::clear_cache();
    gen.set_state(now);
  }
  std::vector<at::Tensor> inputs;
  if (rec.x_requires_grad) inputs.push_back(rec.x_leaf);
  std::vector<std::pair<Unit*, size_t>> which;  // (part, parameter) per gradient asked for
  each_part(u, [&](Unit& part) {
    for (size_t i = 0; i < part.params.size(); ++i) {
      if (part.params[i].requires_grad()) {
        inputs.push_back(part.params[i]);
        which.emplace_back(&part, i);
      }
    }
  });
  const at::Tensor g = grad_out.defined() ? grad_out : at::zeros_like(rec.out);
  // Nothing to differentiate when the input needs no gradient and every parameter of the unit is frozen (the root
  // under LoRA, called on token ids).
  const std::vector<at::Tensor> grads =
      inputs.empty() ? std::vector<at::Tensor>{}
                     : torch::autograd::grad({rec.out}, inputs, {g}, /*retain_graph=*/false, /*create_graph=*/false,
                                             /*allow_unused=*/true);
  rec.out = at::Tensor();
  rec.x_leaf = at::Tensor();
  rec.x_in = at::Tensor();
  {
    at::NoGradGuard no_grad;
    each_part(u, [this](Unit& part) {
      if (!part.grad_full.defined()) {
        // Filled range by range: a parameter's first gradient is copied in, later calls' (a tied weight) added; what
        // no call wrote is zeroed before the reduction. One pass over the gradients, not a memset and an add.
        part.grad_full = at::empty({part.padded}, part.shard.options().dtype(o_.reduce_dtype));
        part.grad_written.assign(part.params.size(), 0);
      }
    });
    const size_t first = rec.x_requires_grad ? 1 : 0;
    for (size_t k = 0; k < which.size(); ++k) {
      const at::Tensor& gp = grads[first + k];
      if (!gp.defined()) continue;
      Unit& part = *which[k].first;
      const size_t i = which[k].second;
      at::Tensor range = part.grad_full.narrow(0, part.offsets[i], part.params[i].numel());
      if (part.grad_written[i]) {
        range.add_(gp.reshape({-1}).to(o_.reduce_dtype));
      } else {
        range.copy_(gp.reshape({-1}));
        part.grad_written[i] = 1;
      }
    }
  }
  if (--u.pending_calls == 0) {
    each_part(u, [this](Unit& part) {
      reshard(part);
      launch_reduction(part);
    });
  }
  return rec.x_requires_grad ? grads[0] : at::Tensor();
}

void ParallelModel::Impl::launch_reduction(Unit& u) {
  at::NoGradGuard no_grad;
  if (u.padded == 0) {  // nothing trainable in this unit
    u.grad_full = at::Tensor();
    return;
  }
  // Pipeline schedules run several microbatches' backwards before finish_backward: one reduction per unit in flight.
  if (u.reduce_in_flight) complete_reduction(u);
  // Parameters no call gave a gradient (unused in this forward) and the padding reduce as zeros.
  for (size_t i = 0; i < u.params.size(); ++i) {
    if (!u.grad_written[i]) u.grad_full.narrow(0, u.offsets[i], u.params[i].numel()).zero_();
  }
  if (u.padded > u.numel) u.grad_full.narrow(0, u.numel, u.padded - u.numel).zero_();
  if (!sharded()) {
    if (u.local_acc.defined()) {
      u.local_acc.add_(u.grad_full);
    } else {
      u.local_acc = u.grad_full;
    }
    u.grad_full = at::Tensor();
    if (!sync_) return;
    sync_point();
    u.reduce_out = u.local_acc;
    u.local_acc = at::Tensor();
    u.reduce_work = comm_->all_reduce(u.reduce_out);
  } else {
    u.reduce_in = u.grad_full;
    u.grad_full = at::Tensor();
    u.reduce_out = at::empty({u.shard_numel}, u.reduce_in.options());
    sync_point();
    u.reduce_work = u.comm->reduce_scatter(u.reduce_out, u.reduce_in);
  }
  u.reduce_in_flight = true;
  if (!o_.overlap) {
    u.reduce_work.wait();
  }
}

void ParallelModel::Impl::finish_backward() {
  at::NoGradGuard no_grad;
  std::vector<Unit*> done;
  for (Unit* u : parts_) {
    if (!u->reduce_in_flight) continue;
    u->reduce_work.wait();
    u->reduce_in = at::Tensor();
    u->reduce_in_flight = false;
    done.push_back(u);
  }
  if (replica_comm_) {  // HYBRID_SHARD: sum each shard over the nodes
    sync_point();
    std::vector<Work> works;
    for (Unit* u : done) works.push_back(u->replica->all_reduce(u->reduce_out));
    for (Work& w : works) w.wait();
  }
  for (Unit* u : done) add_reduced(*u);
  for (auto& u : units_) {
    if (u->pending_calls != 0) {
      throw Error("dist", fmt::format("unit {}: {} forward call(s) had no backward before finish_backward", u->index,
                                      u->pending_calls));
    }
  }
  for (Unit* u : parts_) {
    reshard(*u);
    if (u->gather_in_flight) {  // a prefetch nobody used: complete it so that the buffers can be freed
      u->gather_work.wait();
      u->gather_in_flight = false;
      u->gathered = true;
      reshard(*u);
    }
  }
  records_.clear();
  root_called_ = false;
  if (pipelined() && sync_ && root_pair_) {
    // The root's gradient: the embedding's from the first stage, the final norm's and head's from the last (a tied
    // embedding gets both). The first stage steps the sum; the last drops its copy's (sync_stage_copies()). Both
    // parts: the dense one and the tensor-parallel slices (a vocabulary-parallel embedding and head).
    each_part(*units_[0], [&](Unit& root) {
      at::Tensor g = root.shard.grad().defined() ? root.shard.grad() : at::zeros_like(root.shard);
      root_pair_->all_reduce(g).wait();
      root.shard.mutable_grad() = o_.pipeline.stage == 0 ? g : at::Tensor();
    });
  }
}

void ParallelModel::Impl::add_reduced(Unit& u) {
  const double scale = u.grad_scale / comm_->size();
  at::Tensor g = u.reduce_out.to(at::kFloat);
  if (scale != 1.0) g.mul_(scale);
  u.reduce_out = at::Tensor();
  if (u.shard.grad().defined()) {
    u.shard.mutable_grad().add_(g);
  } else {
    u.shard.mutable_grad() = g;
  }
}

void ParallelModel::Impl::complete_reduction(Unit& u) {
  at::NoGradGuard no_grad;
  u.reduce_work.wait();
  u.reduce_in = at::Tensor();
  u.reduce_in_flight = false;
  if (replica_comm_) {
    sync_point();
    u.replica->all_reduce(u.reduce_out).wait();
  }
  add_reduced(u);
}

void ParallelModel::Impl::sync_point() {
  if (!o_.agree_on_oom) return;
  if (agree(false)) {
    throw PeerOutOfMemory("another rank ran out of memory; every rank abandons this microbatch");
  }
}

bool ParallelModel::Impl::agree(bool failed) {
  if (!oom_flag_.defined()) oom_flag_ = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(o_.device));
  oom_flag_.fill_(failed ? 1.0 : 0.0);
  comm_->all_reduce(oom_flag_, ReduceOp::kMax).wait();
  return oom_flag_.item<float>() > 0;
}

void ParallelModel::Impl::discard() {
  at::NoGradGuard no_grad;
  // Every rank issued the same collectives before the sync point where they agreed: complete them all.
  for (Unit* u : parts_) {
    if (u->gather_in_flight) {
      u->gather_work.wait();
      u->gather_in_flight = false;
      u->gathered = true;
    }
    u->send = at::Tensor();
    if (u->reduce_in_flight) {
      u->reduce_work.wait();
      u->reduce_in_flight = false;
    }
    u->reduce_in = at::Tensor();
    u->reduce_out = at::Tensor();
    u->grad_full = at::Tensor();
    u->local_acc = at::Tensor();
    u->pending_calls = 0;
    if (sharded() && u->padded > 0) {  // also a buffer allocated for a gather that a sync point then stopped
      free_storage(u->full);
      u->gathered = false;
    }
  }
  records_.clear();
  root_called_ = false;
  stage_input_ = at::Tensor();
  sync_ = true;
}

std::shared_ptr<ParallelModel> parallelize(models::CausalLM& model, const ParallelOptions& options,
                                           std::shared_ptr<Communicator> comm) {
  auto impl = std::make_shared<ParallelModel::Impl>(options, std::move(comm));
  impl->setup(model);
  model.set_unit_runner(impl);
  spdlog::info("dist: {} over {} ranks ({}), {} units, parameters in {}, gradients reduced in {}",
               to_string(options.sharding.strategy), impl->comm_->size(), impl->comm_->backend_name(),
               impl->units_.size(), c10::toString(options.param_dtype), c10::toString(options.reduce_dtype));
  return std::make_shared<ParallelModel>(impl);
}

}  // namespace tessera::dist
