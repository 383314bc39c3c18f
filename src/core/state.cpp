// The Logger facade and State helpers.
#include "tessera/core/state.h"

#include "tessera/distributed/fsdp.h"
#include "tessera/util/error.h"

namespace tessera::core {

void Logger::log_metrics(const Metrics& metrics) {
  for (auto& d : destinations_) d->log_metrics(metrics, state_.timestamp.batch);
}

void Logger::log_hyperparameters(const nlohmann::json& hparams) {
  for (auto& d : destinations_) d->log_hyperparameters(hparams);
}

double State::current_lr() const {
  if (!optimizer || !scheduler) return 0;
  const optim::ScheduleClock c{previous_timestamp, max_duration, dataloader_len, scale_schedule_ratio};
  return optimizer->options().lr * scheduler->multiplier(c);
}

namespace {

const dist::ParallelModel& engine(const State& s) {
  if (!s.parallel) throw Error("state", "the model's parameters are held by the sharding engine, set up after INIT");
  return *s.parallel;
}

}  // namespace

std::vector<at::Tensor> State::trainable_parameters() const {
  return engine(*this).parameters();
}

std::vector<at::Tensor> State::held_parameters() const {
  std::vector<at::Tensor> out = engine(*this).parameters();
  for (const auto& [name, t] : parallel->frozen_parameters()) out.push_back(t);
  return out;
}

std::vector<HeldTensor> State::held_layout() const {
  const dist::ParallelModel& e = engine(*this);
  std::vector<HeldTensor> out;
  const auto layout = e.shard_layout();
  const auto& params = e.parameters();
  for (size_t i = 0; i < params.size(); ++i) out.push_back({params[i], layout[i], false});
  for (const auto& [name, t] : e.frozen_parameters()) {
    out.push_back({t, {{name, t.sizes().vec(), 0, t.numel(), 0}}, true});
  }
  return out;
}

at::Tensor State::sum_over_shards(const at::Tensor& t) const {
  return parallel->sum_over_shards(t);
}

}  // namespace tessera::core
