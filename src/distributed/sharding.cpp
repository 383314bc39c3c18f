// fsdp_config parsing and ZeRO memory accounting.
#include "tessera/distributed/sharding.h"

#include <fmt/format.h>

#include <algorithm>

#include "tessera/distributed/pipeline.h"
#include "tessera/util/error.h"

namespace tessera::dist {

std::string to_string(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::kNoShard:
      return "NO_SHARD";
    case ShardingStrategy::kShardGradOp:
      return "SHARD_GRAD_OP";
    case ShardingStrategy::kFullShard:
      return "FULL_SHARD";
    case ShardingStrategy::kHybridShard:
      return "HYBRID_SHARD";
  }
  return "?";
}

ShardingOptions parse_sharding_options(config::Section& s) {
  ShardingOptions o;
  const std::string strategy =
      s.get_choice("sharding_strategy", "FULL_SHARD",
                   {"NO_SHARD", "SHARD_GRAD_OP", "FULL_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"});
  if (strategy == "NO_SHARD") o.strategy = ShardingStrategy::kNoShard;
  if (strategy == "SHARD_GRAD_OP") o.strategy = ShardingStrategy::kShardGradOp;
  if (strategy == "HYBRID_SHARD") o.strategy = ShardingStrategy::kHybridShard;
  if (strategy == "_HYBRID_SHARD_ZERO2") s.not_supported("sharding_strategy", strategy);
  const std::string mp = s.get_choice("mixed_precision", "DEFAULT", {"PURE", "DEFAULT", "FULL"});
  if (mp == "PURE") o.mixed_precision = MixedPrecision::kPure;
  if (mp == "FULL") o.mixed_precision = MixedPrecision::kFull;
  o.activation_checkpointing = s.get_bool("activation_checkpointing", false);
  o.activation_checkpointing_reentrant = s.get_bool("activation_checkpointing_reentrant", true);
  if (s.get_bool("activation_cpu_offload", false)) s.not_supported("activation_cpu_offload", "true");
  if (s.get_bool("cpu_offload", false)) s.not_supported("cpu_offload", "true");
  o.limit_all_gathers = s.get_bool("limit_all_gathers", true);
  o.forward_prefetch = s.get_bool("forward_prefetch", false);
  o.backward_prefetch =
      s.get_choice("backward_prefetch", o.backward_prefetch, {"BACKWARD_PRE", "BACKWARD_POST", "NONE"});
  s.get_int("forward_prefetch_limit", 1);
  s.get_int("backward_prefetch_limit", 1);
  o.sync_module_states = s.get_bool("sync_module_states", false);
  o.use_orig_params = s.get_bool("use_orig_params", true);
  o.state_dict_type = s.get_choice("state_dict_type", "full", {"full", "sharded"});
  o.verbose = s.get_bool("verbose", false);
  o.overlap_communication = s.get_bool("overlap_communication", true);
  s.get_bool("auto_wrap", true);  // units are always the embedding, each block and the head
  if (s.get_bool("keep_low_precision_grads", false)) s.not_supported("keep_low_precision_grads", "true");
  if (s.get_bool("load_monolith_rank0_only", false)) s.not_supported("load_monolith_rank0_only", "true");
  o.shard_degree = s.get_int("data_parallel_shard_degree", -1);
  s.check(o.shard_degree == -1 || o.shard_degree >= 1, "data_parallel_shard_degree", "must be -1 (the rest) or >= 1");
  if (const config::Value* r = s.raw("data_parallel_replicate_degree"); r && !r->is_null()) {
    o.replicate_degree = s.get_int("data_parallel_replicate_degree", 1);
    s.check(o.replicate_degree >= 1, "data_parallel_replicate_degree", "must be at least 1");
  }
  s.finish({"ignored_modules", "process_group", "sharded_ckpt_prefix_dir", "te_checkpoint_wrapper",
            "te_shard_fp8_weight", "load_planner", "save_planner", "device_mesh", "reshard_after_forward"});
  return o;
}

