// The trainer: builds the model, data, optimizer, algorithms, callbacks and loggers of a recipe and runs Composer's
// training loop over them (see event.h for the loop and engine.h for the dispatch order).
//
//   TrainConfig cfg = load_train_config("recipes/mpt-tiny-cpu.yaml");
//   Trainer trainer(cfg, {.callbacks = {std::make_shared<MyCallback>()}});
//   trainer.fit();
//   core::Metrics m = trainer.eval();  // {"LanguageCrossEntropy": ..., "LanguagePerplexity": ...}
//
// Batches: global_train_batch_size is split over ranks (device batch), and each device batch into microbatches of
// device_train_microbatch_size samples; each microbatch loss is scaled by its share of the device batch, so the
// accumulated gradient equals that of one big batch. `auto` starts from the whole device batch and, when a batch
// runs out of memory (util::is_out_of_memory) on any rank, halves the microbatch on every rank and retries the batch;
// the ranks agree through the sharding engine's sync points (dist::ParallelOptions::agree_on_oom). On CPU, Linux
// overcommits memory and its OOM killer ends the process instead of failing an allocation, so there `auto` keeps
// the whole device batch unless the process has an address-space limit (ulimit -v).
// Precision: fp32, amp_bf16 (autocast of forward and loss to bf16, fp32 weights, gradients and optimizer state; on
// CPU and GPU) and amp_fp16 (GPU only, with dynamic loss scaling).
// The learning rate of step b is the schedule evaluated at step b - 1 (step 0: at 0), as Composer's LambdaLR order
// gives; it is a pure function of the timestamp.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/callbacks/checkpoint_saver.h"
#include "tessera/core/callback.h"
#include "tessera/core/engine.h"
#include "tessera/core/state.h"
#include "tessera/data/data_loader.h"
#include "tessera/data/tokenizer.h"
#include "tessera/distributed/communicator.h"
#include "tessera/eval/gauntlet.h"
#include "tessera/eval/icl.h"
#include "tessera/models/context_parallel.h"
#include "tessera/models/loss.h"
#include "tessera/models/metric.h"
#include "tessera/trainer/microbatching.h"
#include "tessera/trainer/precision_context.h"
#include "tessera/trainer/train_config.h"

namespace tessera::util {
class PreemptionHandler;
}

namespace tessera::trainer::detail {
class StepGraph;
}

