// The sharding engine's internals (distributed/fsdp.h): its units, call records and implementation class, shared by
// fsdp.cpp (setup, gathers, forward and backward, reductions) and parallel_model.cpp (ParallelModel's views of the
// shards: state dicts, layouts, memory). Internal to the engine.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessera/distributed/communicator.h"
#include "tessera/distributed/fsdp.h"
#include "tessera/distributed/parallel_styles.h"
#include "tessera/models/causal_lm.h"

namespace tessera::dist {

using UnitFn = std::function<at::Tensor(const at::Tensor&)>;

inline bool shards_parameters(ShardingStrategy s) {
  return s != ShardingStrategy::kNoShard;
}

struct Unit {
  int64_t index = 0;
  std::vector<std::string> names;
  std::vector<at::Tensor> params;  // the module's parameter tensors (their TensorImpls are the module's)
  // Per parameter: the whole parameter's shape and where this rank's part of it starts (element offset): the part is
  // the whole parameter except for expert-parallel experts (this rank's rows of them) and tensor-parallel slices
  // (`tp`: how the parameter splits, laid out by tensor_parallel_spans).
  std::vector<std::vector<int64_t>> global_shapes;
  std::vector<int64_t> global_starts;
  std::vector<const dist::TensorParallelSplit*> tp;
  std::vector<int64_t> offsets;
  int64_t numel = 0, padded = 0, shard_numel = 0;
  at::Tensor shard;  // fp32 (shard_numel), requires grad: the optimizer's parameter
  at::Tensor full;   // param_dtype (padded): gathered parameters; storage freed while resharded
  at::Tensor send;   // the shard in param_dtype, alive until the gather completes
  bool gathered = false;
  bool gather_in_flight = false;
  Work gather_work;
  int64_t pending_calls = 0;       // forward calls whose backward has not run yet
  at::Tensor grad_full;            // reduce_dtype (padded): this microbatch's gradient, summed over calls
  std::vector<char> grad_written;  // per parameter: a call has written its range of grad_full
  at::Tensor local_acc;            // NO_SHARD: gradients of microbatches not yet synchronised
  at::Tensor reduce_in, reduce_out;
  bool reduce_in_flight = false;
  Work reduce_work;
  Communicator* comm = nullptr;     // the ranks that split this unit's flat vector (sharded strategies)
  Communicator* replica = nullptr;  // HYBRID_SHARD: the ranks that hold the same shard on the other nodes
  // The unit's parameters that only some ranks hold: its local experts (expert parallelism) or its tensor-parallel
  // slices, a flat vector of their own split over the ranks that hold the same ones (gathered, freed and reduced with
  // the unit).
  std::unique_ptr<Unit> split;
  // Ranks whose data one rank's gradient of this part stands for, over those of a dense parameter's: the reduction's
  // 1 / world size is multiplied by it. Tensor-parallel slices: the group's ranks all see one batch, so the sum over
  // the holders covers world / degree batches (degree); expert parts and dense parameters: 1.
  double grad_scale = 1.0;
};

// A unit and its split part, if any.
template <class F>
void each_part(Unit& u, F&& f) {
  f(u);
  if (u.split) f(*u.split);
}

struct CallRecord {
  class ParallelModel::Impl* engine = nullptr;
  Unit* unit = nullptr;
  UnitFn fn;
  bool recompute = false;  // activation checkpointing: forward kept no graph
  at::Tensor x_in;         // recompute: the unit's input
  at::Tensor x_leaf, out;  // the unit's private graph: x_leaf -> out
  bool x_requires_grad = false;
  int64_t next_in_backward = -1;  // the unit whose backward follows (for prefetch)
  at::Tensor rng_state;           // recompute: CPU generator state before the forward
  bool autocast = false;
  at::ScalarType autocast_dtype = at::kFloat;
  at::DeviceType device = at::kCPU;
};

class ParallelModel::Impl : public models::UnitRunner {
 public:
  Impl(const ParallelOptions& o, std::shared_ptr<Communicator> comm) : o_(o), comm_(std::move(comm)) {}

