// The Trainer's training step (Composer's _train_batch): the microbatches' forward, loss and backward, eagerly or as a
// replay of the step's CUDA graph (`cuda_graphs`), then the optimizer step; and a mixture of experts' statistics.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "tessera/models/capabilities.h"
#include "tessera/models/context_parallel.h"
#include "tessera/models/loss.h"
#include "tessera/trainer/precision_context.h"
#include "tessera/trainer/step_graph.h"
#include "tessera/trainer/trainer.h"
#include "tessera/trainer/trainer_support.h"
#include "tessera/util/error.h"

namespace tessera::trainer {

using core::Event;
using core::Metrics;
using core::Precision;
using detail::forward_options;
using detail::slice;
using detail::sum_over_ranks;

void Trainer::setup_cuda_graphs() {
  if (!cfg_.cuda_graphs) return;
  std::vector<std::string> why;
  if (const std::string device = detail::cuda_graphs_unsupported(state_.device); !device.empty()) why.push_back(device);
  if (state_.world_size > 1) {
    why.push_back(fmt::format("{} ranks: collectives are not captured yet (one rank only)", state_.world_size));
  }
  if (state_.precision == Precision::kAmpFp16) {
    why.push_back("precision: amp_fp16 (its loss scale is decided on the host every step)");
  }
  if (oom_retry_.enabled()) {
    why.push_back("device_train_microbatch_size: auto (a replay cannot stop at an out-of-memory error and retry)");
  }
  // Events inside the microbatches run while the step is captured, not on its replays.
  for (const auto& a : state_.algorithms) {
    for (const Event e : {Event::kBeforeForward, Event::kAfterForward, Event::kBeforeLoss, Event::kAfterLoss,
                          Event::kBeforeBackward, Event::kAfterBackward}) {
      if (a->match(e, state_)) {
        why.push_back(fmt::format("algorithm {} acts at {}, inside the step, which a replay does not run", a->name(),
                                  core::to_string(e)));
        break;
      }
    }
  }
  if (!why.empty()) {
    throw ConfigError("recipe", fmt::format("{}: cuda_graphs: true: {}; set cuda_graphs: false", cfg_.recipe_path,
                                            fmt::join(why, "; ")));
  }
  // Two steps of one shape before its capture: cuBLAS and the autograd engine set up outside any capture.
  graph_ = std::make_unique<detail::StepGraph>(state_.device, /*warmup_steps=*/2);
  if (state_.rank == 0) spdlog::info("cuda_graphs: the training step is captured after 2 steps of one shape");
}

int64_t Trainer::cuda_graph_replays() const {
  return graph_ ? graph_->replays() : 0;
}

double Trainer::token_scale() const {
  // accumulate_train_batch_on_tokens (LLM Foundry's default): each microbatch's summed loss over the mean number of
  // loss tokens per rank, so the step's gradient is the mean over every loss token of every rank however the batch
  // is split. Context parallelism: the model runs on this rank's share of each sequence and the loss covers those
  // positions; scaled by the group's size, the engine's average over every rank sums the group's shares.
  const double per_rank_tokens = std::max(1.0, loss_tokens_ / static_cast<double>(state_.world_size));
  const std::shared_ptr<models::ContextExchange> context = state_.parallel->context_exchange();
  return (context ? static_cast<double>(context->size()) : 1.0) / per_rank_tokens;
}

bool Trainer::run_microbatches(const data::TokenBatch& batch, int64_t microbatch_size, const at::Tensor* token_scale) {
  const int64_t n = batch.input_ids.size(0);
  // Without accumulate_train_batch_on_tokens, each microbatch's mean loss counts by its share of the samples.
  const double scale = this->token_scale();
  const at::DeviceType dev = state_.device.type();
  const std::shared_ptr<models::ContextExchange> context = state_.parallel->context_exchange();
  const double context_scale = context ? static_cast<double>(context->size()) : 1.0;
  std::shared_ptr<const models::ContextShard> shard;  // the microbatches' cut, made once per sequence length
  // Vocabulary parallelism: the model's head returns this rank's share of the vocabulary's logits and the built-in
  // cross-entropy reduces over the group instead of gathering them (a registered loss gets whole logits).
  const std::shared_ptr<dist::TensorParallelGroup> vocab = state_.parallel->vocab_parallel_group();
  const auto* cross_entropy = dynamic_cast<const models::CrossEntropyLoss*>(loss_.get());
  const bool vocab_parallel = vocab && cfg_.fsdp.loss_parallel && (!loss_ || cross_entropy);
  const models::CrossEntropyOptions ce = cross_entropy ? cross_entropy->options() : models::CrossEntropyOptions{};
  // The step's loss, accumulated on the device: read once per step, after the last microbatch (no host sync per
  // microbatch).
  at::Tensor total = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(state_.device));
  aux_losses_.clear();
  expert_counts_.clear();
  try {
    for (int64_t start = 0; start < n; start += microbatch_size) {
      const int64_t end = std::min(n, start + microbatch_size);
      state_.parallel->prepare_backward(/*sync=*/end == n);
      state_.batch = slice(batch, start, end);
      engine_->run_event(Event::kBeforeForward);
      const data::TokenBatch whole = state_.batch;
      const models::ForwardOptions fo = microbatch_options(whole, context, shard);
      {
        AutocastGuard autocast(state_.precision, dev);
        const dist::ParallelModel::LocalLogits local_logits(*state_.parallel, vocab_parallel);
        state_.outputs = state_.model->forward(whole.input_ids, fo);
      }
      engine_->run_event(Event::kAfterForward);
      engine_->run_event(Event::kBeforeLoss);
      {
        AutocastGuard autocast(state_.precision, dev);
        const at::Tensor sum = vocab_parallel
                                   ? dist::vocab_parallel_cross_entropy(
                                         state_.outputs, models::next_token_targets(state_.batch),
                                         state_.outputs.size(-1) * vocab->size(), ce.label_smoothing, ce.z_loss, vocab)
                                   : loss_sum();
        state_.loss = scaled_loss(sum, whole, end - start, n, token_scale, scale, context_scale);
      }
      // A mixture of experts' auxiliary losses (models/moe.h), each microbatch's by its share of the samples as
      // Composer weighs its loss dicts: in the reported loss here, and in the gradient through the model's own graph
      // at the factor set for this backward.
      auto* moe = models::capability<models::MixtureOfExpertsModel>(*state_.model);
      const std::map<std::string, at::Tensor> aux = moe ? moe->auxiliary_losses() : std::map<std::string, at::Tensor>{};
      if (!aux.empty()) {
        const double share = static_cast<double>(end - start) / static_cast<double>(n);
        moe->set_auxiliary_loss_scale(share * (loss_scaler_.enabled() ? loss_scaler_.loss_scale() : 1.0));
        for (const auto& [name, value] : aux) {
          state_.loss = state_.loss + value.to(state_.loss.scalar_type()) * share;
          at::Tensor& sum = aux_losses_[name];
          const at::Tensor part = value.detach().to(at::kDouble).reshape({1}) * share;
          sum = sum.defined() ? sum + part : part;
        }
      }
      for (const auto& routed : moe ? moe->expert_token_counts() : std::vector<std::pair<std::string, at::Tensor>>{}) {
        const std::string& router = routed.first;
        auto it = std::find_if(expert_counts_.begin(), expert_counts_.end(),
                               [&router](const auto& entry) { return entry.first == router; });
        const at::Tensor counts = routed.second.to(at::kDouble);  // on the device until logged
        if (it == expert_counts_.end()) {
          expert_counts_.emplace_back(router, counts);
        } else {
          it->second = it->second + counts;
        }
      }
      engine_->run_event(Event::kAfterLoss);
      engine_->run_event(Event::kBeforeBackward);
      loss_scaler_.scale(state_.loss).backward();
      state_.parallel->finish_backward();
      engine_->run_event(Event::kAfterBackward);
      total.add_(state_.loss.detach().reshape({1}));
    }
  } catch (const std::exception& e) {
    if (oom_retry_.absorb(e, *state_.parallel)) return false;
    throw;
  }
  // A rank that ran out of memory after its last collective tells the others here.
  if (oom_retry_.peer_failed(*state_.parallel)) return false;
  step_total_ = total;
  return true;
}

