// Optimizer and learning-rate scheduler options, by the names LLM Foundry recipes use (`optimizer.name`,
// `scheduler.name`), with Composer's defaults.
#pragma once

#include <any>
#include <optional>
#include <string>
#include <vector>

#include "tessera/config/registry.h"
#include "tessera/config/time.h"

namespace tessera::optim {

struct OptimizerOptions {
  std::string name;  // decoupled_adamw | adamw | decoupled_lionw | decoupled_sgdw
  double lr = 1e-3;
  std::vector<double> betas;  // Adam/Lion (beta1, beta2); empty for SGD
  double eps = 1e-8;          // Adam variants only
  double weight_decay = 0.0;  // decoupled_*: decay follows the schedule (wd * lr_t / lr_0), not scaled by lr
  double momentum = 0.0;      // decoupled_sgdw
  double dampening = 0.0;     // decoupled_sgdw
  bool nesterov = false;      // decoupled_sgdw
  std::any extra;             // a registered optimizer's own options (research code), as its parser made them
  // Facts about the optimizer that plans and monitors use, set by its parser (a research optimizer's sets its own):
  int state_tensors = 2;   // fp32 state tensors kept per parameter: Adam 2 (m, v); Lion, SGD with momentum 1; SGD 0
  std::string class_name;  // its class as Composer names it in `lr-<class>/group0` (DecoupledAdamW); empty: `name`
};

// Composer's schedulers. Every time field carries its unit; `t_max` defaults to "1dur" (= max_duration).
struct SchedulerOptions {
  std::string name;  // see scheduler_registry() (scheduler.h) for the list
  config::Time t_warmup{0, config::TimeUnit::kBatch};
  config::Time t_max{1, config::TimeUnit::kDuration};
  double alpha = 1.0;                                      // constant*
  double alpha_i = 1.0;                                    // linear*
  double alpha_f = 0.0;                                    // final multiplier
  double gamma = 0.1;                                      // step, multistep, exponential
  double power = 2.0;                                      // polynomial*
  double t_mult = 1.0;                                     // cosine_warm_restarts
  bool scale_warmup = false;                               // whether scale_schedule_ratio also stretches the warmup
  config::Time step_size{0, config::TimeUnit::kBatch};     // step
  config::Time t_0{0, config::TimeUnit::kBatch};           // cosine_warm_restarts
  config::Time decay_period{1, config::TimeUnit::kEpoch};  // exponential
  std::vector<config::Time> milestones;                    // multistep*
  config::Time t_scale{0, config::TimeUnit::kBatch};       // inv_sqrt_with_warmup
  config::Time t_cooldown{0, config::TimeUnit::kBatch};    // inv_sqrt_with_warmup
  double alpha_f_decay = 0.0;                              // inv_sqrt_with_warmup: limit of the decay
  double alpha_f_cooldown = 0.0;                           // inv_sqrt_with_warmup: end of the linear cooldown
  std::any extra;  // a registered scheduler's own options (research code), as its parser made them
};

}  // namespace tessera::optim
