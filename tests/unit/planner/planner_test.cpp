// The multi-job planner: the performance model's formulas, the schedule checks, the naive policies, and the MILP
// against exhaustive search.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tessera/distributed/sharding.h"
#include "tessera/planner/cluster.h"
#include "tessera/planner/gantt.h"
#include "tessera/planner/jobs.h"
#include "tessera/planner/perf_model.h"
#include "tessera/planner/schedule.h"
#include "test_util.h"

namespace tessera::planner {
namespace {

using dist::ShardingStrategy;

Cluster small_cluster(int64_t nodes, int64_t per_node) {
  Cluster c;
  c.nodes = nodes;
  c.devices_per_node = per_node;
  c.device_kind = "test";
  c.peak_flops = 100e12;
  c.memory_bytes = 16.0 * 1024 * 1024 * 1024;
  c.startup_s = 30;
  c.intra_node = {100e9, 5e-6};
  c.inter_node = {10e9, 20e-6};
  return c;
}

JobProfile job(std::string name, double params, int64_t steps, int64_t batch = 64) {
  JobProfile p;
  p.name = std::move(name);
  p.largest_unit_params = static_cast<int64_t>(params / 24);  // 24 blocks
  p.n_params = 24 * p.largest_unit_params;
  p.seq_len = 2048;
  p.flops_per_token = 6 * params + 12.0 * 24 * 2048 * 2048;
  p.global_batch = batch;
  p.steps = steps;
  p.activation_bytes_per_sample = 2048.0 * 24 * 34 * 2048;  // ~34 bytes per hidden unit and layer
  p.activation_bytes_per_sample_ckpt = 2048.0 * 24 * 2 * 2048;
  return p;
}

std::vector<PlanJob> plan_jobs(const std::vector<JobProfile>& profiles, const Cluster& cluster) {
  std::vector<PlanJob> out;
  for (const JobProfile& p : profiles) out.push_back({p, best_candidates(p, cluster)});
  return out;
}

TEST(PerfModel, MemoryIsZeroAccountingPlusOneMicrobatchOfActivations) {
  const Cluster cluster = small_cluster(1, 4);
  const JobProfile p = job("a", 1e9, 100);
  for (ShardingStrategy s :
       {ShardingStrategy::kNoShard, ShardingStrategy::kShardGradOp, ShardingStrategy::kFullShard}) {
    for (bool ckpt : {false, true}) {
      const Candidate c = model_candidate(p, cluster, 4, s, ckpt, 2);
      const dist::StateMemory state = dist::state_memory_per_rank(p.n_params, s, 4, 4, true, 2, p.largest_unit_params);
      const double act = ckpt ? p.activation_bytes_per_sample_ckpt : p.activation_bytes_per_sample;
      EXPECT_DOUBLE_EQ(c.memory_bytes, state.total() + 2 * act);
      EXPECT_EQ(c.fits, c.memory_bytes <= cluster.memory_bytes * cluster.usable_memory);
      EXPECT_EQ(c.microbatches, 8);  // 64 / 4 devices / 2 per microbatch
    }
  }
}

TEST(PerfModel, StepTimeFollowsTheComputeAndZeroTrafficFormulas) {
  Cluster cluster = small_cluster(2, 4);
  cluster.overlap = 0;  // step = compute + communication
  const JobProfile p = job("a", 1e9, 100);
  const double bytes = 2.0 * static_cast<double>(p.n_params);  // mixed precision: 2 bytes per parameter
  // One device: compute only.
  const Candidate one = model_candidate(p, cluster, 1, ShardingStrategy::kNoShard, false, 64);
  EXPECT_DOUBLE_EQ(one.compute_s, p.flops_per_token * p.tokens_per_step() / (100e12 * 0.4));
  EXPECT_EQ(one.communication_s, 0);
  // DDP on 4 devices of a node: 2 (n-1)/n P over the intra-node link plus 2 (n-1) latencies.
  const Candidate ddp = model_candidate(p, cluster, 4, ShardingStrategy::kNoShard, false, 16);
  EXPECT_NEAR(ddp.communication_s, 2 * 0.75 * bytes / 100e9 + 6 * 5e-6, 1e-12);
  EXPECT_NEAR(ddp.compute_s, one.compute_s / 4, 1e-12);
  EXPECT_NEAR(ddp.step_s, ddp.compute_s + ddp.communication_s, 1e-12);
  // FULL_SHARD moves 3 (n-1)/n P per microbatch; activation checkpointing recomputes the forward (x 4/3).
  const Candidate fsdp = model_candidate(p, cluster, 4, ShardingStrategy::kFullShard, true, 4);
  EXPECT_EQ(fsdp.microbatches, 4);
  EXPECT_NEAR(fsdp.communication_s, 3 * 0.75 * bytes * 4 / 100e9 + 6 * 24 * 4 * 3 / 2 * 5e-6, 1e-9);
  EXPECT_NEAR(fsdp.compute_s, ddp.compute_s * 4 / 3, 1e-12);
  // Across two nodes the ring runs at the inter-node rate.
  const Candidate wide = model_candidate(p, cluster, 8, ShardingStrategy::kNoShard, false, 8);
  EXPECT_EQ(wide.nodes, 2);
  EXPECT_NEAR(wide.communication_s, 2 * 0.875 * bytes / 10e9 + 14 * 20e-6, 1e-12);
  // Overlap hides communication up to that fraction of the compute.
  cluster.overlap = 0.5;
  const Candidate hidden = model_candidate(p, cluster, 4, ShardingStrategy::kNoShard, false, 16);
  EXPECT_NEAR(hidden.step_s, hidden.compute_s + std::max(0.0, hidden.communication_s - 0.5 * hidden.compute_s), 1e-12);
  EXPECT_DOUBLE_EQ(hidden.duration_s, cluster.startup_s + 100 * hidden.step_s);
}

TEST(PerfModel, ExpertParallelismAddsItsTokenExchangesAndRunsOnlyWhereTheGroupsFit) {
  Cluster cluster = small_cluster(2, 4);
  cluster.overlap = 0;
  JobProfile dense = job("a", 1e9, 100);
  JobProfile moe = dense;
  moe.experts = {4, dense.n_params / 2, dense.largest_unit_params / 2};
  moe.moe_layers = 24;
  moe.all_to_all_bytes_per_token = 1e5;
  const Candidate d = model_candidate(dense, cluster, 4, ShardingStrategy::kFullShard, false, 4);
  const Candidate m = model_candidate(moe, cluster, 4, ShardingStrategy::kFullShard, false, 4);
  // 64 x 2048 tokens over 4 devices, 1e5 bytes each over the node's link, 3 hops per exchange, 4 exchanges per layer
  // and microbatch.
  EXPECT_NEAR(m.communication_s - d.communication_s, 1e5 * 64 * 2048 / 4 / 100e9 + 3 * 4 * 24 * 4 * 5e-6, 1e-9);
  EXPECT_EQ(m.fits, m.memory_bytes <= cluster.memory_bytes * cluster.usable_memory) << "4 devices hold a group";
  EXPECT_LT(m.memory_bytes, d.memory_bytes) << "each rank gathers only its experts";
  // With activation checkpointing the forward's exchanges run again.
  const Candidate mc = model_candidate(moe, cluster, 4, ShardingStrategy::kFullShard, true, 4);
  const Candidate dc = model_candidate(dense, cluster, 4, ShardingStrategy::kFullShard, true, 4);
  EXPECT_NEAR(mc.communication_s - dc.communication_s, 1.5e5 * 64 * 2048 / 4 / 100e9 + 3 * 6 * 24 * 4 * 5e-6, 1e-9);
  // Two devices do not hold a group of 4, and NO_SHARD is not run with expert parallelism.
  EXPECT_FALSE(model_candidate(moe, cluster, 2, ShardingStrategy::kFullShard, false, 4).fits);
  EXPECT_FALSE(model_candidate(moe, cluster, 4, ShardingStrategy::kNoShard, false, 4).fits);
}

TEST(PerfModel, TensorParallelismDividesTheBatchOverGroupsAndAddsItsAllReduces) {
  Cluster cluster = small_cluster(2, 4);
  cluster.overlap = 0;
  JobProfile dense = job("a", 1e9, 100);
  JobProfile split = dense;
  split.tensor_split = {1, dense.n_params * 9 / 10, dense.largest_unit_params * 9 / 10};
  split.tensor_parallel_degrees = {2, 4};
  split.tensor_parallel_layers = 24;
  split.d_model = 2048;
  const Candidate d = model_candidate(split, cluster, 4, ShardingStrategy::kFullShard, false, 4);
  const Candidate t = model_candidate(split, cluster, 4, ShardingStrategy::kFullShard, false, 4, 2);
  EXPECT_EQ(t.describe(), "TP 2 x FULL_SHARD, microbatch 4");
  // 2 data-parallel ranks read the 64 samples: 32 each, 8 microbatches of 4 (4 without TP: 16 each).
  EXPECT_EQ(t.microbatches, 8);
  EXPECT_EQ(d.microbatches, 4);
  EXPECT_DOUBLE_EQ(t.compute_s, d.compute_s) << "the same work over the same devices";
  // The all-reduces: 4 per layer and microbatch of 32 x 2048 tokens x 2048 values in bf16, 2 (T - 1) / T of them
  // sent, 2 (T - 1) latency hops each, on the node's link, on top of the sharding traffic (the dense tenth and half
  // of the split parameters: 0.55 of a copy).
  const double all_reduce = dist::tensor_parallel_all_reduce_bytes(32 * 2048, 2048, 24, 2, 2, false);
  EXPECT_DOUBLE_EQ(all_reduce, 4.0 * 24 * 32 * 2048 * 2048 * 2 * 1.0);
  const double sharding = 3.0 * 0.75 * static_cast<double>(split.n_params) * 2 * 0.55 * 8;
  EXPECT_NEAR(t.communication_s,
              sharding / 100e9 + 6.0 * 24 * 8 * 3 / 2 * 5e-6 + all_reduce / 100e9 + 2.0 * 4 * 24 * 8 * 5e-6, 1e-6);
  EXPECT_LT(t.memory_bytes, d.memory_bytes) << "activations halved by sequence parallelism";
  // Degrees the model does not divide into, NO_SHARD, and a job whose model declares no split layers do not run.
  EXPECT_FALSE(model_candidate(split, cluster, 8, ShardingStrategy::kFullShard, false, 4, 8).fits);
  EXPECT_FALSE(model_candidate(split, cluster, 4, ShardingStrategy::kNoShard, false, 4, 2).fits);
  EXPECT_FALSE(model_candidate(dense, cluster, 4, ShardingStrategy::kFullShard, false, 4, 2).fits);
  // The enumeration offers the degrees the model and a node allow.
  std::set<int64_t> offered;
  for (const Candidate& c : enumerate_candidates(split, cluster)) offered.insert(c.tensor_parallel);
  EXPECT_EQ(offered, (std::set<int64_t>{1, 2, 4}));
  // The dry run's recommendation names the fastest on the given device count.
  const std::string rec = render_recommendation(split, cluster, 8, t);
  EXPECT_NE(rec.find("recommendation"), std::string::npos) << rec;
  EXPECT_NE(render_recommendation(job("huge", 1e12, 10), cluster, 8, t).find("nothing the model considers fits 8"),
            std::string::npos);
}

TEST(PerfModel, ContextParallelismDividesTheSequenceAndAddsItsKeyValueGathers) {
  Cluster cluster = small_cluster(2, 4);
  cluster.overlap = 0;
  JobProfile j = job("a", 1e9, 100);
  j.tensor_split = {1, j.n_params * 9 / 10, j.largest_unit_params * 9 / 10};
  j.tensor_parallel_degrees = {2, 4};
  j.tensor_parallel_layers = 24;
  j.d_model = 2048;
  j.context_parallel_degrees = {2, 4};
  const Candidate d = model_candidate(j, cluster, 4, ShardingStrategy::kFullShard, false, 4);
  const Candidate c = model_candidate(j, cluster, 4, ShardingStrategy::kFullShard, false, 4, 1, 2);
  EXPECT_EQ(c.describe(), "CP 2 x FULL_SHARD, microbatch 4");
  // 2 data-parallel ranks read the 64 samples (32 each: 8 microbatches of 4), the same work over the same devices.
  EXPECT_EQ(c.microbatches, 8);
  EXPECT_EQ(d.microbatches, 4);
  EXPECT_DOUBLE_EQ(c.compute_s, d.compute_s);
  // Memory: the same state; per sample of a microbatch, half the activations plus 1024 x 2048 mask rows in bf16.
  EXPECT_NEAR(c.memory_bytes - d.memory_bytes, 4 * (1024.0 * 2048 * 2 - j.activation_bytes_per_sample / 2), 1.0);
  // The gathers: K and V of 4 x 2048 tokens x 2048 values in bf16 per layer and microbatch, half of them received,
  // in forward and again (the gradients' reduce-scatter) in backward: 24 layers x 8 microbatches, 1 hop each.
  const double kv = 4.0 * 2048 * 2 * 2048 * 2;
  EXPECT_NEAR(c.tensor_communication_s, 0.5 * kv * 2 * 24 * 8 / 100e9 + 2.0 * 2 * 24 * 8 * 5e-6, 1e-9);
  EXPECT_GT(model_candidate(j, cluster, 4, ShardingStrategy::kFullShard, true, 4, 1, 2).tensor_communication_s,
            c.tensor_communication_s)
      << "recomputed layers gather again";
  // Degrees the model does not run, groups of T x C larger than a node, and models without context shards do not run.
  EXPECT_FALSE(model_candidate(j, cluster, 8, ShardingStrategy::kFullShard, false, 4, 1, 8).fits);
  EXPECT_FALSE(model_candidate(j, cluster, 8, ShardingStrategy::kFullShard, false, 4, 2, 4).fits);
  JobProfile none = j;
  none.context_parallel_degrees.clear();
  EXPECT_FALSE(model_candidate(none, cluster, 4, ShardingStrategy::kFullShard, false, 4, 1, 2).fits);
  std::set<std::pair<int64_t, int64_t>> offered;
  for (const Candidate& x : enumerate_candidates(j, cluster)) offered.insert({x.tensor_parallel, x.context_parallel});
  EXPECT_TRUE(offered.count({1, 2}) && offered.count({1, 4}) && offered.count({2, 2}));
  EXPECT_FALSE(offered.count({2, 4}) || offered.count({4, 2})) << "groups of 8 span two nodes of 4";
  // A sequence of 32768 tokens whose activations (12 GiB a sample, 11.5 with checkpointing) no device holds: only
  // context parallelism fits it on 4 devices, and the recommendation says so.
  JobProfile long_seq = j;
  long_seq.tensor_parallel_degrees.clear();
  long_seq.seq_len = 32768;
  long_seq.activation_bytes_per_sample = 12.0 * 1024 * 1024 * 1024;
  long_seq.activation_bytes_per_sample_ckpt = 11.5 * 1024 * 1024 * 1024;
  const std::string rec = render_recommendation(long_seq, cluster, 4, d);
  EXPECT_NE(rec.find("recommendation      CP "), std::string::npos) << rec;
  long_seq.context_parallel_degrees.clear();
  EXPECT_NE(render_recommendation(long_seq, cluster, 4, d).find("nothing the model considers fits 4"),
            std::string::npos);
}

TEST(PerfModel, CandidatesFitAndTheBestAreFasterWithEachDeviceCountTheyKeep) {
  const Cluster cluster = small_cluster(2, 4);
  const JobProfile big = job("big", 3e9, 100);  // 48 GB of Adam state: only sharded over several devices
  const std::vector<Candidate> all = enumerate_candidates(big, cluster);
  ASSERT_FALSE(all.empty());
  for (const Candidate& c : all) {
    EXPECT_TRUE(c.fits);
    EXPECT_LE(c.memory_bytes, cluster.memory_bytes * cluster.usable_memory);
    if (c.devices == 1) {
      EXPECT_EQ(c.strategy, ShardingStrategy::kNoShard);
    }
    if (c.strategy == ShardingStrategy::kHybridShard) {
      EXPECT_GT(c.devices, cluster.devices_per_node);
    }
  }
  EXPECT_FALSE(model_candidate(big, cluster, 1, ShardingStrategy::kNoShard, true, 1).fits);
  const std::vector<Candidate> best = best_candidates(big, cluster);
  ASSERT_FALSE(best.empty());
  EXPECT_GT(best.front().devices, 1);
  for (size_t i = 1; i < best.size(); ++i) {
    EXPECT_GT(best[i].devices, best[i - 1].devices);
    EXPECT_LT(best[i].duration_s, best[i - 1].duration_s);
  }
  // Each kept configuration is the fastest of its device count.
  for (const Candidate& b : best) {
    for (const Candidate& c : all) {
      if (c.devices == b.devices) {
        EXPECT_GE(c.step_s, b.step_s);
      }
    }
  }
  // max_nodes 1 (the default): nothing across nodes.
  for (const Candidate& c : best) EXPECT_LE(c.devices, cluster.devices_per_node);
}

TEST(Schedule, CheckNamesEveryBrokenConstraint) {
  const Cluster cluster = small_cluster(1, 4);
  const std::vector<PlanJob> jobs = plan_jobs({job("a", 1e8, 50), job("b", 1e8, 50)}, cluster);
  const Schedule ok = greedy_schedule(jobs, cluster);
  ASSERT_TRUE(check_schedule(ok, jobs, cluster).empty());

  auto first_problem = [&](const std::function<void(Schedule&)>& edit) {
    Schedule s = ok;
    edit(s);
    const std::vector<std::string> bad = check_schedule(s, jobs, cluster);
    return bad.empty() ? std::string("(valid)") : bad.front();
  };
  // Two jobs on the same devices at once (the jobs are alike, so their options are too).
  EXPECT_NE(first_problem([](Schedule& s) {
              s.placements[1] = s.placements[0];
              s.placements[1].job = 1;
            }).find("runs two jobs at once"),
            std::string::npos);
  // A run shorter than the option's duration.
  EXPECT_NE(first_problem([](Schedule& s) { s.placements[0].end_s -= 10; }).find("runs"), std::string::npos);
  // The wrong number of devices.
  EXPECT_NE(first_problem([](Schedule& s) { s.placements[0].devices.pop_back(); }).find("devices given"),
            std::string::npos);
  // A job left out.
  EXPECT_NE(first_problem([](Schedule& s) { s.placements.pop_back(); }).find("placed 0 times"), std::string::npos);
  // A device that does not exist.
  EXPECT_NE(first_problem([](Schedule& s) { s.placements[0].devices.back() = 99; }).find("does not exist"),
            std::string::npos);
}

// Where a device count has measured configurations, only they compete (a measurement is trusted over the model).
TEST(PerfModel, SelectBestTrustsMeasuredConfigurationsOverModelledOnes) {
  const Cluster cluster = small_cluster(1, 4);
  const JobProfile p = job("a", 2e8, 100);
  std::vector<Candidate> all = enumerate_candidates(p, cluster);
  const std::vector<Candidate> modelled = best_candidates(p, cluster);
  ASSERT_GE(modelled.size(), 2u);
  // Measure one 1-device configuration other than the model's best, slower than the model said.
  Candidate* measured = nullptr;
  for (Candidate& c : all) {
    if (c.devices == 1 && c.microbatch != modelled.front().microbatch) measured = &c;
  }
  ASSERT_NE(measured, nullptr);
  measured->profiled = true;
  measured->step_s *= 1.5;
  measured->startup_s = 7;
  measured->duration_s = 7 + static_cast<double>(p.steps) * measured->step_s;
  const std::vector<Candidate> best = select_best(all);
  ASSERT_FALSE(best.empty());
  EXPECT_EQ(best.front().devices, 1);
  EXPECT_TRUE(best.front().profiled);
  EXPECT_EQ(best.front().microbatch, measured->microbatch);
  EXPECT_DOUBLE_EQ(best.front().duration_s, measured->duration_s);
  // The other device counts, unmeasured, keep the model's choice.
  for (size_t i = 1; i < best.size(); ++i) EXPECT_FALSE(best[i].profiled);
}

// Re-planning: a running job's continuing option stays where it runs from time 0; the solver moves the job only when
// a restart elsewhere ends sooner, and every schedule passes the checks (which name a misplaced continuation).
TEST(Replan, ARunningJobGoesOnWhereItRunsUnlessMovingItEndsSooner) {
  const Cluster cluster = small_cluster(1, 2);
  const JobProfile p = job("a", 2e8, 200, 16);
  const std::vector<Candidate> options = best_candidates(p, cluster);
  ASSERT_EQ(options.size(), 2u);  // 1 and 2 devices
  ASSERT_LT(options[1].duration_s, options[0].duration_s);
  auto running = [&](double left_s) {
    PlanJob j(p, {});
    Candidate go_on = options[0];
    go_on.duration_s = left_s;
    j.options = {go_on, options[1]};
    j.running_option = 0;
    j.running_devices = {1};
    return j;
  };
  SolveOptions o;
  o.slots = 16;
  o.time_limit_s = 10;
  // Little left: it goes on, on device 1, from 0.
  {
    const std::vector<PlanJob> jobs = {running(10)};
    const SolveResult r = solve_milp(jobs, cluster, o);
    ASSERT_TRUE(check_schedule(r.schedule, jobs, cluster).empty()) << check_schedule(r.schedule, jobs, cluster).front();
    EXPECT_EQ(r.schedule.placements[0].option, 0);
    EXPECT_EQ(r.schedule.placements[0].devices, std::vector<int64_t>{1});
    EXPECT_DOUBLE_EQ(r.schedule.placements[0].start_s, 0);
  }
  // Much left and the other device idle: restarting on both devices ends sooner.
  {
    const std::vector<PlanJob> jobs = {running(2 * options[1].duration_s)};
    const SolveResult r = solve_milp(jobs, cluster, o);
    ASSERT_TRUE(check_schedule(r.schedule, jobs, cluster).empty());
    EXPECT_EQ(r.schedule.placements[0].option, 1);
    EXPECT_EQ(r.schedule.placements[0].devices.size(), 2u);
  }
  // The same, but a pending job keeps device 0 busy: moving would wait for it, so the running job goes on.
  {
    PlanJob other(job("b", 2e8, 150, 16), {});
    other.options = {best_candidates(other.profile, cluster).front()};
    const std::vector<PlanJob> jobs = {running(1.2 * options[1].duration_s), other};
    const SolveResult r = solve_milp(jobs, cluster, o);
    ASSERT_TRUE(check_schedule(r.schedule, jobs, cluster).empty());
    EXPECT_EQ(r.schedule.placements[0].option, 0);
    EXPECT_EQ(r.schedule.placements[1].devices, std::vector<int64_t>{0});
    EXPECT_DOUBLE_EQ(r.schedule.placements[1].start_s, 0);
    // The greedy schedule never moves a running job either.
    const Schedule g = greedy_schedule(jobs, cluster);
    EXPECT_TRUE(check_schedule(g, jobs, cluster).empty());
    EXPECT_EQ(g.placements[0].devices, std::vector<int64_t>{1});
  }
  // The checks name a continuation placed elsewhere or later.
  {
    const std::vector<PlanJob> jobs = {running(10)};
    Schedule s = greedy_schedule(jobs, cluster);
    s.placements[0].devices = {0};
    const std::vector<std::string> bad = check_schedule(s, jobs, cluster);
    ASSERT_FALSE(bad.empty());
    EXPECT_NE(bad.front().find("continues where it runs"), std::string::npos) << bad.front();
  }
}

// Random instances: every policy's schedule passes the checks, and the MILP's is never longer than sequential.
TEST(Schedule, EveryPolicyMeetsTheConstraintsOnRandomInstances) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 6; ++trial) {
    const Cluster cluster = small_cluster(1 + trial % 2, 4);
    std::vector<JobProfile> profiles;
    const int n = 3 + trial % 3;
    for (int i = 0; i < n; ++i) {
      JobProfile p = job("job" + std::to_string(i), std::uniform_real_distribution<double>(5e7, 2e9)(rng),
                         std::uniform_int_distribution<int64_t>(20, 400)(rng));
      p.max_nodes = trial % 2 == 0 ? 1 : 2;
      profiles.push_back(p);
    }
    const std::vector<PlanJob> jobs = plan_jobs(profiles, cluster);
    SolveOptions options;
    options.slots = 12;
    options.time_limit_s = 1;  // the checks hold for any incumbent, proven optimal or not
    const SolveResult r = solve_milp(jobs, cluster, options);
    const Schedule best_greedy = best_greedy_schedule(jobs, cluster, Objective::kMakespan);
    for (const Schedule& s : {r.schedule, sequential_schedule(jobs, cluster), equal_split_schedule(jobs, cluster),
                              greedy_schedule(jobs, cluster), best_greedy}) {
      const std::vector<std::string> bad = check_schedule(s, jobs, cluster);
      EXPECT_TRUE(bad.empty()) << s.policy << ": " << (bad.empty() ? "" : bad.front());
    }
    // The solver starts from the best capped greedy schedule, which is never worse than plain greedy.
    EXPECT_LE(best_greedy.makespan_s(), greedy_schedule(jobs, cluster).makespan_s() + 1e-9);
    EXPECT_LE(r.schedule.makespan_s(), best_greedy.makespan_s() + 1e-6);
    EXPECT_TRUE(r.model.feasible(r.selected, cluster.devices_per_node, cluster.nodes));
    // The compacted schedule starts no job later than its slot.
    for (const Placement& p : r.greedy_kept ? std::vector<Placement>{} : r.schedule.placements) {
      const SlotModel::Choice& c = r.model.choices[static_cast<size_t>(r.selected[static_cast<size_t>(p.job)])];
      EXPECT_LE(p.start_s, static_cast<double>(c.start) * r.model.slot_s + 1e-6);
    }
    EXPECT_LE(r.schedule.makespan_s(), r.objective_slots * r.model.slot_s + 1e-6);
    EXPECT_LE(r.bound_slots, r.objective_slots);
  }
}

