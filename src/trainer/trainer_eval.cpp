// The Trainer's evaluation: when it is due, the eval loader's metrics and the ICL tasks (Composer's _eval_loop).
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <string>
#include <vector>

#include "tessera/eval/icl.h"
#include "tessera/trainer/precision_context.h"
#include "tessera/trainer/trainer.h"
#include "tessera/trainer/trainer_support.h"
#include "tessera/util/error.h"
#include "tessera/util/heartbeat.h"

namespace tessera::trainer {

using config::Time;
using config::TimeUnit;
using core::Event;
using core::Metrics;
using detail::data_rank;
using detail::data_world;
using detail::forward_options;
using detail::sum_over_ranks;
using detail::to_device;

bool Trainer::eval_due_at_batch_end() const {
  const Time& iv = cfg_.eval_interval;
  if (!has_eval() || iv.is_zero() || iv.unit() == TimeUnit::kEpoch) return false;
  double every = iv.value();
  TimeUnit unit = iv.unit();
  if (unit == TimeUnit::kDuration) {
    // A fraction of max_duration, in its unit (epochs as batches).
    unit = state_.max_duration.unit();
    every = std::trunc(iv.value() * state_.max_duration.value());
    if (unit == TimeUnit::kEpoch) {
      unit = TimeUnit::kBatch;
      every = std::trunc(iv.value() * state_.max_duration.value() * static_cast<double>(*state_.dataloader_len));
    }
    every = std::max(1.0, every);
  }
  const double prev = static_cast<double>(state_.previous_timestamp.get(unit));
  const double now = static_cast<double>(state_.timestamp.get(unit));
  return std::floor(prev / every) != std::floor(now / every);
}

bool Trainer::eval_due_at_epoch_end() const {
  const Time& iv = cfg_.eval_interval;
  if (!has_eval() || iv.is_zero() || iv.unit() != TimeUnit::kEpoch) return false;
  return state_.timestamp.epoch % iv.count() == 0;
}

Metrics Trainer::run_eval() {
  last_eval_batch_ = state_.timestamp.batch;
  engine_->run_event(Event::kEvalBeforeAll);
  engine_->run_event(Event::kEvalStart);
  Metrics metrics;
  if (has_eval_loader()) metrics = run_loader_eval();
  run_icl_eval();
  engine_->run_event(Event::kEvalEnd);
  engine_->run_event(Event::kEvalAfterAll);
  return metrics;
}

Metrics Trainer::run_loader_eval() {
  const bool was_training = state_.model->is_training();
  state_.model->eval();
  const data::TokenBatch saved = state_.batch;
  state_.eval_timestamp = {};
  // The model's metrics, then TrainerParts' and the recipe's; sums[0..1] are LanguageCrossEntropy's (the summed loss
  // and the token count), then each metric's own.
  std::vector<std::shared_ptr<const models::EvalMetric>> metrics = state_.model->eval_metrics();
  metrics.insert(metrics.end(), metrics_.begin(), metrics_.end());
  std::vector<size_t> offsets;
  size_t width = 2;
  for (const auto& m : metrics) {
    offsets.push_back(width);
    width += m->num_sums();
  }
  std::vector<double> sums(width, 0.0);
  {
    at::NoGradGuard no_grad;
    std::unique_ptr<data::BatchIterator> loader = open_eval();
    while (cfg_.eval_subset_num_batches < 0 || state_.eval_timestamp.batch < cfg_.eval_subset_num_batches) {
      std::optional<data::TokenBatch> next = loader->next();
      if (!next) break;
      state_.batch = to_device(std::move(*next), state_.device, /*non_blocking=*/false);
      engine_->run_event(Event::kEvalBatchStart);
      engine_->run_event(Event::kEvalBeforeForward);
      {
        AutocastGuard autocast(state_.precision, state_.device.type());
        state_.outputs = state_.model->forward(state_.batch.input_ids, forward_options(state_.batch));
      }
      engine_->run_event(Event::kEvalAfterForward);
      // LanguageCrossEntropy: summed over predicted tokens, divided by their count at the end.
      sums[0] += models::causal_lm_loss(state_.outputs, state_.batch.labels, data::kIgnoreLabel, at::Reduction::Sum)
                     .item<double>();
      const int64_t tokens = data::loss_token_count(state_.batch);
      sums[1] += static_cast<double>(tokens);
      for (size_t i = 0; i < metrics.size(); ++i) metrics[i]->update(state_.outputs, state_.batch, &sums[offsets[i]]);
      state_.eval_timestamp.to_next_batch(state_.batch.samples, tokens, 0);
      engine_->run_event(Event::kEvalBatchEnd);
      util::heartbeat(fmt::format("eval batch {}", state_.eval_timestamp.batch));  // progress for the watchdog
    }
  }
  // Every rank evaluated its share of the eval set.
  sums = sum_over_ranks(state_, sums);
  if (sums[1] == 0) throw Error("eval", "the eval loader yielded no tokens (is the eval dataset empty?)");
  const double ce = sums[0] / sums[1];
  Metrics values{{"LanguageCrossEntropy", ce}, {"LanguagePerplexity", std::exp(ce)}};
  for (size_t i = 0; i < metrics.size(); ++i) values[metrics[i]->name()] = metrics[i]->compute(&sums[offsets[i]]);
  state_.eval_metrics["eval"] = values;
  Metrics logged;
  for (const auto& [name, value] : values) logged["metrics/eval/" + name] = value;
  logger_.log_metrics(logged);
  state_.batch = saved;
  if (was_training) state_.model->train();
  return values;
}

void Trainer::run_icl_eval() {
  if (icl_tasks_.empty()) return;
  std::vector<eval::IclResult> results;
  for (const eval::IclTaskConfig& task : icl_tasks_) {
    for (int64_t k : task.num_fewshot) {
      util::heartbeat(fmt::format("icl {} {}-shot", task.label, k));
      eval::IclRanks ranks{data_rank(state_, cfg_.fsdp), data_world(state_, cfg_.fsdp),
                           [this](std::vector<double>& v) { v = sum_over_ranks(state_, v); }};
      for (const eval::IclResult& r :
           eval::evaluate_icl_task(*state_.model, *tokenizer_, task, k, ranks, cfg_.device_eval_batch_size)) {
        state_.eval_metrics[r.label] = Metrics{{r.metric, r.accuracy()}};
        logger_.log_metrics({{fmt::format("metrics/{}/{}", r.label, r.metric), r.accuracy()}});
        results.push_back(r);
      }
    }
  }
  if (gauntlet_) {
    Metrics scores;
    for (const auto& [name, score] : eval::compute_gauntlet(*gauntlet_, results)) {
      scores[fmt::format("icl/metrics/eval_gauntlet/{}", name)] = score;
    }
    state_.eval_metrics["eval_gauntlet"] = scores;
    logger_.log_metrics(scores);
  }
}

Metrics Trainer::eval() {
  if (!has_eval()) {
    throw ConfigError("recipe", fmt::format("{}: eval needs an eval_loader or icl_tasks", cfg_.recipe_path));
  }
  engine_->run_event(Event::kEvalStandaloneStart);
  Metrics m = run_eval();
  engine_->run_event(Event::kEvalStandaloneEnd);
  return m;
}

}  // namespace tessera::trainer
