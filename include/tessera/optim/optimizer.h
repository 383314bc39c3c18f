// Optimizers by the names LLM Foundry recipes use. They update whatever tensors they are handed (whole parameters or
// the local shards of sharded ones) from the gradients in `.grad()`, under no-grad, with fp32 state.
//
//   auto opt = make_optimizer(cfg.optimizer, model->parameters());
//   ... loss.backward();
//   opt->step(cfg.optimizer.lr * lr_multiplier(...));
//
// decoupled_adamw / decoupled_sgdw (Composer) and decoupled_lionw (LLM Foundry) decay weights by wd * lr_t / lr_0 per
// step (the decay follows the schedule but is not scaled by the learning rate); adamw (PyTorch) by lr_t * wd.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessera/optim/options.h"

namespace tessera::optim {

class Optimizer {
 public:
  Optimizer(OptimizerOptions options, std::vector<at::Tensor> params);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient, at learning rate `lr` (the scheduled rate, lr_0 * multiplier).
  void step(double lr);
  // Drops the gradients (set to none), as PyTorch's zero_grad(set_to_none=True).
  void zero_grad();

  const OptimizerOptions& options() const { return o_; }
  const std::vector<at::Tensor>& params() const { return params_; }
  int64_t steps() const { return step_; }
  double last_lr() const { return last_lr_; }

  // State for checkpoints: "step" (int64 scalar) and per parameter i the tensors "{i}.exp_avg", "{i}.exp_avg_sq" or
  // "{i}.momentum_buffer" (PyTorch's names). load_state throws naming the missing or mis-shaped entry.
  std::vector<std::pair<std::string, at::Tensor>> state() const;
  void load_state(const std::vector<std::pair<std::string, at::Tensor>>& state);
  // The per-parameter state tensors' names ("exp_avg", ...), in the order state() lists them.
  std::vector<std::string> slot_names() const { return state_names(); }

 protected:
  virtual void update(size_t i, at::Tensor& param, const at::Tensor& grad, double lr) = 0;
  // Updates every parameter with a gradient at once (a multi-tensor kernel) and returns true, or returns false to
  // have update() called per parameter. step_ has already been advanced.
  virtual bool update_all(double /*lr*/) { return false; }
  // Names of the per-parameter state tensors, created lazily by update().
  virtual std::vector<std::string> state_names() const = 0;
  at::Tensor& slot(size_t i, size_t k);  // k-th state tensor of parameter i (zeros of the parameter's shape at first)

  OptimizerOptions o_;
  std::vector<at::Tensor> params_;
  std::vector<std::vector<at::Tensor>> slots_;
  int64_t step_ = 0;
  double last_lr_ = 0;
};

// `optimizer.name` -> parse the options, build the optimizer over the parameters it is given. Built in:
// decoupled_adamw, adamw, decoupled_lionw, decoupled_sgdw; research code adds its own (OptimizerOptions::extra holds
// its own keys) before building a Trainer.
using OptimizerRegistry = config::Registry<OptimizerOptions, std::unique_ptr<Optimizer>, std::vector<at::Tensor>>;
OptimizerRegistry& optimizer_registry();

namespace detail {  // the built-in optimizers, for the registry
std::unique_ptr<Optimizer> make_adam(const OptimizerOptions& options, std::vector<at::Tensor> params, bool decoupled);
std::unique_ptr<Optimizer> make_lion(const OptimizerOptions& options, std::vector<at::Tensor> params);
std::unique_ptr<Optimizer> make_sgdw(const OptimizerOptions& options, std::vector<at::Tensor> params);
}  // namespace detail

// Builds the optimizer named by options.name over `params` (those with requires_grad; others are skipped).
std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options, const std::vector<at::Tensor>& params);

}  // namespace tessera::optim