// The best objective over every selection of the slot model, by depth-first search with the capacity checked as it
// goes.
double exhaustive_optimum(const SlotModel& m, int n_jobs, int64_t per_node, int64_t nodes) {
  std::vector<std::vector<int>> by_job(static_cast<size_t>(n_jobs));
  for (size_t i = 0; i < m.choices.size(); ++i)
    by_job[static_cast<size_t>(m.choices[i].job)].push_back(static_cast<int>(i));
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> chosen;
  std::function<void(int)> search = [&](int j) {
    if (!m.feasible(chosen, per_node, nodes)) return;
    if (j == n_jobs) {
      best = std::min(best, m.objective_of(chosen));
      return;
    }
    for (int i : by_job[static_cast<size_t>(j)]) {
      chosen.push_back(i);
      if (m.objective_of(chosen) < best) search(j + 1);  // both objectives only grow as jobs are added
      chosen.pop_back();
    }
  };
  search(0);
  return best;
}

// Solves a small instance (6 slots) and checks that the solver proved its choice optimal and that it is the optimum
// of exhaustive search over the same slot model.
SolveResult solve_small_exactly(const std::vector<PlanJob>& jobs, const Cluster& cluster, Objective objective,
                                int trial) {
  SolveOptions options;
  options.slots = 6;
  options.time_limit_s = 60;
  options.objective = objective;
  const SolveResult r = solve_milp(jobs, cluster, options);
  EXPECT_TRUE(r.optimal) << "trial " << trial;
  const double brute =
      exhaustive_optimum(r.model, static_cast<int>(jobs.size()), cluster.devices_per_node, cluster.nodes);
  EXPECT_NEAR(r.objective_slots, brute, 1e-9) << "trial " << trial << ", " << r.model.choices.size() << " choices";
  return r;
}

