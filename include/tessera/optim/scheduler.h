// Learning-rate schedules: Composer's schedulers (and LLM Foundry's inv_sqrt_with_warmup) as pure functions of the
// timestamp, so that resuming needs no scheduler state. A Scheduler is built once from its options (the formula is
// chosen then, not on every step):
//
//   auto sched = scheduler_registry().build(cfg.scheduler.name, cfg.scheduler);
//   lr_t = lr_0 * sched->multiplier({state.timestamp, cfg.max_duration, batches_per_epoch});
//
// Times convert as Composer's _convert_time does: `dur` becomes max_duration's unit (epochs become batches through
// the dataloader length), `ep` becomes batches, and the scale-schedule ratio multiplies what it applies to.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "tessera/config/time.h"
#include "tessera/optim/options.h"

namespace tessera::optim {

struct ScheduleClock {
  const config::Timestamp& now;
  config::Time max_duration;
  std::optional<int64_t> dataloader_len;  // batches per epoch; needed when a time or max_duration is in epochs
  double ssr = 1.0;                       // scale_schedule_ratio
};

class Scheduler {
 public:
  virtual ~Scheduler() = default;
  // The multiplier of the initial learning rate at `clock.now`. Throws std::invalid_argument for a schedule that
  // cannot be evaluated (epochs without a dataloader length, a warm-restart interval decayed to 0).
  virtual double multiplier(const ScheduleClock& clock) const = 0;
  // Checks before training: an empty string when fine, else the reason (default: fine).
  virtual std::string check(const config::Time& /*max_duration*/) const { return {}; }
};

// `scheduler.name` -> parse the options, build the schedule. Built in: Composer's schedulers and LLM Foundry's
// inv_sqrt_with_warmup; research code adds its own (SchedulerOptions::extra holds its own keys).
using SchedulerRegistry = config::Registry<SchedulerOptions, std::shared_ptr<const Scheduler>>;
SchedulerRegistry& scheduler_registry();

// The registered schedule of options.name, built and evaluated once (for tests and one-off uses).
double lr_multiplier(const SchedulerOptions& options, const ScheduleClock& clock);

namespace detail {
// The built-in schedule of options.name (the registry's builder). Throws ConfigError for an unknown name.
std::shared_ptr<const Scheduler> builtin_scheduler(const SchedulerOptions& options);
}  // namespace detail

// The registered schedule's checks before training (Scheduler::check), for tests and one-off uses. The built-ins make
// Composer's: t_max shorter than max_duration in the same unit is an error for the *_with_warmup decays (the schedule
// would end before training does), and inv_sqrt_with_warmup's times must be in max_duration's unit. Returns an empty
// string when fine, else the reason.
std::string check_schedule(const SchedulerOptions& options, const config::Time& max_duration);

}  // namespace tessera::optim
