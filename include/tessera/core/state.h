// Everything the training loop, algorithms and callbacks share: the model, optimizer, schedule, time, the current
// batch and its outputs, and the latest metrics. Composer's State, for causal language models.
#pragma once

#include <ATen/ATen.h>
#include <algorithm>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/config/time.h"
#include "tessera/core/callback.h"
#include "tessera/core/precision.h"
#include "tessera/data/loader.h"
#include "tessera/distributed/fsdp.h"
#include "tessera/models/causal_lm.h"
#include "tessera/optim/optimizer.h"
#include "tessera/optim/scheduler.h"

namespace tessera::dist {
class Communicator;
class ParallelModel;
}  // namespace tessera::dist

namespace tessera::core {

// One tensor this rank holds for the model and the parameter ranges in it: a flat shard of the sharding engine
// covering parts of several parameters (what the optimizer steps), or a frozen parameter that every rank holds whole
// (`replicated`: checkpoints take it from rank 0).
struct HeldTensor {
  at::Tensor tensor;
  std::vector<dist::ShardSpan> spans;
  bool replicated = false;
};

struct State {
  std::string run_name;
  std::string tokenizer_name;  // the recipe's tokenizer.name (a tokenizer.json, folder or hub id), empty without one
  int64_t seed = 17;           // rank-zero seed; rank r uses seed + r
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t local_rank = 0;
  int64_t local_world_size = 1;
  std::shared_ptr<dist::Communicator> comm;       // the job's ranks (a world of one: local copies)
  std::shared_ptr<dist::ParallelModel> parallel;  // the sharding engine (any world size), from after INIT
  at::Device device = at::kCPU;
  Precision precision = Precision::kFp32;

  std::shared_ptr<models::CausalLM> model;      // any model family (the model protocol); surgery may replace it at INIT
  std::unique_ptr<optim::Optimizer> optimizer;  // created after INIT, so that surgery (LoRA, ...) is seen
  std::shared_ptr<const optim::Scheduler> scheduler;  // built once from the recipe's `scheduler`
  double scale_schedule_ratio = 1.0;

  config::Timestamp timestamp;
  config::Timestamp previous_timestamp;  // before the latest batch (interval triggers compare the two)
  config::Timestamp eval_timestamp;
  config::Time max_duration;
  std::optional<int64_t> dataloader_len;  // this rank's batches per epoch

  int64_t device_train_batch_size = 0;       // samples per rank per optimizer step
  int64_t device_train_microbatch_size = 0;  // samples per forward/backward
  int64_t max_seq_len = 0;

  // The whole device batch at AFTER_DATALOADER; the current microbatch from BEFORE_FORWARD to AFTER_BACKWARD (and
  // during eval, the eval batch).
  data::TokenBatch batch;
  at::Tensor outputs;     // logits of the latest forward
  at::Tensor loss;        // loss of the latest microbatch, as backpropagated (scaled by its share of the batch)
  double train_loss = 0;  // loss of the latest optimizer step (mean over the device batch)
  std::map<std::string, Metrics> eval_metrics;  // label -> latest values (LanguageCrossEntropy, LanguagePerplexity)

  std::vector<std::shared_ptr<Algorithm>> algorithms;
  std::vector<std::shared_ptr<Callback>> callbacks;  // loggers included (LoggerDestination)

  // The learning rate of the next optimizer step: the schedule at previous_timestamp (Composer's LambdaLR order).
  double current_lr() const;
  // timestamp >= max_duration, in max_duration's unit.
  bool reached_max_duration() const { return !timestamp.before(max_duration); }
  // Why training ends before max_duration; the most severe reason given so far holds:
  //   kRequested  an algorithm or callback asked (Composer's stop_training: early stopping, loss spikes);
  //   kPreempted  the ranks agreed to stop for a preemption signal (util/preemption.h): `train` exits kExitPreempted;
  //   kUnhealthy  the health monitor's `response: stop` (callbacks/health_monitor.h): exits kExitUnhealthy, which the
  //               supervisor restarts;
  //   kNodeBad    its `response: exclude_node`, on the ranks of a node a finding names: exits kExitNodeBad, and an
  //               elastic job's launcher excludes the node.
  // From kPreempted on the run stops to resume later (preempted()): the checkpoint saver saves at this batch, and
  // what FIT_END does only at the real end of training (exports, adapters) is skipped.
  enum class StopReason { kNone, kRequested, kPreempted, kUnhealthy, kNodeBad };
  StopReason stop_reason = StopReason::kNone;
  // Ends training after the current batch (Composer's stop_training).
  void stop_training(StopReason why = StopReason::kRequested) { stop_reason = std::max(stop_reason, why); }
  bool stop_requested() const { return stop_reason != StopReason::kNone; }
  bool preempted() const { return stop_reason >= StopReason::kPreempted; }
  // Set by an algorithm at AFTER_TRAIN_BATCH: this batch's optimizer step is skipped (reset every batch).
  bool skip_optimizer_step = false;
  // Set by an algorithm or callback: restore the model and optimizer from the newest checkpoint after this batch.
  bool rollback_requested = false;
  // The tensors this rank holds for the model: the sharding engine's flat shards (parameters()), then the frozen
  // parameters whole. Checkpoints store and restore these. The helpers below need `parallel` (after INIT).
  std::vector<at::Tensor> held_parameters() const;
  // The same tensors with the parameter ranges each holds: what checkpoints, the optimizer monitor and per-parameter
  // algorithms (adaptive clipping) read to see whole parameters through shards.
  std::vector<HeldTensor> held_layout() const;
  // What receives gradients and the optimizer steps: this rank's flat shards.
  std::vector<at::Tensor> trainable_parameters() const;
  // Sum of `t` over the ranks that together hold every gradient shard once (e.g. squared norms for clipping);
  // `t` itself with unsharded gradients (one rank, NO_SHARD).
  at::Tensor sum_over_shards(const at::Tensor& t) const;
};

}  // namespace tessera::core