TEST(Milp, IsOptimalOnSmallInstancesByExhaustiveSearch) {
  std::mt19937 rng(11);
  int checked = 0;
  for (int trial = 0; trial < 8; ++trial) {
    const Cluster cluster = small_cluster(trial % 4 == 3 ? 2 : 1, trial % 2 == 0 ? 4 : 2);
    std::vector<JobProfile> profiles;
    for (int i = 0; i < 3; ++i) {
      JobProfile p = job("job" + std::to_string(i), std::uniform_real_distribution<double>(5e7, 1e9)(rng),
                         std::uniform_int_distribution<int64_t>(20, 300)(rng), 16);
      p.weight = 1 + i % 2;
      p.max_nodes = 2;
      profiles.push_back(p);
    }
    const std::vector<PlanJob> jobs = plan_jobs(profiles, cluster);
    for (Objective objective : {Objective::kMakespan, Objective::kWeightedCompletion}) {
      solve_small_exactly(jobs, cluster, objective, trial);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 16);
}

// With running jobs in the program, the solver is still optimal within the slot model (exhaustive search).
TEST(Replan, IsOptimalWithRunningJobsByExhaustiveSearch) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 4; ++trial) {
    const Cluster cluster = small_cluster(1, 4);
    std::vector<PlanJob> jobs;
    for (int i = 0; i < 3; ++i) {
      JobProfile p = job("job" + std::to_string(i), std::uniform_real_distribution<double>(5e7, 1e9)(rng),
                         std::uniform_int_distribution<int64_t>(20, 300)(rng), 16);
      jobs.emplace_back(p, best_candidates(p, cluster));
    }
    // Job 0 runs on devices 2 and 3 in its 2-device option, with a random part of it left.
    Candidate go_on = *std::find_if(jobs[0].options.begin(), jobs[0].options.end(),
                                    [](const Candidate& c) { return c.devices == 2; });
    go_on.duration_s *= std::uniform_real_distribution<double>(0.1, 1.0)(rng);
    jobs[0].options.insert(jobs[0].options.begin(), go_on);
    jobs[0].running_option = 0;
    jobs[0].running_devices = {2, 3};
    SolveOptions o;
    o.slots = 6;
    o.time_limit_s = 60;
    const SolveResult r = solve_milp(jobs, cluster, o);
    ASSERT_TRUE(r.optimal);
    ASSERT_TRUE(check_schedule(r.schedule, jobs, cluster).empty()) << check_schedule(r.schedule, jobs, cluster).front();
    EXPECT_NEAR(r.objective_slots, exhaustive_optimum(r.model, 3, cluster.devices_per_node, cluster.nodes), 1e-9)
        << "trial " << trial;
    for (const SlotModel::Choice& c : r.model.choices) {
      if (c.job == 0 && c.option == 0) {
        EXPECT_EQ(c.start, 0);
      }
    }
  }
}

