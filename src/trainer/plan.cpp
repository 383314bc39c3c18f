// Dry-run planning: batch arithmetic, model size and FLOPs, per-rank memory for each sharding strategy.
#include "tessera/trainer/plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fcntl.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "tessera/distributed/expert_parallel.h"
#include "tessera/distributed/parallel_styles.h"
#include "tessera/models/capabilities.h"
#include "tessera/storage/storage.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"
#include "tessera/util/peak_flops.h"

namespace tessera::trainer {

namespace fs = std::filesystem;
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

// "42 s", "3.5 min", "7.2 h", "12.4 d", "3.1 y".
std::string human_seconds(double s) {
  if (s < 60) return fmt::format("{:.3g} s", s);
  if (s < 3600) return fmt::format("{:.3g} min", s / 60);
  if (s < 86400) return fmt::format("{:.3g} h", s / 3600);
  if (s < 365.25 * 86400) return fmt::format("{:.3g} d", s / 86400);
  return fmt::format("{:.3g} y", s / (365.25 * 86400));
}

void check_costs(const CheckpointCosts& c) {
  if (!(c.mtbf_seconds > 0) || !(c.step_seconds > 0) || !(c.save_seconds >= 0) || !(c.blocking_seconds >= 0)) {
    throw ConfigError("train", fmt::format("checkpoint advice needs a positive MTBF and step time and non-negative "
                                           "save times (got MTBF {} s, step {} s, save {} s, blocking {} s)",
                                           c.mtbf_seconds, c.step_seconds, c.save_seconds, c.blocking_seconds));
  }
}

}  // namespace

double checkpoint_overhead(const CheckpointCosts& c, int64_t interval_batches) {
  check_costs(c);
  // Each segment trains `interval` steps and then blocks for one save. A failure (rate 1/M) loses on average half a
  // segment; with asynchronous saves also the save still being written, as the newest checkpoint is then the one
  // before it.
  const double segment = static_cast<double>(std::max<int64_t>(1, interval_batches)) * c.step_seconds;
  // An asynchronous save waits for the previous one: a segment shorter than a save blocks for the difference too.
  const double blocking = c.blocking_seconds + (c.async ? std::max(0.0, c.save_seconds - segment) : 0.0);
  const double period = segment + blocking;
  const double rework = period / 2 + (c.async ? c.save_seconds : 0.0);
  return std::min(1.0, blocking / period + rework / c.mtbf_seconds);
}

CheckpointAdvice advise_checkpoint_interval(const CheckpointCosts& c) {
  check_costs(c);
  CheckpointAdvice a;
  const double delta = std::max(c.blocking_seconds, 1e-9), m = c.mtbf_seconds;
  a.young_seconds = std::sqrt(2 * delta * m);
  if (delta < 2 * m) {
    const double r = delta / (2 * m);
    a.daly_seconds = a.young_seconds * (1 + std::sqrt(r) / 3 + r / 9) - delta;
  } else {
    a.daly_seconds = m;
  }
  a.interval_batches = std::max<int64_t>(1, std::llround(a.daly_seconds / c.step_seconds));
  if (c.async) {  // a save every segment: the segment must at least cover one whole write
    a.interval_batches = std::max(a.interval_batches, static_cast<int64_t>(std::ceil(c.save_seconds / c.step_seconds)));
  }
  a.overhead_fraction = checkpoint_overhead(c, a.interval_batches);
  const double segment = static_cast<double>(a.interval_batches) * c.step_seconds;
  a.lost_per_failure_seconds = segment / 2 + (c.async ? c.save_seconds : 0.0);
  return a;
}

