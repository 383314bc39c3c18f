// Event dispatch in Composer's order, the Logger facade, and State helpers.
#include "tessera/trainer/engine.h"

#include "tessera/dist/fsdp.h"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <cstring>

namespace tessera::trainer {

void Logger::log_metrics(const Metrics& metrics) {
  for (auto& d : destinations_) d->log_metrics(metrics, state_.timestamp.batch);
}

void Logger::log_hyperparameters(const nlohmann::json& hparams) {
  for (auto& d : destinations_) d->log_hyperparameters(hparams);
}

double State::current_lr() const {
  if (!optimizer) return 0;
  const optim::ScheduleClock c{previous_timestamp, max_duration, dataloader_len, scale_schedule_ratio};
  return optimizer->options().lr * optim::lr_multiplier(scheduler, c);
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

at::Tensor State::sum_over_shards(const at::Tensor& t) const {
  return parallel ? parallel->sum_over_shards(t) : t;
}

bool Engine::debug_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("TESSERA_ENGINE_DEBUG");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return enabled;
}

void Engine::run_event(Event event) {
  const bool debug = debug_enabled();
  auto trace = [&](const std::string& who) {
    if (debug)
      spdlog::debug("[ep={}][ba={}][event={}] {}", state_.timestamp.epoch, state_.timestamp.batch, to_string(event),
                    who);
  };
  auto run_algorithms = [&] {
    std::vector<Algorithm*> matched;
    for (auto& a : state_.algorithms) {
      if (a->match(event, state_)) matched.push_back(a.get());
    }
    if (is_after_event(event)) std::reverse(matched.begin(), matched.end());
    for (Algorithm* a : matched) {
      trace(a->name());
      a->apply(event, state_, logger_);
    }
  };
  auto run_callbacks = [&](bool loggers) {
    for (auto& c : state_.callbacks) {
      if ((dynamic_cast<LoggerDestination*>(c.get()) != nullptr) != loggers) continue;
      trace(c->name());
      c->run_event(event, state_, logger_);
    }
  };
  if (event == Event::kInit) {
    run_callbacks(true);
    run_callbacks(false);
    run_algorithms();
  } else {
    run_algorithms();
    run_callbacks(false);
    run_callbacks(true);
  }
}

void Engine::close() {
  if (closed_) return;
  closed_ = true;
  for (auto& c : state_.callbacks) {
    try {
      c->close(state_, logger_);
    } catch (const std::exception& e) {
      spdlog::error("callback {} failed to close: {}", c->name(), e.what());
    }
  }
}

}  // namespace tessera::trainer
