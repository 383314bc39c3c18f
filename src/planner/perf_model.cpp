// The planner's performance model (the formulas are in the header).
#include "tessera/planner/perf_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace tessera::planner {
namespace {

using dist::ShardingStrategy;

// One ring collective moving `bytes` per rank over `ranks` ranks (`steps` latency hops), on `link`.
double collective_s(double bytes, int64_t steps, const Link& link) {
  return bytes / link.bandwidth_bytes_per_s + static_cast<double>(steps) * link.latency_s;
}

bool is_power_of_two(int64_t n) {
  return n > 0 && (n & (n - 1)) == 0;
}

}  // namespace

std::string Candidate::describe() const {
  return fmt::format("{}{}{}{}, microbatch {}", tensor_parallel > 1 ? fmt::format("TP {} x ", tensor_parallel) : "",
                     context_parallel > 1 ? fmt::format("CP {} x ", context_parallel) : "", dist::to_string(strategy),
                     activation_checkpointing ? ", act. ckpt" : "", microbatch);
}

Candidate model_candidate(const JobProfile& job, const Cluster& cluster, int64_t devices, ShardingStrategy strategy,
                          bool activation_checkpointing, int64_t microbatch, int64_t tensor_parallel,
                          int64_t context_parallel) {
  const int64_t tp = std::max<int64_t>(tensor_parallel, 1), cp = std::max<int64_t>(context_parallel, 1);
  if (devices < 1 || devices % (tp * cp) != 0 || job.global_batch % (devices / (tp * cp)) != 0) {
    throw std::invalid_argument(
        fmt::format("{} devices in tensor x context-parallel groups of {} x {} do not divide job {}'s global "
                    "batch of {}",
                    devices, tp, cp, job.name, job.global_batch));
  }
  Candidate c;
  c.devices = devices;
  c.nodes = devices > cluster.devices_per_node ? devices / cluster.devices_per_node : 1;
  c.strategy = strategy;
  c.tensor_parallel = tp;
  c.context_parallel = cp;
  c.activation_checkpointing = activation_checkpointing;
  const int64_t device_batch = job.global_batch / (devices / (tp * cp));  // per data-parallel rank
  c.microbatch = std::clamp<int64_t>(microbatch, 1, device_batch);
  c.microbatches = (device_batch + c.microbatch - 1) / c.microbatch;

  // Memory: ZeRO's accounting of the model state plus one microbatch's activations.
  const int64_t ranks_per_node = std::min(devices, cluster.devices_per_node);
  // Expert parallelism runs where the devices hold whole groups (and HYBRID_SHARD's nodes too), sharded: elsewhere the
  // candidate is not run (fits false).
  const int64_t ep = job.experts.degree;
  const bool ep_runs = ep <= 1 || (devices % ep == 0 && strategy != ShardingStrategy::kNoShard &&
                                   (strategy != ShardingStrategy::kHybridShard || ranks_per_node % ep == 0));
  // Tensor parallelism runs within a node, on degrees the model divides into, sharded, and not beside expert
  // parallelism (as the engine refuses it).
  const bool tp_runs =
      tp == 1 || (std::find(job.tensor_parallel_degrees.begin(), job.tensor_parallel_degrees.end(), tp) !=
                      job.tensor_parallel_degrees.end() &&
                  cluster.devices_per_node % tp == 0 && strategy != ShardingStrategy::kNoShard && ep <= 1);
  // Context parallelism runs on degrees the model supports, with the groups of T x C within a node, and not beside
  // expert parallelism (the engine refuses MoE models).
  const bool cp_runs = cp == 1 || (std::find(job.context_parallel_degrees.begin(), job.context_parallel_degrees.end(),
                                             cp) != job.context_parallel_degrees.end() &&
                                   cluster.devices_per_node % (tp * cp) == 0 && ep <= 1);
  dist::ExpertShare split;
  if (ep > 1 && ep_runs) split = job.experts;
  if (tp > 1 && tp_runs) {
    split = job.tensor_split;
    split.degree = tp;
  }
  const dist::StateMemory state =
      dist::state_memory_per_rank(job.n_params, strategy, devices, ranks_per_node, job.mixed_precision,
                                  job.optimizer_state_tensors, job.largest_unit_params, split);
  const double act_per_sample =
      activation_checkpointing ? job.activation_bytes_per_sample_ckpt : job.activation_bytes_per_sample;
  // Sequence parallelism: every activation of the layers is 1 / T (an approximation: the head's logits stay whole);
  // context parallelism: 1 / C, plus the rank's rows of the attention mask.
  const double act_bytes = job.mixed_precision ? 2.0 : 4.0;
  const int64_t rows = job.seq_len / cp;  // the positions a rank holds (the sequence cuts into 2 C chunks)
  const double mask = cp > 1 ? static_cast<double>(rows * job.seq_len) * act_bytes : 0;
  c.memory_bytes =
      state.total() + (act_per_sample / static_cast<double>(tp * cp) + mask) * static_cast<double>(c.microbatch);
  c.fits = ep_runs && tp_runs && cp_runs && c.memory_bytes <= cluster.memory_bytes * cluster.usable_memory;

  // Compute.
  const double flops = job.flops_per_token * job.tokens_per_step() * (activation_checkpointing ? 4.0 / 3.0 : 1.0);
  c.compute_s = flops / (static_cast<double>(devices) * cluster.peak_flops * cluster.mfu);

  // Communication: bytes per rank and step, by strategy, over the link the collective runs on (with tensor
  // parallelism, each rank's copy is the dense parameters and 1 / T of the split ones).
  const double held =
      static_cast<double>(job.n_params) -
      (tp > 1 ? static_cast<double>(job.tensor_split.params) * (1.0 - 1.0 / static_cast<double>(tp)) : 0.0);
  const double p = held * (job.mixed_precision ? 2.0 : 4.0);
  const double m = static_cast<double>(c.microbatches);
  const int64_t units =
      job.largest_unit_params > 0
          ? std::max<int64_t>(1, (job.n_params + job.largest_unit_params - 1) / job.largest_unit_params)
          : 1;
  const Link& link = c.nodes > 1 ? cluster.inter_node : cluster.intra_node;
  const double n = static_cast<double>(devices);
  const double k = (n - 1) / n;
  const int64_t hops = 2 * (devices - 1);
  double comm = 0;
  if (devices > 1) {
    switch (strategy) {
      case ShardingStrategy::kNoShard:
        comm = collective_s(2 * k * p, hops, link);
        break;
      case ShardingStrategy::kShardGradOp:
        comm = collective_s(k * p * (m + 1), hops * units * (c.microbatches + 1) / 2, link);
        break;
      case ShardingStrategy::kFullShard:
        comm = collective_s(3 * k * p * m, hops * units * c.microbatches * 3 / 2, link);
        break;
      case ShardingStrategy::kHybridShard: {
        const double d = static_cast<double>(ranks_per_node);
        const double kd = (d - 1) / d;
        comm =
            collective_s(3 * kd * p * m, 2 * (ranks_per_node - 1) * units * c.microbatches * 3 / 2, cluster.intra_node);
        if (c.nodes > 1) {
          const double kn = static_cast<double>(c.nodes - 1) / static_cast<double>(c.nodes);
          comm += collective_s(2 * kn * p / d, 2 * (c.nodes - 1), cluster.inter_node);
        }
        break;
      }
    }
  }
  if (ep > 1 && ep_runs) {
    // The token exchanges: all-to-alls within each expert-parallel group (on one node when the group fits in one),
    // (ep - 1) latency hops each, 4 per MoE layer and microbatch (6 with activation checkpointing).
    const double tokens = job.tokens_per_step() / static_cast<double>(devices);
    const double bytes = job.all_to_all_bytes_per_token * tokens * (activation_checkpointing ? 1.5 : 1.0);
    const Link& ep_link = ep <= cluster.devices_per_node ? cluster.intra_node : cluster.inter_node;
    const int64_t exchanges = (activation_checkpointing ? 6 : 4) * job.moe_layers * c.microbatches;
    comm += collective_s(bytes, (ep - 1) * exchanges, ep_link);
  }
  double tensor_comm = 0;
  if (tp > 1 && tp_runs) {
    // The layers' all-reduces (or sequence parallelism's reduce-scatter + all-gather: the same bytes) within the node,
    // on the critical path between the layers' computations.
    const int64_t tokens = device_batch * job.seq_len;
    const double bytes = dist::tensor_parallel_all_reduce_bytes(tokens, job.d_model, job.tensor_parallel_layers, tp,
                                                                job.mixed_precision ? 2 : 4, activation_checkpointing);
    const int64_t collectives = (activation_checkpointing ? 6 : 4) * job.tensor_parallel_layers * c.microbatches;
    tensor_comm = collective_s(bytes, 2 * (tp - 1) * collectives, cluster.intra_node);
  }
  if (cp > 1 && cp_runs) {
    // Each attention layer all-gathers the keys and values of the microbatch's whole sequences within the group
    // (d_model wide each: an upper bound under grouped-query attention), reduce-scatters their gradients in
    // backward, and gathers again when the layer is recomputed.
    const double rounds = activation_checkpointing ? 3 : 2;
    const double kv = static_cast<double>(c.microbatch * job.seq_len * 2 * job.d_model) * act_bytes;
    const double k_cp = static_cast<double>(cp - 1) / static_cast<double>(cp);
    const double layers = static_cast<double>(job.tensor_parallel_layers * c.microbatches);
    tensor_comm +=
        collective_s(k_cp * kv * rounds * layers / static_cast<double>(tp),
                     static_cast<int64_t>(static_cast<double>(cp - 1) * 2 * rounds * layers), cluster.intra_node);
  }
  c.communication_s = comm + tensor_comm;
  c.tensor_communication_s = tensor_comm;
  c.step_s = c.compute_s + std::max(0.0, comm - cluster.overlap * c.compute_s) + tensor_comm;
  c.modelled_step_s = c.step_s;
  c.startup_s = cluster.startup_s;
  c.duration_s = c.startup_s + static_cast<double>(job.steps) * c.step_s;
  return c;
}