namespace tessera::trainer {

// Components added by code, after the recipe's own (research code's custom algorithms and callbacks).
struct TrainerParts {
  std::vector<std::shared_ptr<core::Algorithm>> algorithms;
  std::vector<std::shared_ptr<core::Callback>> callbacks;  // LoggerDestinations included
  // The training loss, in place of the recipe's `loss:` and the model's own (CausalLM::loss); null: those.
  std::shared_ptr<const models::Loss> loss = nullptr;
  // Evaluation metrics beside the recipe's `metrics:` and the model's own (CausalLM::eval_metrics).
  std::vector<std::shared_ptr<const models::EvalMetric>> metrics = {};
};

class Trainer {
 public:
  explicit Trainer(TrainConfig config, TrainerParts parts = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains until max_duration (or stop_training()), evaluating on eval_interval. With save_folder and
  // preemption_signals, one of those signals (received by any rank, from construction on) makes every rank finish its
  // batch, save a checkpoint and return from fit() with stop_reason() kPreempted.
  void fit();
  // Why fit() stopped before max_duration (core::State::StopReason; kNone when it ran to the end). From kPreempted on,
  // after saving its checkpoint: a preemption signal, or the health monitor's `response: stop` or `exclude_node`.
  core::State::StopReason stop_reason() const { return state_.stop_reason; }
  // Evaluates the eval loader and the ICL tasks now (EVAL_STANDALONE_START/_END around the eval events); returns the
  // eval loader's metrics (empty without one). ICL accuracies go to state().eval_metrics["{label}/{k}-shot"].
  core::Metrics eval();

  core::State& state() { return state_; }
  // amp_fp16's current loss scale (65536 at first; halved by each overflow); 1 for every other precision.
  double loss_scale() const { return loss_scaler_.enabled() ? loss_scaler_.loss_scale() : 1.0; }
  const TrainConfig& config() const { return cfg_; }
  // Training steps that ran as a replay of the captured CUDA graph (`cuda_graphs: true`, docs/gpu.md#cuda-graphs).
  int64_t cuda_graph_replays() const;

 private:
  // The constructor's build steps, in order.
  void setup_ranks();  // device, precision, schedule, rendezvous, communicator
  void build_data();   // train and eval datasets
  void build_icl_tasks();
  void build_model();
  void build_components(TrainerParts parts);  // loggers, callbacks, the checkpoint saver, algorithms
  void setup_microbatching();
  void shard_model();  // the sharding engine, with more than one rank
  void load_initial_checkpoint();
  // What the run has written, for the console's summary: the newest checkpoint, HF export and metrics file.
  std::vector<std::string> written_outputs() const;
  nlohmann::json resumption_state() const;  // saved with checkpoints: recipe, data position, loss scale, ...
  void rollback();                          // restores model and optimizer from the newest checkpoint
  void setup_cuda_graphs();  // `cuda_graphs: true`: refuses what a replayed step cannot do, before training starts
  void train_batch();
  // The batch's forward, loss and backward, a microbatch at a time, with the step's summed loss left on the device in
  // step_total_. `token_scale`: the device scalar each microbatch's summed loss is multiplied by (a CUDA graph's
  // static input); null: token_scale() as a number. False when out of memory with `auto` (the batch is retried).
  bool run_microbatches(const data::TokenBatch& batch, int64_t microbatch_size,
                        const at::Tensor* token_scale = nullptr);
  // Pipeline parallelism (parallelism.pipeline_parallel_degree > 1): the batch's microbatches through this rank's
  // stage in the schedule's order (trainer_pipeline.cpp), activations and their gradients sent to the neighbouring
  // stages; the last stage's summed loss left in step_total_ (zero on the others).
  void run_pipeline(const data::TokenBatch& batch);
  // The forward options of microbatch `whole` (state_.batch): under context parallelism cut to this rank's shard of
  // the positions (`shard` caches the cut per sequence length), state_.batch then holding what the loss sees.
  models::ForwardOptions microbatch_options(const data::TokenBatch& whole,
                                            const std::shared_ptr<models::ContextExchange>& context,
                                            std::shared_ptr<const models::ContextShard>& shard);
  // A microbatch's summed loss `sum` (rows [start, end) of a device batch of `n` samples) scaled as the step's loss
  // wants it: by token_scale (accumulate_train_batch_on_tokens), else as its mean by its share of the samples.
  at::Tensor scaled_loss(const at::Tensor& sum, const data::TokenBatch& microbatch, int64_t rows, int64_t n,
                         const at::Tensor* token_scale, double scale, double context_scale) const;
  // A batch through the captured step: captured first when `capture`. False when the capture failed (the batch then
  // runs eagerly, as every later one).
  bool run_graphed_microbatches(const data::TokenBatch& batch, bool capture);
  // Drops what a step that did not finish left behind (outputs, losses, MoE statistics, gradients), before it runs
  // again: an out-of-memory retry, a capture or a failed capture.
  void clear_step_results();
  // accumulate_train_batch_on_tokens' factor: the context-parallel group's size over this rank's mean loss tokens.
  double token_scale() const;
  // The training loss of state_.outputs on state_.batch, summed over its loss tokens (models/loss.h).
  at::Tensor loss_sum() const;
  core::Metrics run_eval();
  core::Metrics run_loader_eval();
  bool eval_due_at_batch_end() const;
  bool eval_due_at_epoch_end() const;
  bool has_eval() const { return eval_loader_ != nullptr || !icl_tasks_.empty(); }
  bool has_eval_loader() const { return eval_loader_ != nullptr; }
  // This rank's batches of the train loader from the current timestamp on, and of the eval loader from its start.
  std::unique_ptr<data::BatchIterator> open_train_epoch();
  std::unique_ptr<data::BatchIterator> open_eval();
  // tokenizer.name, resolved (a file, folder or cached hub id) and loaded on the first call (the loaders and the ICL
  // tasks share it); a ConfigError names `needed_by`.
  const data::Tokenizer& tokenizer(const std::string& needed_by);
  void run_icl_eval();

  TrainConfig cfg_;
  core::State state_;
  core::Logger logger_;
  std::unique_ptr<core::Engine> engine_;
  std::unique_ptr<data::DataLoader> train_loader_;  // built by data::loader_registry() from the recipe's sections
  std::unique_ptr<data::DataLoader> eval_loader_;   // null without an eval_loader
  std::vector<eval::IclTaskConfig> icl_tasks_;      // `icl_tasks`, evaluated with the eval loader
  std::optional<data::Tokenizer> tokenizer_;        // tokenizer.name, loaded when a loader or ICL task needs it
  std::optional<eval::GauntletConfig> gauntlet_;    // `eval_gauntlet`, scored over the ICL results
  dist::Rendezvous rendezvous_;
  double loss_tokens_ = 0;  // loss-generating tokens of the current batch, summed over ranks
  // Mixtures of experts: the batch's auxiliary losses (each microbatch's by its share) and the tokens each router
  // sent to each expert (summed over microbatches), logged after the batch; the routers and experts already warned
  // about as starved.
  std::map<std::string, at::Tensor> aux_losses_;  // (1) double, on the device until logged
  std::vector<std::pair<std::string, at::Tensor>> expert_counts_;
  std::set<std::string> starved_warned_;
  void log_mixture_of_experts(core::Metrics& metrics);
  std::optional<int64_t> last_eval_batch_;
  OutOfMemoryRetry oom_retry_{false};                  // device_train_microbatch_size: auto
  LossScaler loss_scaler_{false};                      // amp_fp16
  std::shared_ptr<callbacks::CheckpointSaver> saver_;  // when the recipe has save_folder
  std::optional<std::string> last_checkpoint_;
  std::unique_ptr<util::PreemptionHandler> preemption_;  // with save_folder and preemption_signals
  std::shared_ptr<const models::Loss> loss_;             // TrainerParts::loss or `loss:`; null: the model's own
  std::vector<std::shared_ptr<const models::EvalMetric>> metrics_;  // TrainerParts::metrics and `metrics:`
  at::Tensor step_total_;                     // (1) double: the step's loss summed over microbatches, on the device
  std::unique_ptr<detail::StepGraph> graph_;  // `cuda_graphs: true`
};

}  // namespace tessera::trainer
