// The plug-in points of the training loop, as in Composer:
//   - Algorithm: match(event, state) then apply(event, state, logger); may change the model, the batch, the loss or
//     the gradients. Registered by name for `algorithms:` in recipes.
//   - Callback: run_event(event, state, logger) on every event; observes and logs (speed, memory, checkpoints, ...).
//   - LoggerDestination: a Callback that also receives metrics (console, JSONL file, TensorBoard).
//   - Logger: the facade the others log through; it fans metrics out to every destination.
// The Engine (engine.h) decides the order in which they run.
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <any>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "tessera/config/component.h"
#include "tessera/core/event.h"

namespace tessera::core {

struct State;
class Logger;

using Metrics = std::map<std::string, double>;

// What an algorithm or callback keeps across a checkpoint (Composer's state_dict / load_state_dict): small values,
// and tensors aligned one to one with State::held_parameters() (e.g. EMA's averaged weights), which checkpoints store
// and reshard like the parameters themselves.
struct ComponentState {
  nlohmann::json values = nlohmann::json::object();
  std::vector<at::Tensor> per_parameter;
};

class Algorithm {
 public:
  virtual ~Algorithm() = default;
  virtual std::string name() const = 0;
  // Whether it works when the parameters are the sharding engine's flat shards (held_parameters()) rather than the
  // model's own tensors; the trainer refuses the others with more than one rank.
  virtual bool supports_sharded_parameters() const { return true; }
  virtual bool match(Event event, const State& state) const = 0;
  virtual void apply(Event event, State& state, Logger& logger) = 0;
  // Checkpointed state; nullopt (the default) for stateless algorithms. Loading happens before FIT_START.
  virtual std::optional<ComponentState> state_dict(const State& /*state*/) const { return std::nullopt; }
  virtual void load_state_dict(const ComponentState& /*saved*/, State& /*state*/) {}
};

class Callback {
 public:
  virtual ~Callback() = default;
  virtual std::string name() const = 0;
  virtual void run_event(Event event, State& state, Logger& logger) = 0;
  // Always called when the trainer is destroyed, also after an exception (flush files here).
  virtual void close(State& /*state*/, Logger& /*logger*/) {}
  // Checkpointed state, as for Algorithm.
  virtual std::optional<ComponentState> state_dict(const State& /*state*/) const { return std::nullopt; }
  virtual void load_state_dict(const ComponentState& /*saved*/, State& /*state*/) {}
};

class LoggerDestination : public Callback {
 public:
  // `step` is the batch count (optimizer steps) at which the metrics were taken.
  virtual void log_metrics(const Metrics& metrics, int64_t step) = 0;
  virtual void log_hyperparameters(const nlohmann::json& /*hparams*/) {}
  void run_event(Event /*event*/, State& /*state*/, Logger& /*logger*/) override {}
};

class Logger {
 public:
  explicit Logger(const State& state) : state_(state) {}
  void add_destination(std::shared_ptr<LoggerDestination> d) { destinations_.push_back(std::move(d)); }
  const std::vector<std::shared_ptr<LoggerDestination>>& destinations() const { return destinations_; }
  // Logs at the current batch (state.timestamp.batch).
  void log_metrics(const Metrics& metrics);
  void log_hyperparameters(const nlohmann::json& hparams);

 private:
  const State& state_;
  std::vector<std::shared_ptr<LoggerDestination>> destinations_;
};

// What the trainer tells a component it builds from a recipe: the run and this process's place in it.
struct RunContext {
  std::string run_name;
  int64_t rank = 0;
  int64_t world_size = 1;
};

// `algorithms:`, `callbacks:` and `loggers:` entries: name -> parse the options, build the component. A logger's
// builder returns a LoggerDestination, or nullptr when this rank writes nothing.
using AlgorithmRegistry = config::ComponentRegistry<std::shared_ptr<Algorithm>, const RunContext&>;
using CallbackRegistry = config::ComponentRegistry<std::shared_ptr<Callback>, const RunContext&>;

// The builder of a component that is constructed from the Options its parser returned (Options void: from nothing),
// for AlgorithmRegistry (Base = Algorithm) and CallbackRegistry (Base = Callback).
template <class Base, class T, class Options = void>
std::function<std::shared_ptr<Base>(const std::any&, const RunContext&)> construct() {
  return [](const std::any& options, const RunContext& /*run*/) -> std::shared_ptr<Base> {
    if constexpr (std::is_void_v<Options>) {
      return std::make_shared<T>();
    } else {
      return std::make_shared<T>(std::any_cast<const Options&>(options));
    }
  };
}

}  // namespace tessera::core
