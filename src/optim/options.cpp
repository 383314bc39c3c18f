// Parsing of optimizer and scheduler sections (Composer / LLM Foundry names and defaults).
#include "tessera/optim/options.h"

#include <fmt/format.h>

#include "tessera/optim/optimizer.h"
#include "tessera/optim/scheduler.h"

namespace tessera::optim {
namespace {

using config::Section;
using config::Time;
using config::TimeUnit;

OptimizerOptions parse_adam(Section& s, const std::string& name, double lr, std::vector<double> betas, double wd) {
  OptimizerOptions o;
  o.name = name;
  o.class_name = name == "decoupled_adamw" ? "DecoupledAdamW" : "AdamW";
  o.state_tensors = 2;
  o.lr = s.get_double("lr", lr);
  s.check(o.lr >= 0, "lr", "must be non-negative");
  o.betas = s.get_doubles("betas", std::move(betas), 2);
  for (double b : o.betas) s.check(b >= 0 && b < 1, "betas", "each beta must lie in [0, 1)");
  o.eps = s.get_double("eps", 1e-8);
  s.check(o.eps > 0, "eps", "must be positive");
  o.weight_decay = s.get_double("weight_decay", wd);
  s.check(o.weight_decay >= 0, "weight_decay", "must be non-negative");
  if (s.get_bool("amsgrad", false)) s.not_supported("amsgrad", "true");
  for (const char* key : {"foreach", "fused"}) {
    s.python_only(key, "it picks PyTorch's optimizer kernels (one per tensor, multi-tensor or fused)");
  }
  s.finish({"maximize", "capturable", "differentiable"});
  return o;
}

OptimizerOptions parse_lion(Section& s) {
  OptimizerOptions o;
  o.name = "decoupled_lionw";
  o.class_name = "DecoupledLionW";
  o.state_tensors = 1;  // the momentum
  o.lr = s.get_double("lr", 1e-4);
  s.check(o.lr >= 0, "lr", "must be non-negative");
  o.betas = s.get_doubles("betas", {0.9, 0.99}, 2);
  for (double b : o.betas) s.check(b >= 0 && b <= 1, "betas", "each beta must lie in [0, 1]");
  o.weight_decay = s.get_double("weight_decay", 0.0);
  s.check(o.weight_decay >= 0, "weight_decay", "must be non-negative");
  s.finish();
  return o;
}

OptimizerOptions parse_sgdw(Section& s) {
  OptimizerOptions o;
  o.name = "decoupled_sgdw";
  o.lr = s.require_double("lr");
  s.check(o.lr >= 0, "lr", "must be non-negative");
  o.momentum = s.get_double("momentum", 0.0);
  o.dampening = s.get_double("dampening", 0.0);
  o.weight_decay = s.get_double("weight_decay", 0.0);
  o.nesterov = s.get_bool("nesterov", false);
  s.check(o.momentum >= 0, "momentum", "must be non-negative");
  s.check(!o.nesterov || (o.momentum > 0 && o.dampening == 0), "nesterov", "needs momentum > 0 and dampening == 0");
  o.class_name = "DecoupledSGDW";
  o.state_tensors = o.momentum > 0 ? 1 : 0;  // the momentum buffer
  s.finish();
  return o;
}

// A warmup duration or t_max: Composer rejects `ep` units for these.
Time schedule_time(Section& s, std::string_view key, Time fallback, bool required = false) {
  Time t = required ? s.require_time(key, TimeUnit::kBatch) : s.get_time(key, fallback, TimeUnit::kBatch);
  s.check(t.unit() != TimeUnit::kEpoch || key == "decay_period", key,
          "scheduler times may not be in epochs; use ba, sp, tok or dur");
  return t;
}

std::vector<Time> milestones(Section& s) {
  const config::Value* v = s.raw("milestones");
  if (v == nullptr) s.fail("milestones", "missing required key");
  if (!v->is_sequence() || v->items().empty()) s.fail("milestones", "expected a list of durations such as [100ba]");
  std::vector<Time> out;
  for (const config::Value& item : v->items()) {
    try {
      out.push_back(Time::parse(item.text()));
    } catch (const std::invalid_argument& e) {
      s.fail("milestones", e.what());
    }
  }
  return out;
}

using SchedulerParser = void (*)(Section&, SchedulerOptions&);

void warmup_fields(Section& s, SchedulerOptions& o) {
  o.t_warmup = schedule_time(s, "t_warmup", o.t_warmup, /*required=*/true);
  o.scale_warmup = s.get_bool("scale_warmup", false);
}

void add_scheduler(SchedulerRegistry& r, const std::string& name, SchedulerParser fields) {
  r.add(
      name,
      [name, fields](Section& s) {
        SchedulerOptions o;
        o.name = name;
        fields(s, o);
        s.check(o.alpha_f >= 0, "alpha_f", "must be non-negative");
        s.finish();
        return o;
      },
      detail::builtin_scheduler);
}

}  // namespace

OptimizerRegistry& optimizer_registry() {
  static OptimizerRegistry* registry = [] {
    auto* r = new OptimizerRegistry("optimizer");
    r->add(
        "decoupled_adamw",
        [](Section& s) {
          return parse_adam(s, "decoupled_adamw", 1e-3, {0.9, 0.95}, 1e-5);
        },
        [](const OptimizerOptions& o, std::vector<at::Tensor> p) { return detail::make_adam(o, std::move(p), true); });
    r->add(
        "adamw",
        [](Section& s) {
          return parse_adam(s, "adamw", 1e-3, {0.9, 0.999}, 1e-2);
        },
        [](const OptimizerOptions& o, std::vector<at::Tensor> p) { return detail::make_adam(o, std::move(p), false); });
    r->add("decoupled_lionw", parse_lion, detail::make_lion);
    r->add("decoupled_sgdw", parse_sgdw, detail::make_sgdw);
    r->add_foundry_names({"clip_lion", "adalr_lion", "no_op", "decoupled_adamw_bnb"});
    return r;
  }();
  return *registry;
}

SchedulerRegistry& scheduler_registry() {
  static SchedulerRegistry* registry = [] {
    auto* r = new SchedulerRegistry("scheduler");
    add_scheduler(*r, "constant", [](Section& s, SchedulerOptions& o) {
      o.alpha = s.get_double("alpha", 1.0);
      o.t_max = schedule_time(s, "t_max", o.t_max);
    });
    add_scheduler(*r, "linear", [](Section& s, SchedulerOptions& o) {
      o.alpha_i = s.get_double("alpha_i", 1.0);
      o.alpha_f = s.get_double("alpha_f", 0.0);
      o.t_max = schedule_time(s, "t_max", o.t_max);
    });
    add_scheduler(*r, "cosine", [](Section& s, SchedulerOptions& o) {
      o.t_max = schedule_time(s, "t_max", o.t_max);
      o.alpha_f = s.get_double("alpha_f", 0.0);
    });
    add_scheduler(*r, "cosine_warm_restarts", [](Section& s, SchedulerOptions& o) {
      o.t_0 = schedule_time(s, "t_0", o.t_0, true);
      o.t_mult = s.get_double("t_mult", 1.0);
      o.alpha_f = s.get_double("alpha_f", 0.0);
      s.check(!o.t_0.is_zero(), "t_0", "must be positive");
    });
    add_scheduler(*r, "polynomial", [](Section& s, SchedulerOptions& o) {
      o.power = s.require_double("power");
      o.t_max = schedule_time(s, "t_max", o.t_max);
      o.alpha_f = s.get_double("alpha_f", 0.0);
    });
    add_scheduler(*r, "step", [](Section& s, SchedulerOptions& o) {
      o.step_size = schedule_time(s, "step_size", o.step_size, true);
      o.gamma = s.get_double("gamma", 0.1);
      s.check(!o.step_size.is_zero(), "step_size", "must be positive");
    });
    add_scheduler(*r, "multistep", [](Section& s, SchedulerOptions& o) {
      o.milestones = milestones(s);
      o.gamma = s.get_double("gamma", 0.1);
    });
    add_scheduler(*r, "exponential", [](Section& s, SchedulerOptions& o) {
      o.gamma = s.require_double("gamma");
      o.decay_period = schedule_time(s, "decay_period", o.decay_period);
    });
    add_scheduler(*r, "multistep_with_warmup", [](Section& s, SchedulerOptions& o) {
      warmup_fields(s, o);
      o.milestones = milestones(s);
      o.gamma = s.get_double("gamma", 0.1);
    });
    add_scheduler(*r, "constant_with_warmup", [](Section& s, SchedulerOptions& o) {
      warmup_fields(s, o);
      o.alpha = s.get_double("alpha", 1.0);
      o.t_max = schedule_time(s, "t_max", o.t_max);
    });
    add_scheduler(*r, "linear_decay_with_warmup", [](Section& s, SchedulerOptions& o) {
      warmup_fields(s, o);
      o.alpha_i = s.get_double("alpha_i", 1.0);
      o.alpha_f = s.get_double("alpha_f", 0.0);
      o.t_max = schedule_time(s, "t_max", o.t_max);
    });
    add_scheduler(*r, "cosine_with_warmup", [](Section& s, SchedulerOptions& o) {
      warmup_fields(s, o);
      o.t_max = schedule_time(s, "t_max", o.t_max);
      o.alpha_f = s.get_double("alpha_f", 0.0);
    });
    add_scheduler(*r, "polynomial_with_warmup", [](Section& s, SchedulerOptions& o) {
      warmup_fields(s, o);
      o.power = s.get_double("power", 2.0);
      o.t_max = schedule_time(s, "t_max", o.t_max);
      o.alpha_f = s.get_double("alpha_f", 0.0);
    });
    // LLM Foundry's InverseSquareRootWithWarmupScheduler: t_warmup, t_scale and t_cooldown in max_duration's unit.
    add_scheduler(*r, "inv_sqrt_with_warmup", [](Section& s, SchedulerOptions& o) {
      o.t_warmup = schedule_time(s, "t_warmup", o.t_warmup, true);
      o.t_scale = schedule_time(s, "t_scale", o.t_scale, true);
      o.t_cooldown = schedule_time(s, "t_cooldown", o.t_cooldown, true);
      for (const auto& [key, t] :
           {std::pair{"t_warmup", o.t_warmup}, {"t_scale", o.t_scale}, {"t_cooldown", o.t_cooldown}}) {
        s.check(t.unit() != TimeUnit::kDuration, key, "cannot be in units of `dur`; use max_duration's unit");
      }
      s.check(!o.t_scale.is_zero(), "t_scale", "must be positive");
      o.t_max = schedule_time(s, "t_max", o.t_max);
      o.alpha_f_decay = s.get_double("alpha_f_decay", 0.0);
      o.alpha_f_cooldown = s.get_double("alpha_f_cooldown", 0.0);
      s.check(o.alpha_f_decay >= o.alpha_f_cooldown, "alpha_f_cooldown", "must not exceed alpha_f_decay");
    });
    return r;
  }();
  return *registry;
}

}  // namespace tessera::optim