models::ForwardOptions Trainer::microbatch_options(const data::TokenBatch& whole,
                                                   const std::shared_ptr<models::ContextExchange>& context,
                                                   std::shared_ptr<const models::ContextShard>& shard) {
  models::ForwardOptions fo = forward_options(whole);
  if (context) {
    const int64_t seq = whole.input_ids.size(1);
    if (!shard || shard->key_order.size(0) != seq) {
      shard = models::make_context_shard(context, seq, whole.input_ids.device());
    }
    fo.context = shard;
    state_.batch = models::context_shard_batch(whole, *fo.context);  // what the loss and callbacks see
  }
  return fo;
}

at::Tensor Trainer::scaled_loss(const at::Tensor& sum, const data::TokenBatch& microbatch, int64_t rows, int64_t n,
                                const at::Tensor* token_scale, double scale, double context_scale) const {
  if (cfg_.accumulate_train_batch_on_tokens) return token_scale != nullptr ? sum * *token_scale : sum * scale;
  // The microbatch's mean over its loss tokens (the whole sequences'), by its share of the samples. The count stays
  // on the device: no host sync per microbatch.
  const at::Tensor tokens =
      microbatch.labels.slice(1, 1).ne(data::kIgnoreLabel).sum().clamp_min(1).to(sum.scalar_type());
  return sum / tokens * (context_scale * static_cast<double>(rows) / static_cast<double>(n));
}