// A job of one configuration: `seconds` on one device.
PlanJob one_device_job(const std::string& name, double seconds, double weight) {
  JobProfile p;
  p.name = name;
  p.weight = weight;
  Candidate c;
  c.step_s = seconds;
  c.duration_s = seconds;
  return {p, {c}};
}

// Deadlines come before the objective: a job with a deadline runs first even where the objective alone would put it
// last, a deadline that cannot be met is missed by as little as possible, and the table says which.
TEST(Milp, DeadlinesComeBeforeTheObjective) {
  const Cluster cluster = small_cluster(1, 1);
  std::vector<PlanJob> jobs = {one_device_job("big", 100, 100), one_device_job("small", 10, 1)};
  SolveOptions o;
  o.slots = 22;
  o.objective = Objective::kWeightedCompletion;
  // Without a deadline the heavy job goes first (100 x 100 + 110 against 100 x 110 + 10).
  SolveResult r = solve_milp(jobs, cluster, o);
  EXPECT_DOUBLE_EQ(r.schedule.placements[1].end_s, 110);
  // With one at 20 s the small job goes first, and the plan meets it.
  jobs[1].profile.deadline_s = 20;
  r = solve_milp(jobs, cluster, o);
  ASSERT_TRUE(check_schedule(r.schedule, jobs, cluster).empty());
  EXPECT_DOUBLE_EQ(r.schedule.placements[1].end_s, 10);
  EXPECT_DOUBLE_EQ(r.schedule.placements[0].end_s, 110);
  EXPECT_EQ(r.schedule.lateness_s(jobs), 0);
  EXPECT_EQ(r.late_slots, 0);
  EXPECT_NE(render_schedule(r.schedule, jobs, cluster).find("every deadline met (1 job)"), std::string::npos);
  // The same with the makespan objective, where the order changes nothing but the deadline.
  o.objective = Objective::kMakespan;
  r = solve_milp(jobs, cluster, o);
  EXPECT_DOUBLE_EQ(r.schedule.placements[1].end_s, 10);
  // A deadline no plan meets (5 s for 10 s of work): missed by the least, 5 s, and named in the table.
  jobs[1].profile.deadline_s = 5;
  r = solve_milp(jobs, cluster, o);
  EXPECT_DOUBLE_EQ(r.schedule.placements[1].end_s, 10);
  EXPECT_DOUBLE_EQ(r.schedule.lateness_s(jobs), 5);
  const std::string table = render_schedule(r.schedule, jobs, cluster);
  EXPECT_NE(table.find("LATE by 5.0 s"), std::string::npos) << table;
  EXPECT_NE(table.find("1 of 1 deadlines missed"), std::string::npos) << table;
  // The naive policies see deadlines too: greedy puts the jobs that have one first.
  jobs[1].profile.deadline_s = 20;
  EXPECT_DOUBLE_EQ(greedy_schedule(jobs, cluster).placements[1].end_s, 10);
  EXPECT_DOUBLE_EQ(sequential_schedule(jobs, cluster).lateness_s(jobs), 90);
}

