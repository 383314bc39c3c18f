// Dry-run planning: batch arithmetic, model size and FLOPs, per-rank memory for each sharding strategy.
#include "tessera/trainer/plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "tessera/util/error.h"

namespace tessera::trainer {

using core::Precision;
namespace {

std::string human_count(double n) {
  if (n >= 1e9) return fmt::format("{:.2f} B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.2f} M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.2f} K", n / 1e3);
  return fmt::format("{:.0f}", n);
}

std::string gib(double bytes) {
  return fmt::format("{:.2f} GiB", bytes / (1024.0 * 1024.0 * 1024.0));
}

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

}  // namespace

Plan make_plan(const TrainConfig& cfg, int64_t world_size, int64_t ranks_per_node) {
  if (world_size < 1) throw ConfigError("train", fmt::format("world size must be at least 1, got {}", world_size));
  Plan plan;
  plan.world_size = world_size;
  plan.ranks_per_node = std::clamp<int64_t>(ranks_per_node, 1, world_size);
  // The model on `meta`: shapes only, no memory, whatever its size.
  const std::shared_ptr<models::CausalLM> model = models::model_registry().build(cfg.model.name, cfg.model, "meta", 0);
  plan.model = model->describe();
  plan.n_params = model->num_params();
  plan.seq_len = cfg.train_loader.tokens.max_seq_len;
  plan.flops_per_token = model->flops_per_token(plan.seq_len);
  plan.tokens_per_step = cfg.global_train_batch_size * plan.seq_len;
  if (cfg.global_train_batch_size % world_size != 0) {
    throw ConfigError("recipe", fmt::format("{}: global_train_batch_size ({}) is not divisible by the world size ({})",
                                            cfg.recipe_path, cfg.global_train_batch_size, world_size));
  }
  plan.device_train_batch_size = cfg.global_train_batch_size / world_size;
  plan.auto_microbatch = cfg.device_train_microbatch_size.automatic;
  // For memory estimates under `auto`, assume the whole device batch at once (auto starts there and halves on OOM).
  const int64_t mb = plan.auto_microbatch
                         ? plan.device_train_batch_size
                         : std::min(cfg.device_train_microbatch_size.samples, plan.device_train_batch_size);
  if (!plan.auto_microbatch) {
    plan.microbatch_size = mb;
    plan.microbatches_per_step = (plan.device_train_batch_size + mb - 1) / mb;
    for (int64_t left = plan.device_train_batch_size; left > 0; left -= mb) {
      plan.microbatch_sizes.push_back(std::min(left, mb));
    }
  }
  const bool mixed = cfg.precision != Precision::kFp32;
  const int act_bytes = mixed ? 2 : 4;
  const int64_t unit = model->largest_unit_params();
  // A model that does not estimate its activations counts none (the plan says so).
  const double act = model->activation_bytes(mb, plan.seq_len, act_bytes, false).value_or(0);
  const double act_ckpt = model->activation_bytes(mb, plan.seq_len, act_bytes, true).value_or(0);
  for (auto strategy :
       {dist::ShardingStrategy::kNoShard, dist::ShardingStrategy::kShardGradOp, dist::ShardingStrategy::kFullShard}) {
    plan.memory.push_back({strategy,
                           dist::state_memory_per_rank(plan.n_params, strategy, world_size, plan.ranks_per_node, mixed,
                                                       cfg.optimizer.state_tensors(), unit),
                           act, act_ckpt});
  }
  return plan;
}

std::string render_plan(const TrainConfig& cfg, const Plan& plan, const std::string& device_line) {
  std::string out;
  auto line = [&out](std::string_view label, const std::string& value) {
    out += fmt::format("  {:<26}{}\n", label, value);
  };
  out += fmt::format("Plan for {} (run {})\n", cfg.recipe_path, cfg.run_name);
  line("devices", device_line);
  line("world size", fmt::format("{} ({} per node)", plan.world_size, plan.ranks_per_node));
  line("model", plan.model);
  line("parameters",
       fmt::format("{} ({})", with_commas(plan.n_params), human_count(static_cast<double>(plan.n_params))));
  line("FLOPs per token",
       fmt::format("{:.4g} GFLOP (6N + 12 L d S, S = {})", plan.flops_per_token / 1e9, plan.seq_len));
  line("FLOPs per step",
       fmt::format("{:.4g} PFLOP", plan.flops_per_token * static_cast<double>(plan.tokens_per_step) / 1e15));
  line("precision", to_string(cfg.precision));
  line("optimizer",
       fmt::format("{} (lr {:g}), scheduler {}", cfg.optimizer.name, cfg.optimizer.lr, cfg.scheduler.name));
  line("max duration", cfg.max_duration.str());
  line("global batch", fmt::format("{} sequences = {} tokens per optimizer step", cfg.global_train_batch_size,
                                   with_commas(plan.tokens_per_step)));
  line("device batch", fmt::format("{} sequences per rank", plan.device_train_batch_size));
  if (plan.auto_microbatch) {
    line("microbatches", "auto (start at the device batch, halve on out-of-memory)");
  } else {
    line("microbatches", fmt::format("{} per step of {} sequences{}", plan.microbatches_per_step, plan.microbatch_size,
                                     plan.microbatch_sizes.back() != plan.microbatch_size
                                         ? fmt::format(" (last {})", plan.microbatch_sizes.back())
                                         : ""));
  }
  std::vector<std::string> names;
  for (const auto* list : {&cfg.algorithms, &cfg.callbacks, &cfg.loggers}) {
    for (const auto& c : *list) names.push_back(c.name);
  }
  if (!names.empty()) line("components", fmt::format("{}", fmt::join(names, ", ")));
  const int64_t mb = plan.auto_microbatch ? plan.device_train_batch_size : plan.microbatch_size;
  const bool mixed = cfg.precision != Precision::kFp32;
  const int states = cfg.optimizer.state_tensors();
  out += fmt::format(
      "  memory per rank (estimate: {}+{}+{} bytes per parameter for params+grads+optimizer as in ZeRO; "
      "activations for a microbatch of {}):\n",
      mixed ? 2 : 4, mixed ? 2 : 4, (mixed ? 4 : 0) + 4 * states, mb);
  out += fmt::format("    {:<15}{:>12}{:>12}{:>12}{:>12}{:>14}{:>14}{:>13}{:>13}\n", "strategy", "params", "grads",
                     "optimizer", "gathered", "activations", "act. ckpt", "total", "total ckpt");
  for (const MemoryRow& r : plan.memory) {
    const bool configured = cfg.fsdp_configured && cfg.fsdp.strategy == r.strategy;
    out += fmt::format("  {} {:<15}{:>12}{:>12}{:>12}{:>12}{:>14}{:>14}{:>13}{:>13}\n", configured ? "*" : " ",
                       dist::to_string(r.strategy), gib(r.state.params), gib(r.state.grads), gib(r.state.optimizer),
                       gib(r.state.transient), gib(r.activations), gib(r.activations_ckpt),
                       gib(r.state.total() + r.activations), gib(r.state.total() + r.activations_ckpt));
  }
  if (cfg.fsdp_configured) {
    out += fmt::format("    * = fsdp_config.sharding_strategy; activation checkpointing is {}\n",
                       cfg.fsdp.activation_checkpointing ? "on (use the ckpt columns)" : "off");
  }
  return out;
}

}  // namespace tessera::trainer
