// Composer's scheduler formulas (composer/optim/scheduler.py) and LLM Foundry's inverse square root schedule.
#include "tessera/optim/scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

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

}  // namespace

double lr_multiplier(const SchedulerOptions& o, const ScheduleClock& c) {
  const std::string& n = o.name;
  const bool warmup = n.size() > 12 && n.compare(n.size() - 12, 12, "_with_warmup") == 0 && n != "inv_sqrt_with_warmup";
  if (warmup) {
    const double warmup_ssr = o.scale_warmup ? c.ssr : 1.0;
    const Count t_warmup = convert(o.t_warmup, c);
    if (before(c, t_warmup)) {
      // LinearScheduler(0, alpha or 1, t_warmup), evaluated with SSR only when scale_warmup.
      const Count scaled = convert(o.t_warmup, c, warmup_ssr);
      const double target = n == "constant_with_warmup" ? o.alpha : (n == "linear_decay_with_warmup" ? o.alpha_i : 1.0);
      return linear(c, 0.0, target, scaled);
    }
    if (n == "multistep_with_warmup") return multistep(o, c);
    const Count t_max = convert(o.t_max, c, c.ssr);
    if (n == "constant_with_warmup") return before(c, t_max) ? o.alpha : 1.0;
    const double frac = post_warmup_fraction(c, t_warmup, t_max);
    if (n == "linear_decay_with_warmup") return o.alpha_i + frac * (o.alpha_f - o.alpha_i);
    if (n == "cosine_with_warmup") return cosine_anneal(frac, o.alpha_f);
    if (n == "polynomial_with_warmup") return o.alpha_f + std::pow(1.0 - frac, o.power) * (1.0 - o.alpha_f);
  }
  if (n == "constant") return before(c, convert(o.t_max, c, c.ssr)) ? o.alpha : 1.0;
  if (n == "linear") return linear(c, o.alpha_i, o.alpha_f, convert(o.t_max, c, c.ssr));
  if (n == "cosine") {
    const Count t_max = convert(o.t_max, c, c.ssr);
    return cosine_anneal(now_in(c, t_max.unit) / t_max.value, o.alpha_f);
  }
  if (n == "polynomial") {
    const Count t_max = convert(o.t_max, c, c.ssr);
    const double frac = std::min(1.0, now_in(c, t_max.unit) / t_max.value);
    return o.alpha_f + std::pow(1.0 - frac, o.power) * (1.0 - o.alpha_f);
  }
  if (n == "step") {
    const Count step = convert(o.step_size, c, c.ssr);
    return std::pow(o.gamma, std::floor(now_in(c, step.unit) / step.value));
  }
  if (n == "multistep") return multistep(o, c);
  if (n == "exponential") {
    const Count period = convert(o.decay_period, c, c.ssr);
    return std::pow(o.gamma, now_in(c, period.unit) / period.value);
  }
  if (n == "cosine_warm_restarts") {
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
  if (n == "inv_sqrt_with_warmup") {
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
  throw std::invalid_argument(fmt::format("unknown scheduler `{}`", n));
}

std::string check_schedule(const SchedulerOptions& o, const config::Time& max_duration) {
  // As Composer's *_with_warmup schedulers do (_raise_if_max_duration_exceeds_t_max).
  const bool has_t_max =
      o.name == "linear_decay_with_warmup" || o.name == "cosine_with_warmup" || o.name == "polynomial_with_warmup";
  if (has_t_max && o.t_max.unit() == max_duration.unit() && o.t_max.value() < max_duration.value()) {
    return fmt::format("scheduler.t_max ({}) is shorter than max_duration ({}); the schedule would end first",
                       o.t_max.str(), max_duration.str());
  }
  if (o.name == "inv_sqrt_with_warmup") {
    for (const auto& [key, t] :
         {std::pair{"t_warmup", o.t_warmup}, {"t_scale", o.t_scale}, {"t_cooldown", o.t_cooldown}}) {
      if (t.unit() != max_duration.unit()) {
        return fmt::format("scheduler.{} ({}) must be in max_duration's unit ({})", key, t.str(), max_duration.str());
      }
    }
  }
  return {};
}

}  // namespace tessera::optim