// With deadlines on some jobs, the solver's choice is still the optimum of the slot model, lateness first
// (exhaustive search), and never later past the deadlines than the best greedy schedule.
TEST(Milp, WithDeadlinesIsOptimalByExhaustiveSearch) {
  std::mt19937 rng(23);
  int late_somewhere = 0;
  for (int trial = 0; trial < 6; ++trial) {
    const Cluster cluster = small_cluster(1, trial % 2 == 0 ? 4 : 2);
    std::vector<JobProfile> profiles;
    for (int i = 0; i < 3; ++i) {
      JobProfile p = job("job" + std::to_string(i), std::uniform_real_distribution<double>(5e7, 1e9)(rng),
                         std::uniform_int_distribution<int64_t>(20, 300)(rng), 16);
      p.weight = 1 + i % 2;
      profiles.push_back(p);
    }
    std::vector<PlanJob> jobs = plan_jobs(profiles, cluster);
    // Deadlines on two of the three jobs, between 0.4 and 1.2 times the deadline-free plan's makespan.
    const double makespan = best_greedy_schedule(jobs, cluster, Objective::kMakespan).makespan_s();
    for (int i = 0; i < 2; ++i) {
      jobs[static_cast<size_t>((trial + i) % 3)].profile.deadline_s =
          std::uniform_real_distribution<double>(0.4, 1.2)(rng) * makespan;
    }
    for (Objective objective : {Objective::kMakespan, Objective::kWeightedCompletion}) {
      const SolveResult r = solve_small_exactly(jobs, cluster, objective, trial);
      ASSERT_TRUE(check_schedule(r.schedule, jobs, cluster).empty());
      EXPECT_GT(r.model.late_weight, 0);
      const Schedule greedy = best_greedy_schedule(jobs, cluster, objective);
      EXPECT_LE(r.schedule.lateness_s(jobs), greedy.lateness_s(jobs) + 1e-6) << "trial " << trial;
      // A plan on time in its slots is on time in seconds (jobs start no later than their slots).
      if (r.late_slots == 0) {
        EXPECT_EQ(r.schedule.lateness_s(jobs), 0) << "trial " << trial;
      }
      late_somewhere += r.late_slots > 0 ? 1 : 0;
    }
  }
  // The deadlines are tight enough that some cannot all be met, and loose enough that some can.
  EXPECT_GT(late_somewhere, 0);
  EXPECT_LT(late_somewhere, 12);
}

