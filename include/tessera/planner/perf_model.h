// The performance model: what a job's step costs in a given configuration on a given number of devices, for the
// configurations a planner may choose (docs/planner.md, "The performance model").
//
//   compute   flops_per_token * tokens_per_step / (devices * peak * mfu), x 4/3 with activation checkpointing
//             (the forward runs twice)
//   traffic   ZeRO's bytes per rank and step for the strategy, with P the bytes of one copy of the parameters
//             (2 per parameter in mixed precision), k = (n-1)/n for a collective over n ranks and m microbatches:
//               NO_SHARD       all-reduce of the gradients once per step           2kP
//               SHARD_GRAD_OP  reduce-scatter per microbatch, all-gather per step  kP(m + 1)
//               FULL_SHARD     two all-gathers and a reduce-scatter per microbatch 3kPm
//               HYBRID_SHARD   FULL_SHARD within the node, all-reduce of each shard across nodes
//   links     alpha-beta: bytes over the link's bandwidth plus a latency per ring step; a collective that spans
//             nodes runs at the inter-node link's rate
//   step      compute + the communication that does not hide behind `overlap` of the compute
//   tensor    with tensor (and sequence) parallelism of degree T, inside a node: the batch divides over devices / T
//             data-parallel ranks, the split weights' state over all devices as the experts' is
//             (dist::state_memory_per_rank), activations are 1 / T (sequence parallelism), the sharding traffic
//             moves the dense parameters and 1 / T of the split ones, and the layers' all-reduces
//             (dist::tensor_parallel_all_reduce_bytes, 2 (T - 1) latency hops each) are added whole: they sit between
//             the layers' computations and do not overlap them
//   context   with context parallelism of degree C (groups of C x T devices within a node): the batch divides over
//             devices / (T C) data-parallel ranks, the compute divides evenly (load-balanced chunks), activations are
//             1 / C plus the rank's rows of the attention mask (S / C x S per sample), and every attention layer
//             all-gathers the keys and values of the microbatch's sequences (reduce-scatter in backward, again in the
//             recomputation with activation checkpointing; (C - 1) latency hops each), counted at d_model wide each
//             (an upper bound for grouped-query attention) and not hidden
//
// Thread-safe (pure functions).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/distributed/sharding.h"
#include "tessera/planner/cluster.h"
#include "tessera/planner/jobs.h"

namespace tessera::planner {

struct Candidate {
  int64_t devices = 1;
  int64_t nodes = 1;  // devices / devices_per_node when the job spans nodes, else 1
  dist::ShardingStrategy strategy = dist::ShardingStrategy::kNoShard;
  int64_t tensor_parallel = 1;   // tensor-parallel degree (groups within a node)
  int64_t context_parallel = 1;  // context-parallel degree (groups within a node, outside the tensor-parallel ones)
  bool activation_checkpointing = false;
  int64_t microbatch = 1;             // samples per microbatch
  int64_t microbatches = 1;           // per step
  double memory_bytes = 0;            // per device: model state + one microbatch's activations
  double compute_s = 0;               // per step
  double communication_s = 0;         // per step, before overlap (tensor_communication_s included)
  double tensor_communication_s = 0;  // per step: tensor and context parallelism's collectives, never hidden
  double step_s = 0;                  // per step: modelled, or measured when `profiled`
  double startup_s = 0;               // from launch to the first step: the cluster's startup_s, or measured
  double duration_s = 0;              // startup_s + steps * step_s
  bool fits = true;                   // memory_bytes within the device's usable memory
  bool profiled = false;              // step_s and startup_s come from a trial run (planner/profiler.h)
  double modelled_step_s = 0;         // what the performance model predicts, kept beside a measurement

  // "FULL_SHARD, act. ckpt, microbatch 4"; "TP 8 x CP 2 x FULL_SHARD, ..." with tensor and context parallelism.
  std::string describe() const;
};

// One configuration's costs; fits = false when it needs more than the device's usable memory, or when the model or
// the cluster cannot run `tensor_parallel` (a degree the model does not divide into, one that does not divide a node's
// devices or `devices`, NO_SHARD) or `context_parallel` (a degree not in job.context_parallel_degrees, groups of
// tensor_parallel x context_parallel that do not divide a node's devices or `devices`). The data-parallel ranks
// (devices / (tensor_parallel x context_parallel)) must divide the job's global batch (std::invalid_argument
// otherwise).
Candidate model_candidate(const JobProfile& job, const Cluster& cluster, int64_t devices,
                          dist::ShardingStrategy strategy, bool activation_checkpointing, int64_t microbatch,
                          int64_t tensor_parallel = 1, int64_t context_parallel = 1);

// The device counts a job may run on: powers of two up to a node's devices, then whole nodes (2, 4, ... up to the
// job's max_nodes and the cluster's), each dividing the job's global batch (one sample or more per device group of the
// plain data-parallel layout; the dry run's recommendation also considers more devices than that).
std::vector<int64_t> device_counts(const JobProfile& job, const Cluster& cluster);

// Every configuration that fits, for each device count: the strategies that apply (one device: NO_SHARD only;
// HYBRID_SHARD only across nodes), the tensor- and context-parallel degrees the model and a node allow (1 and each of
// job.tensor_parallel_degrees, job.context_parallel_degrees), activation checkpointing off and on, and the microbatch
// sizes (powers of two up to the per-rank batch, and the per-rank batch itself).
std::vector<Candidate> enumerate_candidates(const JobProfile& job, const Cluster& cluster);

// The fastest fitting configuration per device count, without the device counts that are no faster than a smaller
// one: what the scheduler chooses from. Sorted by device count. Empty when nothing fits.
std::vector<Candidate> best_candidates(const JobProfile& job, const Cluster& cluster);
// The same choice among given configurations (modelled or profiled). Where a device count has profiled
// configurations, only they compete: a measurement is trusted over the model.
std::vector<Candidate> select_best(const std::vector<Candidate>& candidates);

// What the model predicts for one configuration on `devices` devices of `cluster`, against the same work on one device
// (`train --dry-run --cluster`): the step time, the throughput, the time to train, and the scaling efficiency,
// throughput on `devices` / (`devices` x throughput on one), which is compute_s / step_s since compute divides evenly.
struct ScalingEstimate {
  Candidate config;         // on `devices`
  double tokens_per_s = 0;  // all devices together
  double efficiency = 0;    // in (0, 1]
};
ScalingEstimate estimate_scaling(const JobProfile& job, const Cluster& cluster, int64_t devices,
                                 dist::ShardingStrategy strategy, bool activation_checkpointing, int64_t microbatch,
                                 int64_t tensor_parallel = 1, int64_t context_parallel = 1);
// The estimate as the dry run prints it (steps = 0: no time to train, e.g. a duration in epochs).
std::string render_estimate(const ScalingEstimate& e, const JobProfile& job, const Cluster& cluster);
// The fastest configuration the model finds on exactly `devices` devices (every strategy, tensor- and context-parallel
// degree whose data-parallel ranks divide the batch, activation checkpointing and microbatch size), against
// `configured` (the recipe's): the dry run's recommendation. Says so when nothing fits.
std::string render_recommendation(const JobProfile& job, const Cluster& cluster, int64_t devices,
                                  const Candidate& configured);

}  // namespace tessera::planner