double checkpoint_bytes_per_rank(const TrainConfig& cfg, const Plan& plan, dist::ShardingStrategy strategy) {
  const int states = cfg.save.weights_only ? 0 : cfg.optimizer.state_tensors;
  const double total = static_cast<double>(plan.n_params) * 4.0 * (1 + states);
  switch (strategy) {
    case dist::ShardingStrategy::kNoShard:
      return total;  // rank 0 stores the one copy
    case dist::ShardingStrategy::kHybridShard:
      return total / static_cast<double>(plan.ranks_per_node);  // the first node's ranks store it
    default:
      return total / static_cast<double>(plan.world_size);
  }
}

TensorSplit measure_tensor_split(const models::CausalLM& model, int64_t degree) {
  TensorSplit out;
  std::map<std::string, at::Tensor> params;
  for (const auto& item : model.named_parameters()) params[item.key()] = item.value();
  std::map<int64_t, int64_t> per_unit;
  const std::string key = fmt::format("parallelism.tensor_parallel_degree {}", degree);
  const auto splits =
      dist::tensor_parallel_splits(model, dist::tensor_parallel_plan_of(model, degree, key), degree, key);
  for (const auto& [name, s] : splits) {
    const at::Tensor& w = params.at(s.param);
    out.params += w.numel();
    per_unit[model.unit_of_parameter(s.param)] += w.numel();
    if (s.dim == 1) out.d_model = w.size(0);
  }
  for (const auto& [unit, n] : per_unit) out.largest_unit_params = std::max(out.largest_unit_params, n);
  // The layers whose outputs are all-reduced: the decoder layers (unit 0's split head and embedding are not).
  out.layers = static_cast<int64_t>(per_unit.size()) - (per_unit.count(0) > 0 ? 1 : 0);
  return out;
}