// Saturn's workload shape: a grid of fine-tuning jobs over MPT 1B-13B (the shipped recipes) on 8 nodes of 8 H100,
// throughput from the performance model. The best capped greedy schedule is the solver's first incumbent, so whatever
// CBC reaches in its time limit, the plan is no longer than greedy's; against running the jobs one after another on
// as many devices as help each ("current practice") and an equal split it is at least 40% shorter (issue 21's goal).
TEST(Milp, OnASaturnShapedGridThePlanBeatsTheNaivePolicies) {
  const std::string data = std::string(testing::source_dir()) + "/tests/data/planner";
  const Cluster cluster = load_cluster(data + "/h100-64.yaml");
  std::vector<PlanJob> jobs;
  for (const JobSpec& spec : load_jobs(data + "/grid-16-jobs.yaml")) {
    const JobProfile p = profile_job(spec);
    jobs.push_back({p, best_candidates(p, cluster)});
  }
  ASSERT_EQ(jobs.size(), 16u);
  SolveOptions options;
  options.time_limit_s = 5;
  const SolveResult r = solve_milp(jobs, cluster, options);
  const std::vector<std::string> bad = check_schedule(r.schedule, jobs, cluster);
  ASSERT_TRUE(bad.empty()) << bad.front();
  const double plan = r.schedule.makespan_s();
  EXPECT_LE(plan, greedy_schedule(jobs, cluster).makespan_s() + 1e-6);
  EXPECT_LE(plan, 0.6 * sequential_schedule(jobs, cluster).makespan_s());
  EXPECT_LE(plan, 0.6 * equal_split_schedule(jobs, cluster).makespan_s());
  EXPECT_GE(plan, lower_bound_s(jobs, cluster) - 1e-6);
}