bool Trainer::run_graphed_microbatches(const data::TokenBatch& batch, bool capture) {
  const data::TokenBatch& inputs = graph_->load(batch, token_scale());
  if (capture) {
    // No gradients yet: the captured backward makes them in the graph's memory, where every replay writes them. The
    // warmup's outputs go first, so that they are not held beside the capture's.
    clear_step_results();
    const std::string failed = graph_->capture(
        [&] { (void)run_microbatches(inputs, state_.device_train_microbatch_size, &graph_->token_scale()); });
    if (!failed.empty()) {
      if (state_.rank == 0) {
        spdlog::warn(
            "cuda_graphs: batch {}: the training step could not be captured ({}); the run goes on without "
            "CUDA graphs",
            state_.timestamp.batch + 1, failed);
      }
      state_.parallel->discard_microbatches();
      clear_step_results();
      return false;
    }
    detail::StepGraph::Outputs kept{step_total_, state_.loss, state_.outputs, {}, aux_losses_, expert_counts_};
    for (const at::Tensor& p : state_.trainable_parameters()) kept.grads.push_back(p.grad());
    graph_->keep(std::move(kept));
  }
  graph_->replay();
  // The replay's results, where the trainer and the components after the microbatches look for them (an eager step
  // in between, e.g. the epoch's last partial batch, made gradients of its own).
  const detail::StepGraph::Outputs& out = graph_->outputs();
  const std::vector<at::Tensor> params = state_.trainable_parameters();
  for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = out.grads[i];
  step_total_ = out.total;
  state_.loss = out.loss;
  state_.outputs = out.outputs;
  aux_losses_ = out.aux_losses;
  expert_counts_ = out.expert_counts;
  return true;
}

void Trainer::clear_step_results() {
  state_.outputs = at::Tensor();
  state_.loss = at::Tensor();
  step_total_ = at::Tensor();
  aux_losses_.clear();
  expert_counts_.clear();
  state_.optimizer->zero_grad();
}

at::Tensor Trainer::loss_sum() const {
  return loss_ ? loss_->sum(state_.outputs, state_.batch) : state_.model->loss(state_.outputs, state_.batch);
}