Plan make_plan(const TrainConfig& cfg, int64_t world_size, int64_t ranks_per_node) {
  if (world_size < 1) throw ConfigError("train", fmt::format("world size must be at least 1, got {}", world_size));
  Plan plan;
  plan.world_size = world_size;
  plan.ranks_per_node = std::clamp<int64_t>(ranks_per_node, 1, world_size);
  // Pipeline stages: the outermost mesh dimension; the rest of the mesh is a stage's.
  plan.pipeline_degree = cfg.fsdp.pipeline_degree();
  if (world_size % plan.pipeline_degree != 0) {
    throw ConfigError("recipe", fmt::format("{}: parallelism.pipeline_parallel_degree {} does not divide the world "
                                            "size ({})",
                                            cfg.recipe_path, plan.pipeline_degree, world_size));
  }
  const int64_t stage_world = world_size / plan.pipeline_degree;
  // fsdp_config's data-parallel mesh (Composer's degrees), checked as the trainer checks it.
  plan.shard_group =
      dist::shard_group_size(dist::sharding_for_world(cfg.fsdp, stage_world), stage_world, plan.ranks_per_node);
  // The model on `meta`: shapes only, no memory, whatever its size.
  const std::shared_ptr<models::CausalLM> model = models::model_registry().build(cfg.model.name, cfg.model, "meta", 0);
  plan.model = model->describe();
  plan.n_params = model->num_params();
  plan.n_active_params = models::active_params(*model);
  plan.seq_len = cfg.train_loader.tokens.max_seq_len;
  plan.flops_per_token = model->flops_per_token(plan.seq_len);
  plan.tokens_per_step = cfg.global_train_batch_size * plan.seq_len;
  // Tensor- and context-parallel groups read one batch each, as do the pipeline stages: the batch divides over the
  // data-parallel ranks.
  const int64_t tp = cfg.fsdp.tensor_parallel_degree, cp = cfg.fsdp.context_parallel_degree;
  const int64_t data_ranks = stage_world / (tp * cp);  // shard_group_size checked that T x C divides the stage
  if (cfg.global_train_batch_size % data_ranks != 0) {
    throw ConfigError(
        "recipe",
        fmt::format("{}: global_train_batch_size ({}) is not divisible by the {} ({})", cfg.recipe_path,
                    cfg.global_train_batch_size,
                    tp * cp > 1 ? "data-parallel ranks (world size / tensor x context-parallel degree)" : "world size",
                    data_ranks));
  }
  plan.device_train_batch_size = cfg.global_train_batch_size / data_ranks;
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
  plan.largest_unit_params = unit;
  // Expert parallelism: the MoE layers' expert weights and degree (the sharding engine splits them the same way).
  int64_t top_k = 0, d_model = 0;
  const dist::ExpertLayers expert_layers = dist::find_expert_layers(*model, cfg.fsdp.expert_parallel_degree);
  for (const dist::ExpertLayer& l : expert_layers.layers) {
    const auto params = l.module->named_parameters();
    int64_t weights = 0;  // the expert weights the engine splits (shapes only: the model is on `meta`)
    for (const std::string& name : l.capability->expert_weight_names()) weights += params[name].numel();
    for (const auto& expert : l.capability->expert_module_weights()) {
      for (const std::string& name : expert) weights += params[name].numel();
    }
    plan.experts.degree = expert_layers.degree;
    plan.experts.params += weights;
    plan.experts.largest_unit_params = std::max(plan.experts.largest_unit_params, weights);
    plan.moe_layers++;
    plan.num_experts = l.capability->num_experts();
    top_k = l.capability->experts_per_token();
    d_model = l.capability->token_width();
  }
  const int64_t ep = plan.experts.degree;
  if (ep > 1) {
    if (world_size % ep != 0) {
      plan.expert_parallel_problem =
          fmt::format("{} rank(s) do not split into expert-parallel groups of {}", world_size, ep);
    } else if (cfg.fsdp.strategy == dist::ShardingStrategy::kHybridShard && plan.shard_group < world_size &&
               plan.shard_group % ep != 0) {
      plan.expert_parallel_problem =
          fmt::format("HYBRID_SHARD's shard groups of {} ranks do not hold whole groups of {}", plan.shard_group, ep);
    }
    const int64_t tokens = plan.device_train_batch_size * plan.seq_len;
    const int bytes = cfg.precision != Precision::kFp32 ? 2 : 4;
    plan.all_to_all_bytes = dist::expert_all_to_all_bytes(tokens, top_k, d_model, plan.moe_layers, ep, bytes, false);
    plan.all_to_all_bytes_ckpt =
        dist::expert_all_to_all_bytes(tokens, top_k, d_model, plan.moe_layers, ep, bytes, true);
  }
  if (tp > 1) {
    const TensorSplit t = measure_tensor_split(*model, tp);
    if (t.params == 0) {
      throw ConfigError("recipe", fmt::format("{}: parallelism.tensor_parallel_degree {}: model family \"{}\" declares "
                                              "no tensor-parallel layers",
                                              cfg.recipe_path, tp, model->family()));
    }
    plan.tensor_split = {tp, t.params, t.largest_unit_params};
    plan.tensor_parallel_layers = t.layers;
    const int64_t tokens = plan.device_train_batch_size * plan.seq_len;
    plan.tensor_all_reduce_bytes =
        dist::tensor_parallel_all_reduce_bytes(tokens, t.d_model, t.layers, tp, act_bytes, false);
    plan.tensor_all_reduce_bytes_ckpt =
        dist::tensor_parallel_all_reduce_bytes(tokens, t.d_model, t.layers, tp, act_bytes, true);
  }
  if (cp > 1) {
    if (!model->supports_context_parallel()) {
      throw ConfigError("recipe",
                        fmt::format("{}: parallelism.context_parallel_degree {}: model family \"{}\" does not "
                                    "run on context shards",
                                    cfg.recipe_path, cp, model->family()));
    }
    if (plan.seq_len % (2 * cp) != 0) {
      throw ConfigError("recipe",
                        fmt::format("{}: parallelism.context_parallel_degree {}: a sequence of {} tokens does "
                                    "not cut into {} equal chunks (2 per rank)",
                                    cfg.recipe_path, cp, plan.seq_len, 2 * cp));
    }
    plan.context_parallel_degree = cp;
  }
  // The engine refuses NO_SHARD with expert or tensor parallelism; the split applies where the world holds whole
  // groups.
  const bool split = ep > 1 && plan.expert_parallel_problem.empty();
  // A model that does not estimate its activations counts none (the plan says so).
  // Under context parallelism a rank holds its positions' activations and its rows of the (S / C x S) mask.
  const int64_t rows = plan.seq_len / cp;  // a whole number: the checks above
  const double mask = cp > 1 ? static_cast<double>(mb * rows * plan.seq_len) * act_bytes : 0.0;
  const double act = model->activation_bytes(mb, plan.seq_len / cp, act_bytes, false).value_or(0) + mask;
  const double act_ckpt = model->activation_bytes(mb, plan.seq_len / cp, act_bytes, true).value_or(0) + mask;
  for (auto strategy :
       {dist::ShardingStrategy::kNoShard, dist::ShardingStrategy::kShardGradOp, dist::ShardingStrategy::kFullShard}) {
    if ((split || tp > 1) && strategy == dist::ShardingStrategy::kNoShard) continue;
    const dist::ExpertShare share = split ? plan.experts : tp > 1 ? plan.tensor_split : dist::ExpertShare{};
    plan.memory.push_back({strategy,
                           dist::state_memory_per_rank(plan.n_params, strategy, world_size, plan.ranks_per_node, mixed,
                                                       cfg.optimizer.state_tensors, unit, share),
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
  if (cfg.fsdp.shard_degree != -1 || cfg.fsdp.replicate_degree > 0) {
    const int64_t tp = cfg.fsdp.tensor_parallel_degree;
    line("data-parallel mesh",
         fmt::format("replicate {} x shard {}{} ({}.data_parallel_*_degree)",
                     plan.world_size / plan.pipeline_degree / plan.shard_group, plan.shard_group / tp,
                     tp > 1 ? fmt::format(" (x tensor {})", tp) : "", cfg.fsdp.mesh_keys));
  }
  line("model", plan.model);
  line("parameters",
       fmt::format("{} ({})", with_commas(plan.n_params), human_count(static_cast<double>(plan.n_params))));
  if (plan.n_active_params != plan.n_params) {
    line("active parameters", fmt::format("{} ({}) per token", with_commas(plan.n_active_params),
                                          human_count(static_cast<double>(plan.n_active_params))));
  }
  line("FLOPs per token", fmt::format("{:.4g} GFLOP (6N + 12 L d S, {}S = {})", plan.flops_per_token / 1e9,
                                      plan.n_active_params != plan.n_params ? "N active, " : "", plan.seq_len));
  line("FLOPs per step",
       fmt::format("{:.4g} PFLOP", plan.flops_per_token * static_cast<double>(plan.tokens_per_step) / 1e15));
  line("precision", cfg.precision_auto ? "auto (amp_bf16 on a GPU or a CPU with native bf16, else fp32; planned as "
                                         "amp_bf16)"
                                       : to_string(cfg.precision));
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
  if (plan.experts.degree > 1) {
    const int64_t ep = plan.experts.degree;
    if (!plan.expert_parallel_problem.empty()) {
      line("expert parallelism", fmt::format("degree {}: NOT runnable here, {}", ep, plan.expert_parallel_problem));
    } else {
      line("expert parallelism",
           fmt::format("groups of {} ranks, {} of the {} experts of each of {} MoE layers per rank ({} expert "
                       "parameters, {} per rank before sharding)",
                       ep, plan.num_experts / ep, plan.num_experts, plan.moe_layers, with_commas(plan.experts.params),
                       with_commas(plan.experts.params / ep)));
      line("token exchange", fmt::format("all-to-all {} sent per rank and step ({} with activation checkpointing)",
                                         gib(plan.all_to_all_bytes), gib(plan.all_to_all_bytes_ckpt)));
    }
  }
  if (plan.tensor_split.degree > 1) {
    const int64_t tp = plan.tensor_split.degree;
    line("tensor parallelism",
         fmt::format("groups of {} ranks ({} data-parallel), {} split parameters in {} layers, {} per rank before "
                     "sharding",
                     tp, plan.world_size / (tp * plan.context_parallel_degree), with_commas(plan.tensor_split.params),
                     plan.tensor_parallel_layers, with_commas(plan.tensor_split.params / tp)));
    line("tensor all-reduce", fmt::format("{} sent per rank and step ({} with activation checkpointing); activations "
                                          "below are not divided by the degree (an upper bound)",
                                          gib(plan.tensor_all_reduce_bytes), gib(plan.tensor_all_reduce_bytes_ckpt)));
  }
  if (plan.pipeline_degree > 1) {
    line("pipeline parallelism",
         fmt::format("{} stages of {} ranks, schedule {}; memory below is the whole model's (stages are not planned "
                     "yet)",
                     plan.pipeline_degree, plan.world_size / plan.pipeline_degree, cfg.fsdp.pipeline_schedule));
  }
  if (plan.context_parallel_degree > 1) {
    const int64_t cp = plan.context_parallel_degree;
    line(
        "context parallelism",
        fmt::format("groups of {} ranks ({} data-parallel), {} of each sequence's {} positions per rank (load-balanced "
                    "chunks); keys and values all-gathered in every attention layer",
                    cp, plan.world_size / (cp * std::max<int64_t>(plan.tensor_split.degree, 1)), plan.seq_len / cp,
                    plan.seq_len));
  }
  std::vector<std::string> names;
  for (const auto* list : {&cfg.algorithms, &cfg.callbacks, &cfg.loggers}) {
    for (const auto& c : *list) names.push_back(c.name);
  }
  if (!names.empty()) line("components", fmt::format("{}", fmt::join(names, ", ")));
  const int64_t mb = plan.auto_microbatch ? plan.device_train_batch_size : plan.microbatch_size;
  const bool mixed = cfg.precision != Precision::kFp32;
  const int states = cfg.optimizer.state_tensors;
  out += fmt::format(
      "  memory per rank (estimate: {}+{}+{} bytes per parameter for params+grads+optimizer as in ZeRO; "
      "activations for a microbatch of {}):\n",
      mixed ? 2 : 4, mixed ? 2 : 4, (mixed ? 4 : 0) + 4 * states, mb);
  out += fmt::format("    {:<15}{:>12}{:>12}{:>12}{:>12}{:>14}{:>14}{:>13}{:>13}\n", "strategy", "params", "grads",
                     "optimizer", "gathered", "activations", "act. ckpt", "total", "total ckpt");
  for (const MemoryRow& r : plan.memory) {
    const bool configured =
        (cfg.fsdp_configured || cfg.fsdp.mesh_keys == "parallelism") && cfg.fsdp.strategy == r.strategy;
    out += fmt::format("  {} {:<15}{:>12}{:>12}{:>12}{:>12}{:>14}{:>14}{:>13}{:>13}\n", configured ? "*" : " ",
                       dist::to_string(r.strategy), gib(r.state.params), gib(r.state.grads), gib(r.state.optimizer),
                       gib(r.state.transient), gib(r.activations), gib(r.activations_ckpt),
                       gib(r.state.total() + r.activations), gib(r.state.total() + r.activations_ckpt));
  }
  if (cfg.fsdp_configured || cfg.fsdp.mesh_keys == "parallelism") {
    out += fmt::format("    * = {}; activation checkpointing is {}\n",
                       cfg.fsdp.mesh_keys == "parallelism" ? "the strategy parallelism's degrees make"
                                                           : "fsdp_config.sharding_strategy",
                       cfg.fsdp.activation_checkpointing ? "on (use the ckpt columns)" : "off");
  }
  return out;
}

namespace {

// Bytes per second of writing `bytes` to a new file in `dir` and fsyncing it (the file is removed).
double measure_write_rate(const fs::path& dir, size_t bytes) {
  const fs::path probe = dir / fmt::format(".tessera-write-probe-{}", ::getpid());
  const std::string data(bytes, '\x5a');
  const auto start = std::chrono::steady_clock::now();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) throw Error("train", fmt::format("{}: cannot write a probe file to measure the save rate", dir.string()));
  size_t done = 0;
  bool ok = true;
  while (ok && done < bytes) {
    const ssize_t n = ::write(fd, data.data() + done, bytes - done);
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = ok && ::fsync(fd) == 0;
  ::close(fd);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::error_code ec;
  fs::remove(probe, ec);
  if (!ok) throw Error("train", fmt::format("{}: writing a probe file to measure the save rate failed", dir.string()));
  return static_cast<double>(bytes) / std::max(secs, 1e-9);
}

// Bytes per second of copying a host tensor (a save_async snapshot copies every tensor it stores).
double measure_copy_rate(size_t bytes) {
  const at::Tensor src = at::ones({static_cast<int64_t>(bytes / 4)}, at::kFloat);
  at::Tensor dst = at::empty_like(src);
  dst.copy_(src);  // warm up: the pages are touched once
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto start = std::chrono::steady_clock::now();
    dst.copy_(src);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return static_cast<double>(bytes) / std::max(best, 1e-9);
}

constexpr double kGpuHoursPerFailure = 54.0 * 24 * 16384 / 419;  // Llama 3 405B: 419 interruptions, 54 days, 16K GPUs
constexpr double kAssumedMfu = 0.4;
constexpr size_t kProbeBytes = size_t{64} << 20;

}  // namespace

CheckpointCosts estimate_checkpoint_costs(const TrainConfig& cfg, const Plan& plan, const CheckpointCostInputs& given,
                                          std::vector<std::string>& sources) {
  CheckpointCosts c;
  c.async = cfg.save.async;
  auto row = [&sources](std::string_view label, const std::string& text) {
    sources.push_back(fmt::format("{:<24}{}", label, text));
  };
  if (given.mtbf_hours) {
    c.mtbf_seconds = *given.mtbf_hours * 3600;
    row("time between failures", fmt::format("{} (--mtbf-hours)", human_seconds(c.mtbf_seconds)));
  } else {
    c.mtbf_seconds = kGpuHoursPerFailure * 3600 / static_cast<double>(plan.world_size);
    row("time between failures", fmt::format("{} (Llama 3's rate, one failure per {:.0f} GPU-hours, over {} ranks; "
                                             "--mtbf-hours to give yours)",
                                             human_seconds(c.mtbf_seconds), kGpuHoursPerFailure, plan.world_size));
  }
  const dist::ShardingStrategy strategy = plan.world_size == 1 ? dist::ShardingStrategy::kNoShard : cfg.fsdp.strategy;
  const double bytes = checkpoint_bytes_per_rank(cfg, plan, strategy);
  if (given.save_seconds) {
    c.save_seconds = *given.save_seconds;
    row("one save", fmt::format("{} (--save-seconds)", human_seconds(c.save_seconds)));
  } else if (cfg.save_folder && storage::is_remote(*cfg.save_folder)) {
    throw ConfigError("train", fmt::format("save_folder {} is remote: the dry run cannot measure its write rate; pass "
                                           "--save-seconds (a real save's time, from its \"[checkpoint] saved\" log "
                                           "line)",
                                           *cfg.save_folder));
  } else {
    // Absolute, so that a relative save folder none of whose parts exists yet (runs/x/ckpt in a fresh clone) is
    // measured in the working directory it would be made in.
    fs::path dir = fs::absolute(cfg.save_folder ? fs::path(util::fill_path_pattern(*cfg.save_folder, cfg.run_name, 0))
                                                : fs::current_path());
    while (!fs::is_directory(dir) && dir.has_parent_path() && dir.parent_path() != dir) dir = dir.parent_path();
    const double rate = measure_write_rate(dir, kProbeBytes);
    c.save_seconds = bytes / rate;
    row("one save", fmt::format("{} ({:.1f} MB per rank at {:.0f} MB/s, measured writing to {}; --save-seconds to "
                                "give a real save's)",
                                human_seconds(c.save_seconds), bytes / 1e6, rate / 1e6, dir.string()));
  }
  if (given.blocking_seconds) {
    c.blocking_seconds = *given.blocking_seconds;
    row("blocking per save", fmt::format("{} (--save-blocking-seconds)", human_seconds(c.blocking_seconds)));
  } else if (!c.async) {
    c.blocking_seconds = c.save_seconds;
    row("blocking per save", fmt::format("{} (save_async: false, so the whole save)", human_seconds(c.save_seconds)));
  } else {
    const double rate = measure_copy_rate(kProbeBytes);
    c.blocking_seconds = std::min(c.save_seconds, bytes / rate);
    row("blocking per save", fmt::format("{} (the snapshot: {:.1f} MB copied at {:.1f} GB/s, measured; "
                                         "checkpoint/blocking_seconds of a real run to check)",
                                         human_seconds(c.blocking_seconds), bytes / 1e6, rate / 1e9));
  }
  if (given.step_seconds) {
    c.step_seconds = *given.step_seconds;
    row("step time", fmt::format("{} (--step-seconds)", human_seconds(c.step_seconds)));
  } else {
    const bool cuda = cfg.device != "cpu" && at::hasCUDA();
    const at::ScalarType dtype = cfg.precision == Precision::kFp32 || !cuda ? at::kFloat : at::kBFloat16;
    const double flops =
        util::measure_matmul_flops(dtype, cuda ? at::Device(at::kCUDA) : at::Device(at::kCPU), 1024, 0.3);
    const double per_rank =
        plan.flops_per_token * static_cast<double>(plan.tokens_per_step) / static_cast<double>(plan.world_size);
    c.step_seconds = per_rank / (flops * kAssumedMfu);
    row("step time", fmt::format("{} ({:.3g} TFLOP per rank at {:.0f}% of this machine's measured {:.1f} TFLOP/s {} "
                                 "GEMM; --step-seconds to give a real run's)",
                                 human_seconds(c.step_seconds), per_rank / 1e12, 100 * kAssumedMfu, flops / 1e12,
                                 cuda ? "GPU" : "CPU"));
  }
  return c;
}

std::string render_checkpoint_advice(const TrainConfig& cfg, const CheckpointCosts& costs,
                                     const std::vector<std::string>& sources) {
  const CheckpointAdvice a = advise_checkpoint_interval(costs);
  std::string out = "  checkpoint interval (Young/Daly: least expected time lost to saves and failures):\n";
  for (const std::string& s : sources) out += fmt::format("    {}\n", s);
  out += fmt::format("    {:<24}{} = save_interval: {}ba (Daly; Young {})\n", "best interval",
                     human_seconds(a.daly_seconds), a.interval_batches, human_seconds(a.young_seconds));
  out += fmt::format("    {:<24}{} per save ({}), {:.3g}% of wall time expected lost; a failure redoes {}\n",
                     "at that interval", human_seconds(costs.blocking_seconds),
                     costs.async ? "save_async: training blocks for the snapshot" : "synchronous saves",
                     100 * a.overhead_fraction, human_seconds(a.lost_per_failure_seconds));
  if (cfg.save.interval.unit() == config::TimeUnit::kBatch && cfg.save.interval.count() > 0) {
    out += fmt::format("    {:<24}{}: {:.3g}% expected lost\n", "the recipe's interval", cfg.save.interval.str(),
                       100 * checkpoint_overhead(costs, cfg.save.interval.count()));
  }
  return out;
}

}  // namespace tessera::trainer
