// The Logger facade and State helpers.
#include "tessera/core/state.h"

#include "tessera/dist/fsdp.h"

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

std::vector<at::Tensor> State::trainable_parameters() const {
  if (parallel) return parallel->parameters();
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : model->parameters()) {
    if (p.requires_grad()) out.push_back(p);
  }
  return out;
}

std::vector<at::Tensor> State::held_parameters() const {
  return parallel ? parallel->parameters() : model->parameters();
}

std::vector<HeldTensor> State::held_layout() const {
  std::vector<HeldTensor> out;
  if (parallel) {
    const auto layout = parallel->shard_layout();
    const auto& params = parallel->parameters();
    for (size_t i = 0; i < params.size(); ++i) out.push_back({params[i], layout[i]});
    return out;
  }
  for (const auto& item : model->named_parameters()) {
    const at::Tensor& p = item.value();
    out.push_back({p, {{item.key(), p.sizes().vec(), 0, p.numel(), 0}}});
  }
  return out;
}

at::Tensor State::sum_over_shards(const at::Tensor& t) const {
  return parallel ? parallel->sum_over_shards(t) : t;
}

}  // namespace tessera::core