namespace {

// The (tensor, context) degrees `g` devices can run the job with: groups within a node that divide g, with the
// data-parallel ranks g / (T C) dividing the global batch.
std::vector<std::pair<int64_t, int64_t>> mesh_degrees(const JobProfile& job, const Cluster& cluster, int64_t g) {
  std::vector<int64_t> tensor = {1}, context = {1};
  tensor.insert(tensor.end(), job.tensor_parallel_degrees.begin(), job.tensor_parallel_degrees.end());
  context.insert(context.end(), job.context_parallel_degrees.begin(), job.context_parallel_degrees.end());
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t t : tensor) {
    for (int64_t cp : context) {
      const int64_t group = t * cp;
      if (group <= g && g % group == 0 && cluster.devices_per_node % group == 0 &&
          job.global_batch % (g / group) == 0) {
        out.emplace_back(t, cp);
      }
    }
  }
  return out;
}

// Every fitting configuration on exactly `g` devices (see enumerate_candidates), appended to `out`.
void enumerate_on(const JobProfile& job, const Cluster& cluster, int64_t g, std::vector<Candidate>& out) {
  std::vector<ShardingStrategy> strategies = {ShardingStrategy::kNoShard};
  if (g > 1) {
    strategies.push_back(ShardingStrategy::kShardGradOp);
    strategies.push_back(ShardingStrategy::kFullShard);
  }
  if (g > cluster.devices_per_node) strategies.push_back(ShardingStrategy::kHybridShard);
  for (const auto& [t, cp] : mesh_degrees(job, cluster, g)) {
    const int64_t device_batch = job.global_batch / (g / (t * cp));
    std::vector<int64_t> microbatches;
    for (int64_t mb = 1; mb < device_batch; mb *= 2) microbatches.push_back(mb);
    microbatches.push_back(device_batch);
    for (ShardingStrategy s : strategies) {
      if (t > 1 && s == ShardingStrategy::kNoShard) continue;
      for (bool ckpt : {false, true}) {
        for (int64_t mb : microbatches) {
          Candidate c = model_candidate(job, cluster, g, s, ckpt, mb, t, cp);
          if (c.fits) out.push_back(c);
        }
      }
    }
  }
}

}  // namespace