  at::Tensor run(int64_t unit_index, const UnitFn& fn, const at::Tensor& x) override;
  at::Tensor run_sequence_parallel(int64_t unit_index, const UnitFn& fn, const at::Tensor& x);
  at::Tensor run_unit_call(int64_t unit_index, const UnitFn& fn, const at::Tensor& x);
  at::Tensor backward_call(CallRecord& rec, const at::Tensor& grad_out);

  void setup(models::CausalLM& model);
  // Fills u's flat vector from `sources` (u.params' values, or for a split part this rank's rows or slices of them).
  void build_flat(Unit& u, const std::vector<at::Tensor>& sources, bool split);
  void gather(Unit& u);
  void wait_gathered(Unit& u);
  void reshard(Unit& u);
  void launch_reduction(Unit& u);
  // Waits for u's reduction in flight and adds its averaged result to u's shard gradient.
  void complete_reduction(Unit& u);
  // Adds u's reduced gradient (reduce_out), averaged, to its shard's .grad().
  void add_reduced(Unit& u);
  // Pipeline parallelism: whether this stage runs unit `unit` (the root: the first and last stage).
  bool runs_unit(int64_t unit) const;
  bool pipelined() const { return o_.pipeline.stages > 1; }
  void finish_backward();
  void sync_point();
  bool agree(bool failed);
  void discard();
  bool sharded() const { return shards_parameters(o_.sharding.strategy); }

  ParallelOptions o_;
  std::shared_ptr<Communicator> comm_;          // the whole job
  std::shared_ptr<Communicator> shard_comm_;    // ranks that split the parameters (HYBRID: this node)
  std::shared_ptr<Communicator> replica_comm_;  // HYBRID: the same shard on every node
  int ep_ = 1;                                  // expert-parallel degree
  std::shared_ptr<Communicator> ep_comm_;       // the expert-parallel group (consecutive ranks)
  // Experts held as modules of their own: each of their weights' names -> the rank of the expert-parallel group that
  // holds it whole; this rank leaves the others' out of its units (their model tensors stay as built, never used).
  std::map<std::string, int> expert_owner_;
  std::map<std::string, std::vector<int64_t>> remote_expert_shapes_;
  std::shared_ptr<Communicator> holders_comm_;  // the ranks that hold the same experts or slices (HYBRID: this node)
  int tp_ = 1;                                  // tensor-parallel degree
  std::shared_ptr<Communicator> tp_comm_;       // the tensor-parallel group (consecutive ranks)
  std::map<std::string, dist::TensorParallelSplit> tp_splits_;
  std::shared_ptr<TensorParallelState> tp_state_;      // what the model's tensor-parallel styles share (none: T = 1)
  bool sequence_sharded_ = false;                      // this forward's decoder layers run on sequence shards
  std::shared_ptr<models::ContextExchange> cp_group_;  // the context-parallel group's exchange (none: C = 1)
  // ParallelModel::parameter_shapes(), listed on first use (the parameters are fixed after setup).
  std::vector<std::pair<std::string, std::vector<int64_t>>> parameter_shapes_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::vector<Unit*> parts_;  // per parameters_[i]: the unit or split part whose shard it is
  std::vector<at::Tensor> parameters_;
  std::vector<std::pair<std::string, at::Tensor>> frozen_;  // whole on every rank, in the model's order
  std::vector<std::string> names_;                          // every parameter, in the model's order
  std::vector<std::unique_ptr<CallRecord>> records_;
  bool sync_ = true;
  bool root_called_ = false;                 // the root's first call of this forward (embedding) has run
  at::Tensor stage_input_;                   // pipeline: the next forward's input on a stage after the first
  std::shared_ptr<Communicator> root_pair_;  // pipeline: the first and the last stage, which both hold the root
  // pipeline: the shapes of the parameters of the blocks other stages run (left out of this rank's units)
  std::map<std::string, std::vector<int64_t>> other_stage_shapes_;
  std::map<std::string, int64_t> unit_of_name_;            // every parameter's unit
  std::vector<std::pair<int64_t, int64_t>> stage_blocks_;  // pipeline: every stage's blocks, in stage order
  // pipeline: the stage whose copy of unit `unit` counts (the root's: the first stage)
  int stage_of_unit(int64_t unit) const;
  at::Tensor oom_flag_;  // agree_on_oom: the sync points' one-element buffer, allocated once
};

}  // namespace tessera::dist
