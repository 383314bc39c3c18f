// Composer's scheduler formulas (composer/optim/scheduler.py) and LLM Foundry's inverse square root schedule.
#include "tessera/optim/scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include "tessera/util/error.h"

namespace tessera::optim {
namespace {

using config::Time;
using config::TimeUnit;

constexpr double kPi = 3.14159265358979323846;

// An integral time in a counting unit (ba, sp, tok, or ep only for max_duration itself).
struct Count {
  double value;
  TimeUnit unit;
};

// Composer's _convert_time.
Count convert(const Time& t, const ScheduleClock& c, double ssr = 1.0) {
  auto batches_per_epoch = [&]() -> double {
    if (!c.dataloader_len)
      throw std::invalid_argument("cannot convert epochs to batches: the dataloader length is unknown");
    return static_cast<double>(*c.dataloader_len);
  };
  if (t.unit() == TimeUnit::kDuration) {
    if (c.max_duration.unit() == TimeUnit::kEpoch) {
      return {std::trunc(t.value() * batches_per_epoch() * c.max_duration.value()), TimeUnit::kBatch};
    }
    return {std::trunc(t.value() * c.max_duration.value()), c.max_duration.unit()};
  }
  double value = t.value();
  TimeUnit unit = t.unit();
  if (unit == TimeUnit::kEpoch) {
    value *= batches_per_epoch();
    unit = TimeUnit::kBatch;
  }
  return {std::trunc(value * ssr), unit};
}

double now_in(const ScheduleClock& c, TimeUnit unit) {
  return static_cast<double>(c.now.get(unit));
}
bool before(const ScheduleClock& c, const Count& t) {
  return now_in(c, t.unit) < t.value;
}

double cosine_anneal(double x, double min_y) {
  x = std::clamp(x, 0.0, 1.0);
  return min_y + (1.0 - min_y) * (1.0 + std::cos(x * kPi)) / 2.0;
}

// LinearScheduler(alpha_i, alpha_f, t_max).
double linear(const ScheduleClock& c, double alpha_i, double alpha_f, const Count& t_max) {
  const double frac = std::min(1.0, now_in(c, t_max.unit) / t_max.value);
  return alpha_i + frac * (alpha_f - alpha_i);
}

// Fraction of the post-warmup span elapsed, clipped to 1 (0 when t_max <= t_warmup).
double post_warmup_fraction(const ScheduleClock& c, const Count& t_warmup, const Count& t_max) {
  if (!(t_max.value > t_warmup.value)) return 0.0;
  const double f = (now_in(c, t_warmup.unit) - t_warmup.value) / (t_max.value - t_warmup.value);
  return std::min(1.0, f);
}

double multistep(const SchedulerOptions& o, const ScheduleClock& c) {
  double factor = 1.0;
  for (const Time& m : o.milestones) {
    if (!before(c, convert(m, c, c.ssr))) factor *= o.gamma;
  }
  return factor;
}

// The warmup phase of a *_with_warmup schedule (a ramp from 0 to `target`), or nullopt after it.
std::optional<double> warmup(const SchedulerOptions& o, const ScheduleClock& c, double target) {
  const Count t_warmup = convert(o.t_warmup, c);
  if (!before(c, t_warmup)) return std::nullopt;
  // LinearScheduler(0, target, t_warmup), evaluated with SSR only when scale_warmup.
  return linear(c, 0.0, target, convert(o.t_warmup, c, o.scale_warmup ? c.ssr : 1.0));
}

double constant(const SchedulerOptions& o, const ScheduleClock& c) {
  return before(c, convert(o.t_max, c, c.ssr)) ? o.alpha : 1.0;
}
double linear_schedule(const SchedulerOptions& o, const ScheduleClock& c) {
  return linear(c, o.alpha_i, o.alpha_f, convert(o.t_max, c, c.ssr));
}
double cosine(const SchedulerOptions& o, const ScheduleClock& c) {
  const Count t_max = convert(o.t_max, c, c.ssr);
  return cosine_anneal(now_in(c, t_max.unit) / t_max.value, o.alpha_f);
}
double polynomial(const SchedulerOptions& o, const ScheduleClock& c) {
  const Count t_max = convert(o.t_max, c, c.ssr);
  const double frac = std::min(1.0, now_in(c, t_max.unit) / t_max.value);
  return o.alpha_f + std::pow(1.0 - frac, o.power) * (1.0 - o.alpha_f);
}
double step(const SchedulerOptions& o, const ScheduleClock& c) {
  const Count step = convert(o.step_size, c, c.ssr);
  return std::pow(o.gamma, std::floor(now_in(c, step.unit) / step.value));
}
double exponential(const SchedulerOptions& o, const ScheduleClock& c) {
  const Count period = convert(o.decay_period, c, c.ssr);
  return std::pow(o.gamma, now_in(c, period.unit) / period.value);
}
double cosine_warm_restarts(const SchedulerOptions& o, const ScheduleClock& c) {
  const Count t_0 = convert(o.t_0, c, c.ssr);
  const double now = now_in(c, t_0.unit);
  double len = t_0.value;
  double end = t_0.value;
  while (end <= now) {
    if (len == 0) throw std::invalid_argument("the interval between warm restarts has decayed to 0 (t_mult < 1)");
    len = std::trunc(o.t_mult * len);
    end += len;
  }
  return cosine_anneal((now - (end - len)) / len, o.alpha_f);
}
double multistep_with_warmup(const SchedulerOptions& o, const ScheduleClock& c) {
  if (auto w = warmup(o, c, 1.0)) return *w;
  return multistep(o, c);
}
double constant_with_warmup(const SchedulerOptions& o, const ScheduleClock& c) {
  if (auto w = warmup(o, c, o.alpha)) return *w;
  return constant(o, c);
}
double linear_decay_with_warmup(const SchedulerOptions& o, const ScheduleClock& c) {
  if (auto w = warmup(o, c, o.alpha_i)) return *w;
  const double frac = post_warmup_fraction(c, convert(o.t_warmup, c), convert(o.t_max, c, c.ssr));
  return o.alpha_i + frac * (o.alpha_f - o.alpha_i);
}
double cosine_with_warmup(const SchedulerOptions& o, const ScheduleClock& c) {
  if (auto w = warmup(o, c, 1.0)) return *w;
  return cosine_anneal(post_warmup_fraction(c, convert(o.t_warmup, c), convert(o.t_max, c, c.ssr)), o.alpha_f);
}
double polynomial_with_warmup(const SchedulerOptions& o, const ScheduleClock& c) {
  if (auto w = warmup(o, c, 1.0)) return *w;
  const double frac = post_warmup_fraction(c, convert(o.t_warmup, c), convert(o.t_max, c, c.ssr));
  return o.alpha_f + std::pow(1.0 - frac, o.power) * (1.0 - o.alpha_f);
}
double inv_sqrt_with_warmup(const SchedulerOptions& o, const ScheduleClock& c) {
  const Count t_warmup = convert(o.t_warmup, c);
  if (before(c, t_warmup)) return linear(c, 0.0, 1.0, t_warmup);
  const Count t_scale = convert(o.t_scale, c, c.ssr);
  const Count t_cooldown = convert(o.t_cooldown, c, c.ssr);
  const Count t_max = convert(o.t_max, c, c.ssr);
  const double now = now_in(c, t_scale.unit);
  const double shift = t_scale.value - t_warmup.value;
  const double cooldown_start = std::max(t_max.value - t_cooldown.value, t_warmup.value);
  auto decay = [&](double t) {
    return o.alpha_f_decay + (1.0 - o.alpha_f_decay) / std::sqrt((t + shift) / t_scale.value);
  };
  if (now < cooldown_start) return decay(now);
  const double alpha_i = decay(cooldown_start);
  if (t_cooldown.value == 0) return alpha_i;
  const double frac = std::min(1.0, (now - cooldown_start) / t_cooldown.value);
  return alpha_i + frac * (o.alpha_f_cooldown - alpha_i);
}

using Formula = double (*)(const SchedulerOptions&, const ScheduleClock&);

// A built-in schedule's entry: its formula and the checks Composer makes before training, as facts of the entry.
struct Builtin {
  Formula formula;
  // Composer's *_with_warmup decays (_raise_if_max_duration_exceeds_t_max): t_max shorter than max_duration, in the
  // same unit, would end the schedule before training ends.
  bool t_max_covers_training = false;
  // LLM Foundry's inv_sqrt_with_warmup compares its times with the elapsed fraction of max_duration, so they must be in
  // max_duration's unit.
  bool times_in_max_duration_unit = false;
};

const std::map<std::string, Builtin>& builtins() {
  static const std::map<std::string, Builtin> table = {
      {"constant", {constant}},
      {"linear", {linear_schedule}},
      {"cosine", {cosine}},
      {"polynomial", {polynomial}},
      {"step", {step}},
      {"multistep", {multistep}},
      {"exponential", {exponential}},
      {"cosine_warm_restarts", {cosine_warm_restarts}},
      {"multistep_with_warmup", {multistep_with_warmup}},
      {"constant_with_warmup", {constant_with_warmup}},
      {"linear_decay_with_warmup", {linear_decay_with_warmup, /*t_max_covers_training=*/true}},
      {"cosine_with_warmup", {cosine_with_warmup, /*t_max_covers_training=*/true}},
      {"polynomial_with_warmup", {polynomial_with_warmup, /*t_max_covers_training=*/true}},
      {"inv_sqrt_with_warmup", {inv_sqrt_with_warmup, false, /*times_in_max_duration_unit=*/true}}};
  return table;
}

// A built-in schedule: its options and its entry, chosen once.
class BuiltinScheduler : public Scheduler {
 public:
  BuiltinScheduler(SchedulerOptions o, const Builtin& b) : o_(std::move(o)), b_(b) {}
  double multiplier(const ScheduleClock& clock) const override { return b_.formula(o_, clock); }