std::vector<int64_t> device_counts(const JobProfile& job, const Cluster& cluster) {
  std::vector<int64_t> out;
  for (int64_t g = 1; g <= cluster.devices_per_node; g *= 2) {
    if (job.global_batch % g == 0) out.push_back(g);
  }
  if (!is_power_of_two(cluster.devices_per_node) && job.global_batch % cluster.devices_per_node == 0) {
    out.push_back(cluster.devices_per_node);  // a whole node of, say, 6 devices
  }
  const int64_t max_nodes = std::min(job.max_nodes, cluster.nodes);
  for (int64_t nodes = 2; nodes <= max_nodes; nodes *= 2) {
    const int64_t g = nodes * cluster.devices_per_node;
    if (job.global_batch % g == 0) out.push_back(g);
  }
  return out;
}

std::vector<Candidate> enumerate_candidates(const JobProfile& job, const Cluster& cluster) {
  std::vector<Candidate> out;
  for (int64_t g : device_counts(job, cluster)) enumerate_on(job, cluster, g, out);
  return out;
}

std::vector<Candidate> best_candidates(const JobProfile& job, const Cluster& cluster) {
  return select_best(enumerate_candidates(job, cluster));
}

std::vector<Candidate> select_best(const std::vector<Candidate>& candidates) {
  std::map<int64_t, bool> profiled;  // by device count: whether any configuration was measured
  for (const Candidate& c : candidates) profiled[c.devices] = profiled[c.devices] || (c.fits && c.profiled);
  std::map<int64_t, Candidate> best;  // by device count
  for (const Candidate& c : candidates) {
    if (!c.fits || c.profiled != profiled[c.devices]) continue;
    auto it = best.find(c.devices);
    // Fastest first; among equals, the larger microbatch (the model does not count the per-microbatch overheads
    // that make small ones slower in practice), then the least memory.
    if (it == best.end() || c.duration_s < it->second.duration_s ||
        (c.duration_s == it->second.duration_s &&
         std::tie(c.microbatch, it->second.memory_bytes) > std::tie(it->second.microbatch, c.memory_bytes))) {
      best[c.devices] = c;
    }
  }
  std::vector<Candidate> out;
  for (const auto& [devices, c] : best) {
    // More devices that finish no sooner are never worth taking.
    if (!out.empty() && c.duration_s >= out.back().duration_s) continue;
    out.push_back(c);
  }
  return out;
}