TEST(Gantt, EachJobsBarCoversItsDevicesAndTimesAndThePngDecodesToTheImage) {
  const Cluster cluster = small_cluster(2, 4);
  const std::vector<PlanJob> jobs =
      plan_jobs({job("a", 5e8, 200), job("b", 1e8, 100), job("c", 2e8, 300), job("d", 1e8, 50)}, cluster);
  const Schedule s = greedy_schedule(jobs, cluster);
  GanttLayout layout;
  layout.row_height = 20;
  const Image im = draw_gantt(s, cluster, layout);
  ASSERT_EQ(im.height, layout.top + 20 * 8 + layout.bottom);
  const int64_t plot = im.width - layout.left - 10;
  auto pixel = [&](int64_t x, int64_t y) {
    const uint8_t* p = &im.rgb[static_cast<size_t>((y * im.width + x) * 3)];
    return std::array<uint8_t, 3>{p[0], p[1], p[2]};
  };
  std::vector<std::vector<bool>> busy(8, std::vector<bool>(static_cast<size_t>(plot), false));
  for (const Placement& p : s.placements) {
    const int64_t x0 = layout.left + std::llround(p.start_s / s.makespan_s() * static_cast<double>(plot));
    const int64_t x1 = layout.left + std::llround(p.end_s / s.makespan_s() * static_cast<double>(plot));
    for (int64_t d : p.devices) {
      // The bar's colour at its right end (the number is at its left), in each of its devices' rows.
      EXPECT_EQ(pixel(std::max(x0, x1 - 1), layout.top + d * 20 + 18), gantt_job_colour(p.job)) << "job " << p.job;
      for (int64_t x = x0; x < x1; ++x) busy[static_cast<size_t>(d)][static_cast<size_t>(x - layout.left)] = true;
    }
  }
  // An idle device-time is background (away from the tick lines).
  bool checked_idle = false;
  for (int64_t d = 0; d < 8 && !checked_idle; ++d) {
    for (int64_t x = 5; x < plot - 5; ++x) {
      if (!busy[static_cast<size_t>(d)][static_cast<size_t>(x - 3)] &&
          !busy[static_cast<size_t>(d)][static_cast<size_t>(x)] &&
          !busy[static_cast<size_t>(d)][static_cast<size_t>(x + 3)] &&
          pixel(layout.left + x + 1, layout.top + d * 20 + 18) == kGanttBackground) {
        checked_idle = true;
        break;
      }
    }
  }
  EXPECT_TRUE(checked_idle) << "the greedy plan leaves some device idle for a while";
  EXPECT_NE(gantt_job_colour(0), gantt_job_colour(10));

  // The PNG: signature, IHDR, and the IDAT inflating to the image's scanlines.
  const std::filesystem::path path = std::filesystem::temp_directory_path() / "plan.png";
  write_png(im, path.string());
  std::ifstream in(path, std::ios::binary);
  const std::string png((std::istreambuf_iterator<char>(in)), {});
  ASSERT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  auto be32 = [&](size_t at) {
    return (static_cast<uint32_t>(static_cast<uint8_t>(png[at])) << 24) |
           (static_cast<uint32_t>(static_cast<uint8_t>(png[at + 1])) << 16) |
           (static_cast<uint32_t>(static_cast<uint8_t>(png[at + 2])) << 8) | static_cast<uint8_t>(png[at + 3]);
  };
  ASSERT_EQ(png.substr(12, 4), "IHDR");
  EXPECT_EQ(be32(16), static_cast<uint32_t>(im.width));
  EXPECT_EQ(be32(20), static_cast<uint32_t>(im.height));
  const size_t idat = 8 + 12 + 13;
  ASSERT_EQ(png.substr(idat + 4, 4), "IDAT");
  const uint32_t n = be32(idat);
  std::vector<uint8_t> raw(static_cast<size_t>(im.height * (im.width * 3 + 1)));
  uLongf raw_size = raw.size();
  ASSERT_EQ(uncompress(raw.data(), &raw_size, reinterpret_cast<const Bytef*>(png.data() + idat + 8), n), Z_OK);
  ASSERT_EQ(raw_size, raw.size());
  for (int64_t y = 0; y < im.height; ++y) {
    const uint8_t* line = &raw[static_cast<size_t>(y * (im.width * 3 + 1))];
    ASSERT_EQ(line[0], 0);
    ASSERT_EQ(std::memcmp(line + 1, &im.rgb[static_cast<size_t>(y * im.width * 3)], static_cast<size_t>(im.width * 3)),
              0)
        << "row " << y;
  }
  std::filesystem::remove(path);
}

// The SVG chart says in words what the PNG only colours: every job by name (escaped for XML) with its devices and
// times, a bar per run of consecutive devices carrying the same words as a tooltip, the nodes, and the time axis with
// its unit.
TEST(Gantt, TheSvgNamesEveryJobItsDevicesAndTimesAndLabelsTheAxis) {
  const Cluster cluster = small_cluster(2, 4);
  const std::vector<PlanJob> jobs =
      plan_jobs({job("llama <8b> & co", 5e8, 200), job("b", 1e8, 100), job("c", 2e8, 300), job("d", 1e8, 50)}, cluster);
  const Schedule s = greedy_schedule(jobs, cluster);
  const std::vector<std::string> names = {"llama <8b> & co", "b", "c", "d"};
  const std::string svg = gantt_svg(s, cluster, names);
  ASSERT_TRUE(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\"")) << svg;
  ASSERT_TRUE(svg.ends_with("</svg>\n"));
  EXPECT_EQ(svg.find("llama <8b>"), std::string::npos) << "names are escaped";
  auto count = [&](const std::string& part) {
    size_t n = 0;
    for (size_t at = svg.find(part); at != std::string::npos; at = svg.find(part, at + 1)) ++n;
    return n;
  };
  size_t runs = 0;
  for (const Placement& p : s.placements) {
    const std::string name = p.job == 0 ? "llama &lt;8b&gt; &amp; co" : names[static_cast<size_t>(p.job)];
    const std::string words = fmt::format("{}, {} {}", name, p.devices.size(), cluster.device_kind);
    // The legend's line, and the tooltip of each of the job's bars.
    EXPECT_EQ(count(">" + name + ": " + fmt::format("{} {}, ", p.devices.size(), cluster.device_kind)), 1u) << svg;
    for (size_t i = 0; i < p.devices.size(); ++i) {
      if (i == 0 || p.devices[i] != p.devices[i - 1] + 1) ++runs;
    }
    EXPECT_GE(count("<title>" + words + ": "), 1u) << words << "\n" << svg;
  }
  EXPECT_EQ(count("<title>"), runs);
  EXPECT_EQ(count(">node "), 2u);
  EXPECT_EQ(count(s.makespan_s() >= 3 * 3600 ? ">time (hours)<" : ">time (minutes)<"), 1u) << svg;
  EXPECT_EQ(count(">0</text>"), 1u) << "the axis starts at 0";
  EXPECT_EQ(count("greedy largest first plan: makespan "), 1u) << svg;
}

