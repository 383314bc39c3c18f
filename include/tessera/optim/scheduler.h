// Learning-rate schedules: Composer's schedulers (and LLM Foundry's inv_sqrt_with_warmup) as pure functions of the
// timestamp, so that resuming needs no scheduler state.
//
//   double m = lr_multiplier(cfg.scheduler, {state.timestamp, cfg.max_duration, batches_per_epoch});
//   lr_t = lr_0 * m;
//
// Times convert as Composer's _convert_time does: `dur` becomes max_duration's unit (epochs become batches through
// the dataloader length), `ep` becomes batches, and the scale-schedule ratio multiplies what it applies to.
#pragma once

#include <cstdint>
#include <optional>

#include "tessera/config/time.h"
#include "tessera/optim/options.h"

namespace tessera::optim {

struct ScheduleClock {
  const config::Timestamp& now;
  config::Time max_duration;
  std::optional<int64_t> dataloader_len;  // batches per epoch; needed when a time or max_duration is in epochs
  double ssr = 1.0;                       // scale_schedule_ratio
};

// The multiplier of the initial learning rate at `clock.now`. Throws std::invalid_argument for a schedule that
// cannot be evaluated (epochs without a dataloader length, a warm-restart interval decayed to 0).
double lr_multiplier(const SchedulerOptions& options, const ScheduleClock& clock);

// Composer's checks before training: t_max shorter than max_duration in the same unit is an error (the schedule
// would end before training does). Returns an empty string when fine, else the reason.
std::string check_schedule(const SchedulerOptions& options, const config::Time& max_duration);

}  // namespace tessera::optim