ScalingEstimate estimate_scaling(const JobProfile& job, const Cluster& cluster, int64_t devices,
                                 ShardingStrategy strategy, bool activation_checkpointing, int64_t microbatch,
                                 int64_t tensor_parallel, int64_t context_parallel) {
  ScalingEstimate e;
  e.config = model_candidate(job, cluster, devices, strategy, activation_checkpointing, microbatch, tensor_parallel,
                             context_parallel);
  e.tokens_per_s = job.tokens_per_step() / e.config.step_s;
  e.efficiency = e.config.compute_s / e.config.step_s;
  return e;
}

std::string render_estimate(const ScalingEstimate& e, const JobProfile& job, const Cluster& cluster) {
  const Candidate& c = e.config;
  const double hidden = std::min(c.communication_s - c.tensor_communication_s, cluster.overlap * c.compute_s);
  std::string out = fmt::format("Estimate on {} ({} devices; docs/planner.md#the-performance-model):\n",
                                cluster.describe(), c.devices);
  out += fmt::format("  configuration       {}, {} microbatch{} per step{}\n", c.describe(), c.microbatches,
                     c.microbatches == 1 ? "" : "es", c.fits ? "" : "  (does NOT fit the device's usable memory)");
  out += fmt::format(
      "  step time           {:.3f} s: compute {:.3f} s at {:.0f}% MFU, communication {:.3f} s of which "
      "{:.3f} s hidden{}\n",
      c.step_s, c.compute_s, 100 * cluster.mfu, c.communication_s, hidden,
      c.tensor_communication_s > 0
          ? fmt::format(" ({}-parallel collectives {:.3f} s, not hidden)",
                        c.context_parallel > 1 ? (c.tensor_parallel > 1 ? "tensor- and context" : "context") : "tensor",
                        c.tensor_communication_s)
          : "");
  out += fmt::format("  throughput          {:.0f} tokens/s ({:.0f} per device)\n", e.tokens_per_s,
                     e.tokens_per_s / static_cast<double>(c.devices));
  out += fmt::format("  scaling efficiency  {:.1f}% of {} x one device's throughput\n", 100 * e.efficiency, c.devices);
  out += fmt::format("  memory per device   {:.1f} GiB of {:.0f} GiB\n", c.memory_bytes / (1024.0 * 1024 * 1024),
                     cluster.memory_bytes / (1024.0 * 1024 * 1024));
  if (job.steps > 0) {
    const double total = c.startup_s + static_cast<double>(job.steps) * c.step_s;
    out += fmt::format("  time to train       {:.1f} h ({} steps, {:.0f} s startup)\n", total / 3600, job.steps,
                       c.startup_s);
  } else {
    out += "  time to train       unknown (max_duration is in epochs)\n";
  }
  return out;
}

std::string render_recommendation(const JobProfile& job, const Cluster& cluster, int64_t devices,
                                  const Candidate& configured) {
  const Candidate* best = nullptr;
  // The devices the dry run is given, with any mesh whose data-parallel ranks divide the batch (also more devices than
  // samples, through tensor or context parallelism).
  std::vector<Candidate> all;
  enumerate_on(job, cluster, devices, all);
  for (const Candidate& c : all) {
    if (best == nullptr || c.step_s < best->step_s) best = &c;
  }
  if (best == nullptr)
    return fmt::format("  recommendation      nothing the model considers fits {} devices\n", devices);
  const double tokens_per_s = job.tokens_per_step() / best->step_s;
  std::string out =
      fmt::format("  recommendation      {}: {:.3f} s per step, {:.0f} tokens/s, {:.1f} GiB per device",
                  best->describe(), best->step_s, tokens_per_s, best->memory_bytes / (1024.0 * 1024 * 1024));
  if (configured.fits && configured.step_s > 0) {
    out += fmt::format(" ({:.2f}x the recipe's configuration)", configured.step_s / best->step_s);
  }
  return out + "\n";
}

}  // namespace tessera::planner
