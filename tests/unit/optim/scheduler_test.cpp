// Composer's scheduler formulas at hand-computed points (composer/optim/scheduler.py and LLM Foundry's
// InverseSquareRootWithWarmupScheduler), including time conversion from dur and ep.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>

#include "tessera/optim/scheduler.h"

namespace tessera::optim {
namespace {

using config::Time;
using config::Timestamp;
using config::TimeUnit;

double at_batch(const SchedulerOptions& o, int64_t batch, Time max = Time::batches(100),
                std::optional<int64_t> len = std::nullopt) {
  Timestamp ts;
  ts.batch = batch;
  if (len) {
    ts.epoch = batch / *len;
    ts.batch_in_epoch = batch % *len;
  }
  return lr_multiplier(o, {ts, max, len});
}

SchedulerOptions named(const std::string& name) {
  SchedulerOptions o;
  o.name = name;
  return o;
}

TEST(Scheduler, CosineWithWarmup) {
  SchedulerOptions o = named("cosine_with_warmup");
  o.t_warmup = Time::batches(10);
  o.alpha_f = 0.1;
  EXPECT_DOUBLE_EQ(at_batch(o, 0), 0.0);
  EXPECT_DOUBLE_EQ(at_batch(o, 5), 0.5);
  EXPECT_DOUBLE_EQ(at_batch(o, 10), 1.0);
  EXPECT_NEAR(at_batch(o, 55), 0.55, 1e-12);
  EXPECT_NEAR(at_batch(o, 100), 0.1, 1e-12);
  // Warmup as a fraction of max_duration, and max_duration in epochs (t_max 1dur = 2 epochs x 50 batches).
  o.t_warmup = Time(0.1, TimeUnit::kDuration);
  EXPECT_DOUBLE_EQ(at_batch(o, 5), 0.5);
  o.alpha_f = 0;
  o.t_warmup = Time::batches(0);
  EXPECT_NEAR(at_batch(o, 50, Time::epochs(2), 50), 0.5, 1e-12);
  EXPECT_THROW(at_batch(o, 50, Time::epochs(2)), std::invalid_argument);  // epochs without a dataloader length
}

TEST(Scheduler, LinearConstantPolynomial) {
  SchedulerOptions lin = named("linear_decay_with_warmup");
  lin.t_warmup = Time::batches(10);
  EXPECT_DOUBLE_EQ(at_batch(lin, 55), 0.5);
  SchedulerOptions cw = named("constant_with_warmup");
  cw.t_warmup = Time::batches(4);
  cw.alpha = 0.5;
  EXPECT_DOUBLE_EQ(at_batch(cw, 2), 0.25);  // warmup ramps to alpha
  EXPECT_DOUBLE_EQ(at_batch(cw, 10), 0.5);
  SchedulerOptions poly = named("polynomial");
  poly.power = 2;
  EXPECT_DOUBLE_EQ(at_batch(poly, 50), 0.25);
  SchedulerOptions linear = named("linear");
  linear.alpha_i = 1.0;
  linear.alpha_f = 0.5;
  EXPECT_DOUBLE_EQ(at_batch(linear, 50), 0.75);
  EXPECT_DOUBLE_EQ(at_batch(linear, 200), 0.5);  // clipped at t_max
}

TEST(Scheduler, StepMultistepExponential) {
  SchedulerOptions step = named("step");
  step.step_size = Time::batches(10);
  step.gamma = 0.5;
  EXPECT_DOUBLE_EQ(at_batch(step, 25), 0.25);
  SchedulerOptions ms = named("multistep");
  ms.milestones = {Time::batches(10), Time::batches(20)};
  EXPECT_DOUBLE_EQ(at_batch(ms, 9), 1.0);
  EXPECT_NEAR(at_batch(ms, 20), 0.01, 1e-15);
  SchedulerOptions ex = named("exponential");
  ex.gamma = 0.5;
  ex.decay_period = Time::batches(10);
  EXPECT_DOUBLE_EQ(at_batch(ex, 5), std::sqrt(0.5));
}

TEST(Scheduler, CosineWarmRestarts) {
  SchedulerOptions o = named("cosine_warm_restarts");
  o.t_0 = Time::batches(10);
  o.t_mult = 2;
  EXPECT_DOUBLE_EQ(at_batch(o, 5), 0.5);
  EXPECT_DOUBLE_EQ(at_batch(o, 10), 1.0);  // a restart: the second interval is 20 batches long
  EXPECT_NEAR(at_batch(o, 20), 0.5, 1e-12);
  EXPECT_DOUBLE_EQ(at_batch(o, 30), 1.0);
  o.t_mult = 0.5;
  EXPECT_THROW(at_batch(o, 30), std::invalid_argument);  // 10, 5, 2, 1, 0: decayed to nothing
}

TEST(Scheduler, InverseSquareRootWithWarmup) {
  SchedulerOptions o = named("inv_sqrt_with_warmup");
  o.t_warmup = Time::batches(10);
  o.t_scale = Time::batches(10);
  o.t_cooldown = Time::batches(20);
  EXPECT_DOUBLE_EQ(at_batch(o, 5), 0.5);
  EXPECT_DOUBLE_EQ(at_batch(o, 10), 1.0);
  EXPECT_DOUBLE_EQ(at_batch(o, 40), 0.5);
  EXPECT_NEAR(at_batch(o, 90), 0.5 / std::sqrt(8.0), 1e-12);  // halfway through the cooldown from 1/sqrt(8)
  EXPECT_DOUBLE_EQ(at_batch(o, 100), 0.0);
}

TEST(Scheduler, ChecksAreTheEntrysFacts) {
  // Composer checks t_max against max_duration for the *_with_warmup decays only.
  for (const char* name : {"cosine_with_warmup", "linear_decay_with_warmup", "polynomial_with_warmup"}) {
    SchedulerOptions o = named(name);
    o.t_max = Time::batches(50);
    EXPECT_NE(check_schedule(o, Time::batches(100)).find("scheduler.t_max (50ba) is shorter"), std::string::npos)
        << name;
    EXPECT_EQ(check_schedule(o, Time::batches(50)), "") << name;
    EXPECT_EQ(check_schedule(o, Time::parse("100000tok")), "") << name;  // another unit: not comparable, as in Composer
  }
  SchedulerOptions cosine = named("cosine");
  cosine.t_max = Time::batches(50);
  EXPECT_EQ(check_schedule(cosine, Time::batches(100)), "");
  // inv_sqrt_with_warmup's times must be in max_duration's unit.
  SchedulerOptions inv = named("inv_sqrt_with_warmup");
  inv.t_warmup = Time::batches(10);
  inv.t_scale = Time::batches(10);
  inv.t_cooldown = Time::parse("2048tok");
  EXPECT_NE(check_schedule(inv, Time::batches(100)).find("scheduler.t_cooldown (2048tok) must be in max_duration's"),
            std::string::npos);
  inv.t_cooldown = Time::batches(20);
  EXPECT_EQ(check_schedule(inv, Time::batches(100)), "");
  // A registered research schedule's own check runs too.
  struct Short : Scheduler {
    double multiplier(const ScheduleClock&) const override { return 1.0; }
    std::string check(const Time& max_duration) const override {
      return max_duration.value() > 10 ? "too long for this schedule" : "";
    }
  };
  scheduler_registry().add(
      "test_checks_short",
      [](config::Section& s) {
        SchedulerOptions o;
        o.name = "test_checks_short";
        s.finish();
        return o;
      },
      [](const SchedulerOptions&) { return std::make_shared<const Short>(); });
  EXPECT_EQ(check_schedule(named("test_checks_short"), Time::batches(100)), "too long for this schedule");
  EXPECT_EQ(check_schedule(named("test_checks_short"), Time::batches(5)), "");
}

}  // namespace
}  // namespace tessera::optim
