// The sharding engine: data parallelism with NO_SHARD (DDP), SHARD_GRAD_OP (ZeRO-2), FULL_SHARD (ZeRO-3) and
// HYBRID_SHARD, applied to a model from outside.
//
// parallelize(model, ...) flattens the parameters of each unit (the model protocol's units, models/causal_lm.h: for
// MPT the root -- embeddings, final norm and head -- and each block) into one fp32 vector padded to a multiple of the
// shard-group size, keeps this rank's slice of it as the tensor the optimizer steps, and installs itself as the model's
// UnitRunner. Each unit call then runs as one autograd node:
//   forward:  wait for (or issue) the all-gather of the unit's parameters in `param_dtype`, issue the next unit's
//             gather (prefetch), run the unit, and free the gathered parameters (FULL_SHARD; the root stays gathered
//             until its backward, as FSDP's root does);
//   backward: gather again if freed, prefetch the previous unit, compute the unit's gradients (re-running its forward
//             first under activation checkpointing), then reduce them asynchronously in `reduce_dtype`:
//             reduce-scatter into the fp32 gradient shard (sharded strategies) or all-reduce (NO_SHARD), so that
//             communication overlaps the rest of backward. HYBRID_SHARD reduce-scatters within the node and then
//             all-reduces the shard across nodes.
// finish_backward() waits for the reductions and leaves the averaged gradient (sum over ranks / world size) in
// parameters()[i].grad(). Gradients of a global-mean loss therefore equal a single process's over the global batch.
//
// Without a gradient (no_grad, e.g. evaluation or generation) units gather, run and free without autograd. All ranks
// must run the same sequence of forward and backward passes. Not thread-safe.
//
// Frozen parameters (requires_grad false when parallelize runs, e.g. the base weights under LoRA) are not flattened:
// every rank keeps them whole, as the model's own tensors, and nothing steps or reduces them (frozen_parameters()).
//
// Expert parallelism: when the model's MoE layers (models/moe.h) have moe_world_size P > 1, ranks form groups of P
// consecutive ranks, and each rank keeps only its rows of every expert weight (experts [i * E / P, (i + 1) * E / P)
// for the group's i-th rank); the layers exchange tokens over the group (all-to-all). A unit's expert weights are a
// second flat vector, split over the ranks that hold the same experts (world / P of them; under HYBRID_SHARD those on
// the node, replicated across nodes), gathered, freed and reduced with the unit. Their gradient on a rank already sums
// the whole group's tokens (the exchange's backward brings them back), so the reduction over the ranks holding the
// same experts and the division by the world size give the same average as for dense parameters. Shard layouts and
// full_state_dict name experts by their global rows, so checkpoints resume under any other degree or world size.
// NO_SHARD with expert parallelism is refused, as is a HYBRID_SHARD node that does not hold whole groups. Under
// agree_on_oom each token exchange is preceded by a sync point too.
//
// Tensor parallelism (options.sharding.tensor_parallel_degree T > 1; models/parallel_plan.h): groups of T
// consecutive ranks split the layers the model's plan declares (models::TensorParallelModel), run by the styles the
// engine installs on them (distributed/parallel_styles.h); each rank keeps its slice
// of those weights as its unit's second flat vector (as for experts), split over the world / T ranks that hold the same
// slices, and the model runs on its slices over the group. The group's ranks see one batch, so a slice's gradient,
// reduced over its holders, is averaged over world / T; the dense parameters, computed alike on the group's ranks,
// over the world as before. Shard layouts name a column-parallel slice by its rows and a row-parallel one by a column
// window of the whole weight (ShardSpan::cols), so checkpoints resume under any other mesh.
//
// Context parallelism (options.sharding.context_parallel_degree C > 1; models/context_parallel.h): groups of C ranks,
// T apart, read the same samples and run on shares of the positions. Parameters and their shards are as without it:
// the trainer scales each rank's loss by C, so that the average over the world sums the group's shares.
//
// A world of one is the same engine over the local communicator, whose collectives are no-ops; the trainer gives it
// DDP's options there (sharding_for_world), so the flat vectors are the parameters themselves and nothing is copied.
//
// Out-of-memory agreement (`agree_on_oom`, for device_train_microbatch_size: auto): when one rank runs out of
// memory in the middle of a forward or backward, the others are already heading for its next collective, which it
// will never issue. So every collective a forward or backward issues is preceded by a sync point: a one-element
// all-reduce (MAX) over the whole job, issued after the collective's buffers are allocated. Ranks that are fine
// send 0 there. A rank that caught an out-of-memory error calls agree_on_oom(true), which sends 1 in the place of
// its next sync point; the others see it at that same sync point and throw PeerOutOfMemory. Ranks that finished
// their microbatches call agree_on_oom(false) once more, so that an error after the last collective is agreed on
// too. Every rank then calls discard_microbatches() and all of them retry the batch together.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessera/distributed/communicator.h"
#include "tessera/distributed/parallel_ops.h"
#include "tessera/distributed/sharding.h"
#include "tessera/models/causal_lm.h"
#include "tessera/util/error.h"

