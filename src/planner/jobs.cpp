// Jobs files and the profile of each job's recipe.
#include "tessera/planner/jobs.h"

#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "tessera/config/reader.h"
#include "tessera/config/time.h"
#include "tessera/config/value.h"
#include "tessera/config/yaml_file.h"
#include "tessera/models/causal_lm.h"
#include "tessera/trainer/plan.h"
#include "tessera/trainer/train_config.h"
#include "tessera/util/error.h"

namespace tessera::planner {
namespace {

namespace fs = std::filesystem;

// Relative recipe paths: the jobs file's folder first, then the working directory.
std::string resolve_recipe(config::Section& s, const std::string& recipe, const fs::path& jobs_dir) {
  const fs::path given(recipe);
  if (given.is_absolute()) {
    s.check(fs::exists(given), "recipe", fmt::format("{} does not exist", recipe));
    return recipe;
  }
  if (fs::exists(jobs_dir / given)) return (jobs_dir / given).lexically_normal().string();
  if (fs::exists(given)) return recipe;
  s.fail("recipe", fmt::format("{} exists neither in {} nor in the working directory", recipe,
                               jobs_dir.empty() ? std::string(".") : jobs_dir.string()));
}

// Optimizer steps in `t` for the job `p` (its batch and tokens per step known); 0 for epochs and wall time.
int64_t steps_of(const config::Time& t, const JobProfile& p) {
  switch (t.unit()) {
    case config::TimeUnit::kBatch:
      return t.count();
    case config::TimeUnit::kSample:
      return (t.count() + p.global_batch - 1) / p.global_batch;
    case config::TimeUnit::kToken:
      return static_cast<int64_t>(std::ceil(t.value() / p.tokens_per_step()));
    default:
      return 0;
  }
}

// A deadline: seconds as a number, or a number with a unit: s, m (min), h or d.
double parse_deadline(config::Section& s, const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    s.fail("deadline", fmt::format("\"{}\" is not a time (a number of seconds, or with a unit: 90m, 2h, 1d)", text));
  }
  const std::string unit = text.substr(used);
  double scale = 0;
  if (unit.empty() || unit == "s") scale = 1;
  if (unit == "m" || unit == "min") scale = 60;
  if (unit == "h") scale = 3600;
  if (unit == "d") scale = 86400;
  s.check(scale > 0, "deadline", fmt::format("\"{}\": unknown unit \"{}\" (s, m, h or d)", text, unit));
  s.check(std::isfinite(value) && value > 0, "deadline", fmt::format("\"{}\" must be a positive time", text));
  return value * scale;
}

}  // namespace

std::vector<JobSpec> load_jobs(const std::string& path) {
  const config::Value root = config::load_yaml_file(path, "plan", "jobs file");
  config::ParseContext ctx(path);
  config::Section top(&root, "", ctx);
  const config::Value* list = top.raw("jobs");
  top.check(list != nullptr && list->is_sequence() && !list->items().empty(), "jobs",
            "must be a non-empty list of jobs ({name, recipe, overrides, max_duration, weight, deadline, max_nodes})");
  top.finish();
  const fs::path dir = fs::path(path).parent_path();
  std::vector<JobSpec> jobs;
  std::set<std::string> names;
  for (size_t i = 0; i < list->items().size(); ++i) {
    config::Section s(&list->items()[i], fmt::format("jobs[{}]", i), ctx);
    s.reject_unknown({"name", "recipe", "overrides", "max_duration", "weight", "deadline", "max_nodes"});
    JobSpec j;
    j.recipe = resolve_recipe(s, s.require_string("recipe"), dir);
    j.name = s.get_string("name", fmt::format("{}-{}", fs::path(j.recipe).stem().string(), i));
    s.check(names.insert(j.name).second, "name", fmt::format("'{}' names two jobs", j.name));
    j.overrides = s.get_strings("overrides", {});
    j.max_duration = s.get_string("max_duration", "");
    j.weight = s.get_double("weight", 1);
    s.check(j.weight > 0, "weight", "must be positive");
    if (const std::optional<std::string> deadline = s.get_optional_string("deadline")) {
      j.deadline_s = parse_deadline(s, *deadline);
    }
    j.max_nodes = s.get_int("max_nodes", 1);
    s.check(j.max_nodes >= 1, "max_nodes", "must be at least 1");
    s.finish();
    jobs.push_back(std::move(j));
  }
  ctx.throw_if_unsupported();
  return jobs;
}