void parse_parallelism(config::Section& p, const config::Section& fsdp, ShardingOptions& o) {
  const int64_t replicate = p.get_int("data_parallel_replicate_degree", 1);
  p.check(replicate >= 1, "data_parallel_replicate_degree", "must be at least 1");
  const int64_t shard = p.get_int("data_parallel_shard_degree", -1);
  p.check(shard == -1 || shard >= 1, "data_parallel_shard_degree", "must be -1 (the rest) or >= 1");
  const std::string reshard = p.get_choice("fsdp_reshard_after_forward", "default", {"default", "always", "never"});
  const int64_t tensor = p.get_int("tensor_parallel_degree", 1);
  p.check(tensor >= 1, "tensor_parallel_degree", "must be at least 1");
  o.sequence_parallel = p.get_bool("sequence_parallel", true);
  const int64_t context = p.get_int("context_parallel_degree", 1);
  p.check(context >= 1, "context_parallel_degree", "must be at least 1");
  const int64_t pipeline = p.get_int("pipeline_parallel_degree", 1);
  p.check(pipeline >= 1, "pipeline_parallel_degree", "must be at least 1");
  const int64_t expert_tensor = p.get_int("expert_tensor_parallel_degree", 1);
  p.check(expert_tensor >= 1, "expert_tensor_parallel_degree", "must be at least 1");
  if (expert_tensor > 1) p.not_supported("expert_tensor_parallel_degree", std::to_string(expert_tensor));
  if (p.get_bool("enable_async_tensor_parallel", false)) p.not_supported("enable_async_tensor_parallel", "true");
  if (p.get_bool("enable_compiled_autograd", false)) p.not_supported("enable_compiled_autograd", "true");
  // Context parallelism all-gathers the keys and values (torchtitan's "allgather" method).
  o.loss_parallel = !p.get_bool("disable_loss_parallel", false);
  if (p.get_choice("context_parallel_rotate_method", "allgather", {"allgather", "alltoall"}) == "alltoall") {
    p.not_supported("context_parallel_rotate_method", "alltoall");
  }
  o.pipeline_schedule = p.get_string("pipeline_parallel_schedule", "1F1B");
  if (!pipeline_schedule_named(o.pipeline_schedule)) {
    if (needs_virtual_stages(o.pipeline_schedule)) {
      p.not_supported("pipeline_parallel_schedule", o.pipeline_schedule + " (virtual stages; GPipe and 1F1B run)");
    } else {
      p.fail("pipeline_parallel_schedule",
             fmt::format("unknown schedule \"{}\"; expected GPipe or 1F1B", o.pipeline_schedule));
    }
  }
  o.pipeline_microbatch_size = p.get_int("pipeline_parallel_microbatch_size", 0);
  p.check(o.pipeline_microbatch_size >= 0, "pipeline_parallel_microbatch_size", "must be at least 1");
  for (const char* key :
       {"pipeline_parallel_split_points", "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule_csv"}) {
    if (p.has(key)) p.not_supported(key, "given (stages split the blocks evenly)");
  }
  o.expert_parallel_degree = p.get_int("expert_parallel_degree", 1);
  p.check(o.expert_parallel_degree >= 1, "expert_parallel_degree", "must be at least 1");
  p.finish();

  for (const char* key : {"data_parallel_shard_degree", "data_parallel_replicate_degree"}) {
    if (fsdp.has(key)) {
      p.fail(key,
             fmt::format("the data-parallel degrees are given in fsdp_config.{} too; give them in one section", key));
    }
  }
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  if (replicate > 1) strategy = shard == 1 ? ShardingStrategy::kNoShard : ShardingStrategy::kHybridShard;
  if (replicate == 1 && reshard == "never") strategy = ShardingStrategy::kShardGradOp;
  if (replicate > 1 && reshard == "never" && shard != 1) {
    p.fail("fsdp_reshard_after_forward",
           "never with data_parallel_replicate_degree > 1: Tessera's HYBRID_SHARD "
           "reshards after forward (use data_parallel_replicate_degree 1 for "
           "SHARD_GRAD_OP)");
  }
  if (fsdp.has("sharding_strategy") && o.strategy != strategy) {
    p.fail("data_parallel_replicate_degree",
           fmt::format("replicate {} x shard {} is {} but fsdp_config.sharding_strategy is {}", replicate,
                       shard == -1 ? std::string("the rest") : std::to_string(shard), to_string(strategy),
                       to_string(o.strategy)));
  }
  o.strategy = strategy;
  o.shard_degree = shard;
  o.replicate_degree = replicate;
  o.mesh_keys = "parallelism";
  o.tensor_parallel_degree = tensor;
  o.context_parallel_degree = context;
  o.pipeline_parallel_degree = pipeline;
}