void Trainer::train_batch() {
  const data::TokenBatch full = state_.batch;
  state_.skip_optimizer_step = false;
  using Mode = detail::StepGraph::Mode;
  const Mode mode = graph_ ? graph_->mode_for(full, state_.device_train_microbatch_size) : Mode::kEager;
  bool graphed = false;
  if (mode == Mode::kCapture || mode == Mode::kReplay) {
    engine_->run_event(Event::kBeforeTrainBatch);
    graphed = run_graphed_microbatches(full, mode == Mode::kCapture);
  }
  while (!graphed) {
    if (mode != Mode::kCapture) engine_->run_event(Event::kBeforeTrainBatch);  // a failed capture already ran it
    state_.optimizer->zero_grad();
    bool ran = false;
    if (mode == Mode::kWarmup) {
      graph_->on_side_stream([&] { ran = run_microbatches(full, state_.device_train_microbatch_size); });
    } else if (cfg_.fsdp.pipeline_degree() > 1) {
      run_pipeline(full);
      ran = true;
    } else {
      ran = run_microbatches(full, state_.device_train_microbatch_size);
    }
    if (ran) break;
    // Out of memory with `auto` (on this rank or another): halve the microbatch and retry the same batch.
    state_.device_train_microbatch_size = OutOfMemoryRetry::halve(state_.device_train_microbatch_size, state_.rank);
    spdlog::warn(
        "rank {}: out of memory (on this rank or another): retrying batch {} with "
        "device_train_microbatch_size={}",
        state_.rank, state_.timestamp.batch + 1, state_.device_train_microbatch_size);
    clear_step_results();
  }
  state_.batch = full;
  // The logged loss is the mean over every rank's device batch (Composer all-reduces it too): one read per step.
  // (Under pipeline parallelism only the last stage's ranks hold losses.)
  state_.comm->all_reduce(step_total_).wait();
  const int64_t holders = state_.world_size / cfg_.fsdp.pipeline_degree();  // ranks that computed a loss
  state_.train_loss = step_total_.item<double>() / static_cast<double>(holders);
  // Unscale before AFTER_TRAIN_BATCH (clipping sees true gradients); an overflow skips the step.
  const bool overflow = loss_scaler_.unscale(state_.trainable_parameters(), *state_.comm, state_.device);
  engine_->run_event(Event::kAfterTrainBatch);
  // Composer's order: the step uses the rate the scheduler last computed (at the previous step's timestamp).
  const optim::ScheduleClock clock{state_.previous_timestamp, state_.max_duration, state_.dataloader_len,
                                   state_.scale_schedule_ratio};
  const double lr = cfg_.optimizer.lr * state_.scheduler->multiplier(clock);
  if (state_.skip_optimizer_step && state_.rank == 0) {
    spdlog::warn("batch {}: optimizer step skipped", state_.timestamp.batch + 1);
  }
  if (!overflow && !state_.skip_optimizer_step) state_.optimizer->step(lr);
  loss_scaler_.update(overflow);
}

void Trainer::log_mixture_of_experts(Metrics& m) {
  if (aux_losses_.empty() && expert_counts_.empty()) return;
  // One all-reduce for the losses and every router's counts.
  std::vector<double> values;
  for (const auto& [name, v] : aux_losses_) values.push_back(v.item<double>());
  for (const auto& [router, counts] : expert_counts_) {
    const at::Tensor c = counts.to(at::kCPU).contiguous();
    values.insert(values.end(), c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
  }
  values = sum_over_ranks(state_, values);
  size_t i = 0;
  const double world = static_cast<double>(state_.world_size);
  for (const auto& [name, v] : aux_losses_) m["loss/train/" + name] = values[i++] / world;
  for (const auto& [router, counts] : expert_counts_) {
    const auto experts = static_cast<size_t>(counts.numel());
    double routed = 0;
    for (size_t e = 0; e < experts; ++e) routed += values[i + e];
    std::vector<std::string> starved;
    for (size_t e = 0; e < experts; ++e) {
      m[fmt::format("moe/{}/expert_{}", router, e)] = routed > 0 ? values[i + e] / routed : 0.0;
      if (values[i + e] == 0 && starved_warned_.insert(fmt::format("{}/{}", router, e)).second) {
        starved.push_back(std::to_string(e));
      }
    }
    if (!starved.empty() && state_.rank == 0) {
      spdlog::warn(
          "batch {}: router {} sent no tokens to expert{} {} (of {} routed on all ranks): starved experts stop "
          "learning; a larger moe_loss_weight or moe_jitter_eps spreads the load (warned once per expert)",
          state_.timestamp.batch + 1, router, starved.size() > 1 ? "s" : "", fmt::join(starved, ", "),
          static_cast<int64_t>(routed));
    }
    i += experts;
  }
}

}  // namespace tessera::trainer