  std::string check(const config::Time& max_duration) const override {
    if (b_.t_max_covers_training && o_.t_max.unit() == max_duration.unit() && o_.t_max.value() < max_duration.value()) {
      return fmt::format("scheduler.t_max ({}) is shorter than max_duration ({}); the schedule would end first",
                         o_.t_max.str(), max_duration.str());
    }
    if (b_.times_in_max_duration_unit) {
      for (const auto& [key, t] :
           {std::pair{"t_warmup", o_.t_warmup}, {"t_scale", o_.t_scale}, {"t_cooldown", o_.t_cooldown}}) {
        if (t.unit() != max_duration.unit()) {
          return fmt::format("scheduler.{} ({}) must be in max_duration's unit ({})", key, t.str(), max_duration.str());
        }
      }
    }
    return {};
  }

 private:
  SchedulerOptions o_;
  const Builtin& b_;
};

}  // namespace

namespace detail {

std::shared_ptr<const Scheduler> builtin_scheduler(const SchedulerOptions& options) {
  auto it = builtins().find(options.name);
  if (it == builtins().end()) {
    throw ConfigError("scheduler", fmt::format("no built-in scheduler `{}`", options.name));
  }
  return std::make_shared<BuiltinScheduler>(options, it->second);
}

}  // namespace detail

double lr_multiplier(const SchedulerOptions& options, const ScheduleClock& clock) {
  return scheduler_registry().build(options.name, options)->multiplier(clock);
}

std::string check_schedule(const SchedulerOptions& options, const config::Time& max_duration) {
  return scheduler_registry().build(options.name, options)->check(max_duration);
}

}  // namespace tessera::optim