namespace {
// How a message names what the data-parallel degrees multiply to besides the world size.
std::string mesh_divisor(int64_t tp, int64_t cp) {
  if (cp > 1) return fmt::format(" / (tensor_parallel_degree x context_parallel_degree) ({} x {})", tp, cp);
  return tp > 1 ? fmt::format(" / tensor_parallel_degree ({})", tp) : std::string();
}
}  // namespace

int64_t shard_group_size(const ShardingOptions& o, int64_t world_size, int64_t ranks_per_node) {
  const int64_t tp = std::max<int64_t>(o.tensor_parallel_degree, 1);
  if (world_size % tp != 0) {
    throw ConfigError("recipe", fmt::format("{}.tensor_parallel_degree ({}) does not divide the world size ({})",
                                            o.mesh_keys, tp, world_size));
  }
  const int64_t cp = std::max<int64_t>(o.context_parallel_degree, 1);
  if (world_size % (tp * cp) != 0) {
    throw ConfigError(
        "recipe", fmt::format("{}.context_parallel_degree ({}){} does not divide the world size ({})", o.mesh_keys, cp,
                              tp > 1 ? fmt::format(" x tensor_parallel_degree ({})", tp) : std::string(), world_size));
  }
  if (o.shard_degree == -1 && o.replicate_degree == 0) return std::clamp<int64_t>(ranks_per_node, 1, world_size);
  const int64_t data = world_size / (tp * cp);  // data-parallel ranks: one per tensor x context-parallel group
  const int64_t r = o.replicate_degree > 0 ? o.replicate_degree : 1;
  const int64_t shard = o.shard_degree == -1 ? data / r : o.shard_degree;
  const int64_t replicate = o.replicate_degree > 0 ? o.replicate_degree : data / std::max<int64_t>(shard, 1);
  if (shard < 1 || shard * replicate != data) {
    throw ConfigError(
        "recipe",
        fmt::format("{}.data_parallel_shard_degree ({}) x data_parallel_replicate_degree ({}) must equal the world "
                    "size ({}){}",
                    o.mesh_keys, o.shard_degree,
                    o.replicate_degree > 0 ? std::to_string(o.replicate_degree) : std::string("unset"), world_size,
                    mesh_divisor(tp, cp)));
  }
  if (replicate > 1 && o.strategy != ShardingStrategy::kHybridShard && o.strategy != ShardingStrategy::kNoShard) {
    throw ConfigError("recipe", fmt::format("{}.data_parallel_replicate_degree {}: {} does not replicate "
                                            "shards; use sharding_strategy HYBRID_SHARD (shard within groups of {}, "
                                            "replicate across {})",
                                            o.mesh_keys, replicate, to_string(o.strategy), shard, replicate));
  }
  if (replicate == 1 && o.strategy == ShardingStrategy::kHybridShard) return world_size;
  return shard * tp * cp;
}

bool applies_fsdp(int64_t world_size) {
  return world_size > 1;
}

ShardingOptions sharding_for_world(ShardingOptions o, int64_t world_size) {
  if (applies_fsdp(world_size)) return o;
  o.strategy = ShardingStrategy::kNoShard;
  o.mixed_precision = MixedPrecision::kFull;
  o.activation_checkpointing = false;
  return o;
}