TEST(Jobs, AJobsFileNamesItsMistakes) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "planner_jobs";
  std::filesystem::create_directories(dir);
  const std::string recipe = std::string(testing::source_dir()) + "/recipes/mpt-125m.yaml";
  auto write = [&](const std::string& text) {
    std::ofstream(dir / "jobs.yaml") << text;
    return (dir / "jobs.yaml").string();
  };
  EXPECT_NE(testing::error_of([&] {
              load_jobs(write("jobs:\n  - recipe: " + recipe + "\n    max_nodez: 2\n"));
            }).find("jobs[0].max_nodez"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { load_jobs(write("jobs:\n  - recipe: nowhere.yaml\n")); }).find("nowhere.yaml"),
            std::string::npos);
  // A jobs or cluster file that cannot be read is called by its kind, not "the recipe file".
  EXPECT_EQ(testing::error_of([&] { load_jobs("/nonexistent/jobs.yaml"); }),
            "[plan] /nonexistent/jobs.yaml: cannot open the jobs file");
  EXPECT_EQ(testing::error_of([&] { load_cluster("/nonexistent/cluster.yaml"); }),
            "[plan] /nonexistent/cluster.yaml: cannot open the cluster file");
  EXPECT_NE(testing::error_of([&] {
              load_jobs(write("jobs:\n  - {recipe: " + recipe + ", name: a}\n  - {recipe: " + recipe + ", name: a}\n"));
            }).find("'a' names two jobs"),
            std::string::npos);
  const std::vector<JobSpec> specs =
      load_jobs(write("jobs:\n  - {recipe: " + recipe + ", max_duration: 1000ba, weight: 2, overrides: [seed=3]}\n"));
  ASSERT_EQ(specs.size(), 1u);
  EXPECT_EQ(specs[0].name, "mpt-125m-0");
  const JobProfile p = profile_job(specs[0]);
  EXPECT_EQ(p.steps, 1000);
  EXPECT_EQ(p.weight, 2);
  EXPECT_GT(p.n_params, 100'000'000);
  EXPECT_GT(p.activation_bytes_per_sample, p.activation_bytes_per_sample_ckpt);
  // The steps between the checkpoints a plan run saves (the profiler times trials with them when they are short).
  JobSpec saves = specs[0];
  saves.overrides.push_back("save_interval=20ba");
  EXPECT_EQ(profile_job(saves).save_interval_steps, 20);
  saves.overrides.back() = "save_interval=" + std::to_string(3 * p.global_batch + 1) + "sp";
  EXPECT_EQ(profile_job(saves).save_interval_steps, 4);  // a step is a whole batch: the save comes after the 4th
  saves.overrides.back() = "save_interval=1ep";
  EXPECT_EQ(profile_job(saves).save_interval_steps, 0);
  // Deadlines: seconds, or a number with s, m (min), h or d; anything else is named.
  const auto deadline = [&](const std::string& text) {
    return load_jobs(write("jobs:\n  - {recipe: " + recipe + ", deadline: " + text + "}\n"))[0].deadline_s;
  };
  EXPECT_EQ(deadline("90"), 90);
  EXPECT_EQ(deadline("90m"), 5400);
  EXPECT_EQ(deadline("1.5h"), 5400);
  EXPECT_EQ(deadline("2d"), 172800);
  EXPECT_FALSE(p.has_deadline());
  EXPECT_NE(testing::error_of([&] { deadline("soon"); }).find("jobs[0].deadline"), std::string::npos);
  EXPECT_NE(testing::error_of([&] { deadline("3w"); }).find("unknown unit \"w\""), std::string::npos);
  EXPECT_NE(testing::error_of([&] { deadline("-5m"); }).find("must be a positive time"), std::string::npos);
  JobSpec due = specs[0];
  due.deadline_s = 600;
  EXPECT_EQ(profile_job(due).deadline_s, 600);
  JobSpec epochs = specs[0];
  epochs.max_duration = "2ep";
  EXPECT_NE(testing::error_of([&] { profile_job(epochs); }).find("not in ba, sp or tok"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(Cluster, AClusterFileIsReadWithItsUnitsAndItsMistakesNamed) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "planner_cluster";
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& text) {
    std::ofstream(dir / "c.yaml") << text;
    return (dir / "c.yaml").string();
  };
  const Cluster c =
      load_cluster(write("nodes: 8\ndevices_per_node: 8\ndevice: {kind: H100, peak_tflops: 989, memory_gib: 80}\n"
                         "inter_node: {bandwidth_gbps: 50, latency_us: 10}\n"));
  EXPECT_EQ(c.devices(), 64);
  EXPECT_DOUBLE_EQ(c.peak_flops, 989e12);
  EXPECT_DOUBLE_EQ(c.memory_bytes, 80.0 * 1024 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(c.inter_node.bandwidth_bytes_per_s, 50e9);
  EXPECT_DOUBLE_EQ(c.inter_node.latency_s, 10e-6);
  EXPECT_NE(testing::error_of([&] { load_cluster(write("devices_per_node: 8\n")); }).find("device"), std::string::npos);
  EXPECT_NE(testing::error_of([&] {
              load_cluster(write("devices_per_node: 8\ndevice: {peak_tflops: 1, memory_gib: 1, mfu: 2}\n"));
            }).find("device.mfu"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera::planner