JobProfile profile_config(const trainer::TrainConfig& cfg, const std::string& name) {
  // The job as one device runs it; the tensor- and context-parallel degrees the model allows are measured below.
  trainer::TrainConfig one = cfg;
  one.fsdp.tensor_parallel_degree = 1;
  one.fsdp.context_parallel_degree = 1;
  const trainer::Plan plan = trainer::make_plan(one, 1, 1);
  JobProfile p;
  const std::shared_ptr<models::CausalLM> model = models::model_registry().build(cfg.model.name, cfg.model, "meta", 0);
  for (int64_t t = 2; t <= 64; t *= 2) {
    trainer::TensorSplit split;
    try {
      split = trainer::measure_tensor_split(*model, t);
    } catch (const ConfigError&) {
      continue;  // the model's heads or MLP do not divide into t
    }
    if (split.params == 0) break;  // no split layers declared
    p.tensor_parallel_degrees.push_back(t);
    p.tensor_split = {t, split.params, split.largest_unit_params};
    p.tensor_parallel_layers = split.layers;
    p.d_model = split.d_model;
  }
  if (model->supports_context_parallel()) {
    for (int64_t c = 2; c <= 64 && plan.seq_len % (2 * c) == 0; c *= 2) p.context_parallel_degrees.push_back(c);
  }
  p.name = name;
  p.n_params = plan.n_params;
  p.largest_unit_params = plan.largest_unit_params;
  p.experts = plan.experts;
  p.moe_layers = plan.moe_layers;
  if (plan.tokens_per_step > 0)
    p.all_to_all_bytes_per_token = plan.all_to_all_bytes / static_cast<double>(plan.tokens_per_step);
  p.flops_per_token = plan.flops_per_token;
  p.seq_len = plan.seq_len;
  p.global_batch = cfg.global_train_batch_size;
  p.mixed_precision = cfg.precision != core::Precision::kFp32;
  p.optimizer_state_tensors = cfg.optimizer.state_tensors;
  // The plan's activations are for one microbatch of the whole batch (auto) or the recipe's microbatch size.
  const int64_t mb = plan.auto_microbatch ? plan.device_train_batch_size : plan.microbatch_size;
  if (!plan.memory.empty() && mb > 0) {
    p.activation_bytes_per_sample = plan.memory.front().activations / static_cast<double>(mb);
    p.activation_bytes_per_sample_ckpt = plan.memory.front().activations_ckpt / static_cast<double>(mb);
  }
  p.steps = steps_of(cfg.max_duration, p);  // 0 for epochs: unknown without the dataset's size
  // `plan --run` always gives a job a save_folder, so it checkpoints at the recipe's save_interval.
  p.save_interval_steps = steps_of(cfg.save.interval, p);
  return p;
}

JobProfile profile_job(const JobSpec& spec) {
  std::vector<std::string> overrides = spec.overrides;
  if (!spec.max_duration.empty()) overrides.push_back("max_duration=" + spec.max_duration);
  const trainer::TrainConfig cfg = trainer::load_train_config(spec.recipe, overrides);
  JobProfile p = profile_config(cfg, spec.name);
  p.weight = spec.weight;
  p.max_nodes = spec.max_nodes;
  p.deadline_s = spec.deadline_s;
  const config::Time& d = cfg.max_duration;
  if (d.unit() != config::TimeUnit::kBatch && d.unit() != config::TimeUnit::kSample &&
      d.unit() != config::TimeUnit::kToken) {
    throw ConfigError("plan", fmt::format("job {}: {}: max_duration {} is not in ba, sp or tok (the planner cannot "
                                          "know how many steps an epoch is); give one in the jobs file",
                                          spec.name, spec.recipe, d.str()));
  }
  if (p.steps <= 0) {
    throw ConfigError("plan",
                      fmt::format("job {}: {}: max_duration {} trains no step", spec.name, spec.recipe, d.str()));
  }
  return p;
}

}  // namespace tessera::planner