StateMemory state_memory_per_rank(int64_t n_params, ShardingStrategy strategy, int64_t world_size,
                                  int64_t ranks_per_node, bool mixed_precision, int state_tensors,
                                  int64_t largest_unit_params) {
  const double psi = static_cast<double>(n_params);
  const double p = mixed_precision ? 2 : 4;                          // bytes of a compute-precision parameter
  const double g = p;                                                // gradients in the same precision
  const double k = (mixed_precision ? 4 : 0) + 4.0 * state_tensors;  // master copy + optimizer state
  double shards = static_cast<double>(std::max<int64_t>(world_size, 1));
  if (strategy == ShardingStrategy::kHybridShard) shards = static_cast<double>(std::max<int64_t>(ranks_per_node, 1));
  StateMemory m;
  switch (strategy) {
    case ShardingStrategy::kNoShard:
      m.params = psi * p, m.grads = psi * g, m.optimizer = psi * k;
      break;
    case ShardingStrategy::kShardGradOp:
      m.params = psi * p, m.grads = psi * g / shards, m.optimizer = psi * k / shards;
      break;
    case ShardingStrategy::kFullShard:
    case ShardingStrategy::kHybridShard:
      m.params = psi * p / shards, m.grads = psi * g / shards, m.optimizer = psi * k / shards;
      if (shards > 1) m.transient = 2.0 * static_cast<double>(largest_unit_params) * p;
      break;
  }
  return m;
}

StateMemory state_memory_per_rank(int64_t n_params, ShardingStrategy strategy, int64_t world_size,
                                  int64_t ranks_per_node, bool mixed_precision, int state_tensors,
                                  int64_t largest_unit_params, const ExpertShare& experts) {
  if (experts.degree <= 1 || experts.params == 0) {
    return state_memory_per_rank(n_params, strategy, world_size, ranks_per_node, mixed_precision, state_tensors,
                                 largest_unit_params);
  }
  const int64_t ep = experts.degree;
  const StateMemory dense =
      state_memory_per_rank(n_params - experts.params, strategy, world_size, ranks_per_node, mixed_precision,
                            state_tensors, largest_unit_params - experts.largest_unit_params);
  const StateMemory mine = state_memory_per_rank(experts.params / ep, strategy, std::max<int64_t>(world_size / ep, 1),
                                                 std::max<int64_t>(ranks_per_node / ep, 1), mixed_precision,
                                                 state_tensors, experts.largest_unit_params / ep);
  StateMemory m;
  m.params = dense.params + mine.params;
  m.grads = dense.grads + mine.grads;
  m.optimizer = dense.optimizer + mine.optimizer;
  // The gathered units: the dense part of two units, and this rank's experts of them (gathered even when their group
  // of holders is a single rank, as the engine does).
  const int64_t unit_experts_per_rank = experts.largest_unit_params / ep;  // whole experts: ep divides them
  m.transient = strategy == ShardingStrategy::kFullShard || strategy == ShardingStrategy::kHybridShard
                    ? dense.transient + 2.0 * static_cast<double>(unit_experts_per_rank) * (mixed_precision ? 2.0 : 4.0)
                    : 0.0;
  return m;
}

double expert_all_to_all_bytes(int64_t tokens, int64_t top_k, int64_t d_model, int64_t moe_layers, int64_t degree,
                               int bytes_per_value, bool activation_checkpointing) {
  if (degree <= 1) return 0;
  const double rows = static_cast<double>(tokens) * static_cast<double>(top_k);
  const double exchanges = activation_checkpointing ? 6.0 : 4.0;
  return exchanges * static_cast<double>(moe_layers) * rows * static_cast<double>(d_model) * bytes_per_value *
         static_cast<double>(degree - 1) / static_cast<double>(degree);
}

double tensor_parallel_all_reduce_bytes(int64_t tokens, int64_t d_model, int64_t layers, int64_t degree,
                                        int bytes_per_value, bool activation_checkpointing) {
  if (degree <= 1) return 0;
  const double all_reduces = (activation_checkpointing ? 6.0 : 4.0) * static_cast<double>(layers);
  const double bytes = static_cast<double>(tokens) * static_cast<double>(d_model) * bytes_per_value;
  return all_reduces * bytes * 2.0 * static_cast<double>(degree - 1) / static_cast<double>(degree);
}

}  // namespace tessera::dist