namespace tessera::dist {

// Pipeline parallelism (distributed/pipeline.h): the stage this rank runs. parallelize() is then given the stage's
// ranks as its communicator, so that every strategy above shards within the stage. The engine runs the stage's
// decoder blocks and leaves the others unmaterialised (their model tensors become `meta`): a skipped block's call
// returns its input. The root (embeddings, final norm, head: unit 0) is held by the first stage, which runs the
// embedding call, and by the last, which runs the head call; on the other stages the embedding call returns the
// tensor given to ParallelModel::set_stage_input (received from the previous stage) and the head call its input
// (what goes to the next stage). The root's gradients are summed over the first and last stage (a tied embedding
// gets both contributions); the first stage's copy is the one stepped and stored, and sync_stage_copies() hands it to
// the last stage.
struct PipelineStageOptions {
  int stage = 0;
  int stages = 1;
  int64_t first_block = 1;  // the stage's decoder blocks, units [first_block, last_block]
  int64_t last_block = 0;
  std::shared_ptr<Communicator> group;  // this rank's pipeline group: one rank per stage, in stage order
};

struct ParallelOptions {
  ShardingOptions sharding;                  // strategy, activation checkpointing, sync_module_states
  at::ScalarType param_dtype = at::kFloat;   // dtype of gathered parameters (the compute copy)
  at::ScalarType reduce_dtype = at::kFloat;  // dtype gradients are reduced in
  bool overlap = true;                       // prefetch gathers and reduce asynchronously; false: one at a time
  int ranks_per_node = 1;                    // HYBRID_SHARD: shard within groups of this many consecutive ranks
  at::Device device = at::kCPU;              // where parameters live (a model built on `meta` is materialised here)
  uint64_t init_seed = 17;                   // initialisation seed for a model built on `meta`
  bool agree_on_oom = false;                 // sync points before each collective (see above)
  PipelineStageOptions pipeline;             // pipeline parallelism: this rank's stage (above)
};

// Thrown at a sync point when another rank ran out of memory (under ParallelOptions::agree_on_oom).
class PeerOutOfMemory : public Error {
 public:
  explicit PeerOutOfMemory(const std::string& message) : Error("dist", message) {}
};

// Composer's fsdp_config.mixed_precision under a training precision whose autocast dtype is `low` (kFloat for fp32):
// FULL: fp32 parameters and reduction; DEFAULT: parameters in `low`, reduction in fp32; PURE: both in `low`.
std::pair<at::ScalarType, at::ScalarType> mixed_precision_dtypes(MixedPrecision mp, at::ScalarType low);

// Where one model parameter's elements sit in a rank's flat shard: elements [start, start + numel) of parameter
// `name` (global `shape`, row-major) are shard elements [offset, offset + numel). With a column window (cols > 0, a
// tensor-parallel row-parallel weight, 2-D), the elements are those of the sub-matrix name[:, col_start : col_start +
// cols], counted row-major in it.
struct ShardSpan {
  std::string name;
  std::vector<int64_t> shape;
  int64_t start = 0;
  int64_t numel = 0;
  int64_t offset = 0;
  int64_t col_start = 0;
  int64_t cols = 0;
};

// Bytes this rank holds between steps for parameters and gradients (optimizer state is the optimizer's).
struct ShardMemory {
  int64_t param_bytes = 0;
  int64_t grad_bytes = 0;
};

class ParallelModel {
 public:
  class Impl;
  explicit ParallelModel(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

  // What the optimizer steps: one fp32 tensor per unit, this rank's shard (NO_SHARD: the whole flat vector); under
  // expert parallelism a unit with experts has a second one, its experts' shard, right after it.
  const std::vector<at::Tensor>& parameters() const;
  // The frozen parameters, whole on every rank, by name in the model's order.
  const std::vector<std::pair<std::string, at::Tensor>>& frozen_parameters() const;
  // Before a microbatch's backward: `sync` false accumulates gradients locally without communicating (NO_SHARD's
  // no_sync for all but the last microbatch; sharded strategies reduce every microbatch).
  void prepare_backward(bool sync);
  // After backward: waits for the reductions and adds the averaged gradients to parameters()' .grad().
  void finish_backward();
  // One agreement round over the whole job: `this_rank_failed` is whether this rank caught an out-of-memory error
  // since its last sync point; returns whether any rank did. Every rank must call it at the same point (see above).
  bool agree_on_oom(bool this_rank_failed);
  // After an agreed failure: waits for the collectives in flight, frees gathered parameters and drops the partial
  // gradients and forward records, so that the batch can run again (the parameters' .grad() are the caller's).
  void discard_microbatches();
  // Sum of `t` over the ranks that together hold one copy of every shard (identity for NO_SHARD), e.g. for the
  // global gradient norm.
  at::Tensor sum_over_shards(const at::Tensor& t);
  // The whole model (frozen parameters included) as fp32 tensors named and ordered like model->named_parameters();
  // every rank must call it.
  std::vector<std::pair<std::string, at::Tensor>> full_state_dict();
  // Per parameters()[i], the parameter ranges it holds (padding excluded): what a sharded checkpoint stores and
  // what loading one fills.
  std::vector<std::vector<ShardSpan>> shard_layout() const;
  // Whether this rank's shards are the copy checkpoints store: every rank for the sharded strategies, rank 0 for
  // NO_SHARD (all ranks hold everything), the first node's ranks for HYBRID_SHARD.
  bool stores_shards() const;
  ShardMemory memory() const;
  Communicator& comm();
  const ParallelOptions& options() const;
  // Every parameter's name and whole shape, in the model's order (the model's own tensors may hold only this rank's
  // part of one: expert-parallel experts, tensor-parallel slices).
  const std::vector<std::pair<std::string, std::vector<int64_t>>>& parameter_shapes() const;
  // This rank's context-parallel group (options.sharding.context_parallel_degree C > 1; models/context_parallel.h):
  // the exchange a forward on context shards takes the whole sequence's keys and values from. None for C = 1.
  std::shared_ptr<models::ContextExchange> context_exchange() const;
  // The tensor-parallel group the model's head splits the vocabulary over (its plan splits the head), or none. A
  // training forward run inside a LocalLogits scope then returns this rank's share of the logits (B, S, V / T), for
  // dist::vocab_parallel_cross_entropy(); any other forward gathers them.
  std::shared_ptr<dist::TensorParallelGroup> vocab_parallel_group() const;
  class LocalLogits {
   public:
    LocalLogits(const ParallelModel& model, bool on);
    ~LocalLogits();
    LocalLogits(const LocalLogits&) = delete;
    LocalLogits& operator=(const LocalLogits&) = delete;

   private:
    const ParallelModel& model_;
    bool before_ = false;
  };
  // Pipeline parallelism: the input of the next forward's first block on a stage after the first (an activation
  // received from the previous stage, requiring grad when its gradient is to go back).
  void set_stage_input(at::Tensor x);
  // Pipeline parallelism: the last stage takes the first stage's root (the copy the optimizer stepped and
  // checkpoints hold). Every rank calls it at the same point, before a step's first forward; a no-op otherwise.
  void sync_stage_copies();
  // Units and their parameter counts (unpadded), for logs and benchmarks.
  std::vector<int64_t> unit_sizes() const;

 private:
  std::shared_ptr<Impl> impl_;
};

// Shards `model` over `comm` (every rank calls it with an identically initialised model, or with sync_module_states
// rank 0's weights are broadcast first). A model built on `meta` is materialised one unit at a time: the unit is
// allocated on options.device, initialised (the model's init_weights with init_seed, that unit's modules only:
// the same values as a whole-model init), sharded and freed, so no rank ever holds more than one unit's full
// parameters. The model keeps working through its UnitRunner; its own parameter tensors become views of gathered
// buffers, valid only while a unit runs.
// `comm`'s collectives as the engine's styles and losses use them (parallel_ops.h), for research code that runs them
// outside the trainer.
std::shared_ptr<dist::TensorParallelGroup> group_collectives(std::shared_ptr<Communicator> comm);
// `comm`'s context-parallel exchange (models::ContextExchange), for research code that runs a model on context shards
// (models::make_context_shard) outside the trainer.
std::shared_ptr<models::ContextExchange> context_exchange(std::shared_ptr<Communicator> comm);

std::shared_ptr<ParallelModel> parallelize(models::CausalLM& model, const ParallelOptions& options,
                                           std::shared_ptr<Communicator> comm);

}  // namespace tessera::dist
