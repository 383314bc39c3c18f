// Dry-run planning: batch arithmetic and ZeRO memory accounting.
#include <gtest/gtest.h>

#include <cmath>

#include "models/llama/llama.h"
#include "models/mpt/mpt_config.h"
#include "tessera/optim/optimizer.h"
#include "tessera/trainer/plan.h"
#include "tessera/util/error.h"
#include "test_util.h"

namespace tessera::trainer {
namespace {

const std::string kRecipe = std::string(::tessera::testing::source_dir()) + "/recipes/mpt-125m.yaml";

TEST(Plan, BatchArithmeticFollowsLlmFoundry) {
  TrainConfig cfg = load_train_config(kRecipe);
  Plan p = make_plan(cfg, 8, 8);
  EXPECT_EQ(p.device_train_batch_size, 32);
  EXPECT_EQ(p.microbatches_per_step, 2);
  EXPECT_EQ(p.tokens_per_step, 256 * 2048);
  // Composer allows a microbatch that does not divide the device batch: 48 with 11 -> 11, 11, 11, 11, 4.
  cfg = load_train_config(kRecipe, {"global_train_batch_size=48", "device_train_microbatch_size=11"});
  p = make_plan(cfg, 1, 1);
  EXPECT_EQ(p.microbatch_sizes, (std::vector<int64_t>{11, 11, 11, 11, 4}));
  // A microbatch larger than the device batch is clipped to it.
  cfg = load_train_config(kRecipe, {"global_train_batch_size=16", "device_train_microbatch_size=64"});
  p = make_plan(cfg, 4, 4);
  EXPECT_EQ(p.microbatch_sizes, (std::vector<int64_t>{4}));
  EXPECT_THROW(make_plan(cfg, 3, 3), ConfigError);
}

TEST(Plan, ZeroMemoryPerRank) {
  const int64_t psi = 1000000;
  // Mixed-precision Adam: 2 + 2 + 12 bytes per parameter (the ZeRO paper's K = 12).
  auto none = dist::state_memory_per_rank(psi, dist::ShardingStrategy::kNoShard, 4, 4, true, 2, 0);
  EXPECT_DOUBLE_EQ(none.total(), 16.0 * psi);
  auto zero2 = dist::state_memory_per_rank(psi, dist::ShardingStrategy::kShardGradOp, 4, 4, true, 2, 0);
  EXPECT_DOUBLE_EQ(zero2.total(), 2.0 * psi + 14.0 * psi / 4);
  auto zero3 = dist::state_memory_per_rank(psi, dist::ShardingStrategy::kFullShard, 4, 4, true, 2, 1000);
  EXPECT_DOUBLE_EQ(zero3.params + zero3.grads + zero3.optimizer, 16.0 * psi / 4);
  EXPECT_DOUBLE_EQ(zero3.transient, 2 * 1000 * 2.0) << "two gathered units in bf16";
  // HYBRID_SHARD shards within a node only.
  auto hybrid = dist::state_memory_per_rank(psi, dist::ShardingStrategy::kHybridShard, 16, 8, true, 2, 0);
  EXPECT_DOUBLE_EQ(hybrid.total(), 16.0 * psi / 8);
  // fp32 with Lion: 4 (param) + 4 (grad) + 4 (momentum).
  auto lion = dist::state_memory_per_rank(psi, dist::ShardingStrategy::kNoShard, 1, 1, false, 1, 0);
  EXPECT_DOUBLE_EQ(lion.total(), 12.0 * psi);
}

TEST(Plan, ExpertParallelismSplitsTheExpertsOverTheirGroupAndSendsTheirTokens) {
  // A dMoE MPT whose 8 experts go to groups of 4 ranks, on 8 ranks.
  const std::string moe =
      "model.ffn_config={ffn_type: mb_dmoe, moe_num_experts: 8, moe_top_k: 2, mlp_type: glu, "
      "moe_world_size: 4}";
  const TrainConfig cfg = load_train_config(kRecipe, {moe, "global_train_batch_size=16", "precision=amp_bf16"});
  const Plan p = make_plan(cfg, 8, 8);
  const int64_t d = 768, f = 4 * d, layers = 12;
  EXPECT_EQ(p.experts.degree, 4);
  EXPECT_EQ(p.moe_layers, layers);
  EXPECT_EQ(p.experts.params, layers * 8 * 3 * f * d);
  EXPECT_EQ(p.experts.largest_unit_params, 8 * 3 * f * d);
  EXPECT_TRUE(p.expert_parallel_problem.empty()) << p.expert_parallel_problem;
  // Each rank trains 2 x 2048 tokens a step: every token's 2 rows of 768 bf16 values, 3/4 of them to other ranks,
  // out and back in forward and in backward, per layer.
  EXPECT_DOUBLE_EQ(p.all_to_all_bytes, 4.0 * layers * (2 * 2048) * 2 * d * 2 * 3 / 4);
  EXPECT_DOUBLE_EQ(p.all_to_all_bytes_ckpt, p.all_to_all_bytes * 1.5);
  // NO_SHARD is refused with expert parallelism: no row. Under FULL_SHARD the experts' resident share per rank is
  // the same as sharding them over all 8 (1/4 of them, over the 2 ranks that hold the same ones); what shrinks is
  // the gathered unit (this rank's experts only). SHARD_GRAD_OP keeps a quarter of the experts' parameters.
  ASSERT_EQ(p.memory.size(), 2u);
  EXPECT_EQ(p.memory[0].strategy, dist::ShardingStrategy::kShardGradOp);
  const auto plain = [&](dist::ShardingStrategy s) {
    return dist::state_memory_per_rank(p.n_params, s, 8, 8, true, 2, p.largest_unit_params);
  };
  const dist::StateMemory fs = p.memory[1].state, fs_plain = plain(dist::ShardingStrategy::kFullShard);
  EXPECT_NEAR(fs.params + fs.grads + fs.optimizer, fs_plain.params + fs_plain.grads + fs_plain.optimizer,
              1e-9 * fs_plain.total());
  EXPECT_DOUBLE_EQ(fs.transient, fs_plain.transient - 2.0 * 2 * (p.experts.largest_unit_params * 3 / 4));
  const dist::StateMemory sgo = p.memory[0].state, sgo_plain = plain(dist::ShardingStrategy::kShardGradOp);
  EXPECT_DOUBLE_EQ(sgo.params, sgo_plain.params - 2.0 * static_cast<double>(p.experts.params * 3 / 4));
  const std::string text = render_plan(cfg, p, "8 x cpu");
  EXPECT_NE(text.find("groups of 4 ranks, 2 of the 8 experts of each of 12 MoE layers per rank"), std::string::npos)
      << text;
  EXPECT_NE(text.find("token exchange"), std::string::npos) << text;
  // 6 ranks do not hold whole groups: the plan says so (train refuses it).
  const Plan six = make_plan(load_train_config(kRecipe, {moe, "global_train_batch_size=12"}), 6, 6);
  EXPECT_EQ(six.expert_parallel_problem, "6 rank(s) do not split into expert-parallel groups of 4");
  EXPECT_EQ(six.memory.size(), 3u);
  // DBRX (trained with expert parallelism) takes LLM Foundry's key too: 16 experts in groups of 8 on 256 ranks.
  const TrainConfig dbrx = load_train_config(std::string(::tessera::testing::source_dir()) + "/recipes/dbrx.yaml",
                                             {"model.ffn_config.moe_world_size=8"});
  const Plan pd = make_plan(dbrx, 256, 8);
  EXPECT_EQ(pd.experts.degree, 8);
  EXPECT_EQ(pd.experts.params, int64_t{40} * 16 * 3 * 10752 * 6144);
  EXPECT_EQ(pd.n_params, int64_t{131596523520});
  EXPECT_NE(render_plan(dbrx, pd, "256 x H100").find("2 of the 16 experts of each of 40 MoE layers"),
            std::string::npos);
  EXPECT_THROW(load_train_config(std::string(::tessera::testing::source_dir()) + "/recipes/dbrx.yaml",
                                 {"model.ffn_config.moe_world_size=3"}),
               ConfigError);
}

TEST(Plan, ComposersDataParallelDegreesSetHybridShardsGroups) {
  dist::ShardingOptions o;
  o.strategy = dist::ShardingStrategy::kHybridShard;
  EXPECT_EQ(dist::shard_group_size(o, 16, 8), 8) << "no degrees: the node";
  o.replicate_degree = 4;
  EXPECT_EQ(dist::shard_group_size(o, 16, 8), 4) << "shard degree -1: world / replicate";
  o.replicate_degree = 0;
  o.shard_degree = 2;
  EXPECT_EQ(dist::shard_group_size(o, 16, 8), 2);
  o.shard_degree = 3;
  EXPECT_THROW(dist::shard_group_size(o, 16, 8), ConfigError);
  o.shard_degree = -1;
  o.replicate_degree = 1;
  EXPECT_EQ(dist::shard_group_size(o, 16, 8), 16) << "replicate 1: sharded over the world";
  o.strategy = dist::ShardingStrategy::kFullShard;
  o.replicate_degree = 2;
  EXPECT_THROW(dist::shard_group_size(o, 16, 8), ConfigError) << "FULL_SHARD does not replicate";
  const TrainConfig cfg = load_train_config(
      kRecipe, {"fsdp_config.sharding_strategy=HYBRID_SHARD", "fsdp_config.data_parallel_replicate_degree=2"});
  const Plan p = make_plan(cfg, 8, 8);
  EXPECT_EQ(p.shard_group, 4);
  EXPECT_NE(render_plan(cfg, p, "8 x cpu").find("replicate 2 x shard 4"), std::string::npos);
  // 6 ranks (a batch they divide) with shard degree 4 and replicate 2: named.
  const TrainConfig six = load_train_config(
      kRecipe, {"fsdp_config.sharding_strategy=HYBRID_SHARD", "fsdp_config.data_parallel_replicate_degree=2",
                "fsdp_config.data_parallel_shard_degree=4", "global_train_batch_size=48"});
  try {
    make_plan(six, 6, 6);
    ADD_FAILURE() << "6 ranks are not 2 x 4";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("data_parallel_shard_degree (4) x data_parallel_replicate_degree (2) must "
                                         "equal the world size (6)"),
              std::string::npos)
        << e.what();
  }
}

TEST(Plan, TorchtitansParallelismSectionSetsTheDataParallelMesh) {
  // Without mpt-125m's fsdp_config (FULL_SHARD), whose strategy would have to agree.
  auto load = [](std::vector<std::string> overrides) {
    overrides.insert(overrides.begin(), "fsdp_config=null");
    return load_train_config(kRecipe, overrides);
  };
  auto mesh = [&](const std::vector<std::string>& overrides) {
    const TrainConfig cfg = load(overrides);
    return std::make_pair(cfg.fsdp.strategy, make_plan(cfg, 8, 8).shard_group);
  };
  using S = dist::ShardingStrategy;
  EXPECT_EQ(mesh({"parallelism={data_parallel_replicate_degree: 2}"}), std::make_pair(S::kHybridShard, int64_t{4}))
      << "HSDP: replicate 2 x shard the rest";
  EXPECT_EQ(mesh({"parallelism={data_parallel_replicate_degree: 2, data_parallel_shard_degree: 4}"}),
            std::make_pair(S::kHybridShard, int64_t{4}));
  EXPECT_EQ(mesh({"parallelism={data_parallel_replicate_degree: 8, data_parallel_shard_degree: 1}"}).first, S::kNoShard)
      << "replicate only: DDP";
  EXPECT_EQ(mesh({"parallelism={}"}), std::make_pair(S::kFullShard, int64_t{8})) << "torchtitan's defaults: FSDP";
  // Context parallelism: groups of C ranks read one batch and FSDP shards over them too (torchtitan's dp_shard x cp).
  EXPECT_EQ(mesh({"parallelism={data_parallel_replicate_degree: 2, context_parallel_degree: 2}"}),
            std::make_pair(S::kHybridShard, int64_t{4}));
  {
    const Plan whole = make_plan(load({"device_train_microbatch_size=1"}), 8, 8);
    const TrainConfig c = load({"parallelism={context_parallel_degree: 2}", "device_train_microbatch_size=1"});
    const Plan cp = make_plan(c, 8, 8);
    EXPECT_EQ(cp.device_train_batch_size, 2 * whole.device_train_batch_size) << "4 data-parallel ranks, not 8";
    EXPECT_EQ(cp.context_parallel_degree, 2);
    ASSERT_FALSE(cp.memory.empty());
    EXPECT_LT(cp.memory.back().activations, whole.memory.back().activations) << "half the positions per rank";
    EXPECT_NE(render_plan(c, cp, "8 x cpu").find("context parallelism"), std::string::npos);
  }
  EXPECT_EQ(mesh({"parallelism={fsdp_reshard_after_forward: never}"}).first, S::kShardGradOp);
  EXPECT_EQ(
      mesh({"parallelism={data_parallel_replicate_degree: 2}", "fsdp_config.sharding_strategy=HYBRID_SHARD"}).first,
      S::kHybridShard)
      << "an agreeing fsdp_config strategy";
  {
    const TrainConfig cfg = load({"parallelism={data_parallel_replicate_degree: 2}"});
    EXPECT_NE(render_plan(cfg, make_plan(cfg, 8, 8), "8 x cpu")
                  .find("replicate 2 x shard 4 (parallelism.data_parallel_*_degree)"),
              std::string::npos);
  }
  auto refused = [&](const std::vector<std::string>& overrides, int64_t world, const std::string& want) {
    try {
      make_plan(load(overrides), world, world);
      ADD_FAILURE() << "accepted: " << overrides.front();
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  refused({"parallelism={tensor_parallel_degree: 5}"}, 10, "MPT's 12 query and 12 key/value heads");
  refused({"parallelism={tensor_parallel_degree: 3}"}, 8, "tensor_parallel_degree (3) does not divide the world size");
  refused({"parallelism={context_parallel_degree: 3}"}, 8,
          "parallelism.context_parallel_degree (3) does not divide the world size (8)");
  refused({"parallelism={context_parallel_degree: 2, context_parallel_rotate_method: alltoall}"}, 8,
          "context_parallel_rotate_method");
  refused({"parallelism={context_parallel_degree: 2}", "max_seq_len=2046", "train_loader.dataset.max_seq_len=2046",
           "eval_loader.dataset.max_seq_len=2046", "model.max_seq_len=2046"},
          8, "a sequence of 2046 tokens does not cut into 4 equal chunks");
  refused({"parallelism={pipeline_parallel_degree: 3}"}, 8,
          "parallelism.pipeline_parallel_degree 3 does not divide the world size (8)");
  refused({"parallelism={pipeline_parallel_degree: 2, pipeline_parallel_schedule: DualPipeV}"}, 8, "DualPipeV");
  refused({"parallelism={pipeline_parallel_degree: 2, pipeline_parallel_schedule: Fancy}"}, 8,
          "unknown schedule \"Fancy\"; expected GPipe or 1F1B");
  refused({"parallelism={data_parallel_shard_degree: 3}"}, 8,
          "parallelism.data_parallel_shard_degree (3) x data_parallel_replicate_degree (1) must equal the world size "
          "(8)");
  refused({"parallelism={data_parallel_replicate_degree: 2}", "fsdp_config.sharding_strategy=SHARD_GRAD_OP"}, 8,
          "replicate 2 x shard the rest is HYBRID_SHARD but fsdp_config.sharding_strategy is SHARD_GRAD_OP");
  refused({"parallelism={data_parallel_replicate_degree: 2}", "fsdp_config.data_parallel_shard_degree=4"}, 8,
          "given in fsdp_config.data_parallel_shard_degree too");
  refused({"parallelism={data_parallel_replicate_degree: 2, fsdp_reshard_after_forward: never}"}, 8,
          "fsdp_reshard_after_forward");
  refused({"parallelism={expert_parallel_degree: 2}"}, 8, "expert_parallel_degree");
  refused({"parallelism={data_parallel_degree: 2}"}, 8, "data_parallel_degree");

  // expert_parallel_degree is the MoE layers' moe_world_size.
  const std::string dbrx_recipe = std::string(::tessera::testing::source_dir()) + "/recipes/dbrx.yaml";
  const TrainConfig dbrx = load_train_config(dbrx_recipe, {"parallelism={expert_parallel_degree: 8}"});
  EXPECT_EQ(make_plan(dbrx, 256, 8).experts.degree, 8);
  EXPECT_EQ(
      load_train_config(dbrx_recipe, {"parallelism={expert_parallel_degree: 8}", "model.ffn_config.moe_world_size=8"})
          .fsdp.strategy,
      dist::ShardingStrategy::kFullShard);
  try {
    make_plan(load_train_config(dbrx_recipe,
                                {"parallelism={expert_parallel_degree: 8}", "model.ffn_config.moe_world_size=4"}),
              256, 8);
    ADD_FAILURE() << "a degree the MoE layers' own option contradicts was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("parallelism.expert_parallel_degree 8 but the model's MoE layers ask for 4"),
              std::string::npos)
        << e.what();
  }
}

TEST(Plan, TensorParallelismSplitsTheBlocksWeightsAndSumsTheirOutputs) {
  EXPECT_DOUBLE_EQ(dist::tensor_parallel_all_reduce_bytes(1000, 10, 3, 4, 2, false), 12 * 20000 * 1.5);
  EXPECT_DOUBLE_EQ(dist::tensor_parallel_all_reduce_bytes(1000, 10, 3, 4, 2, true), 18 * 20000 * 1.5);
  EXPECT_EQ(dist::tensor_parallel_all_reduce_bytes(1000, 10, 3, 1, 2, true), 0);
  // mpt-125m on 8 ranks in groups of 2: 4 data-parallel ranks read the batch; each block's Wqkv, out_proj, up_proj
  // and down_proj split, with the column-parallel biases (12 x 7,083,264 parameters); the model state per rank
  // equals plain FULL_SHARD's (every
  // parameter still sharded over all 8 ranks), the gathered block shrinks.
  const TrainConfig plain = load_train_config(kRecipe);
  const TrainConfig tp2 = load_train_config(kRecipe, {"fsdp_config=null", "parallelism={tensor_parallel_degree: 2}"});
  const Plan p = make_plan(plain, 8, 8), t = make_plan(tp2, 8, 8);
  EXPECT_EQ(t.device_train_batch_size, 2 * p.device_train_batch_size);
  EXPECT_EQ(t.tensor_split.degree, 2);
  const int64_t block = int64_t{768} * 2304 + 2304 + 768 * 768 + 768 * 3072 + 3072 + 3072 * 768;
  const int64_t table = int64_t{50368} * 768;  // the tied embedding table and head, split along the vocabulary
  EXPECT_EQ(t.tensor_split.params, 12 * block + table);
  EXPECT_EQ(t.tensor_split.largest_unit_params, table);
  EXPECT_EQ(t.tensor_parallel_layers, 12);
  EXPECT_DOUBLE_EQ(t.tensor_all_reduce_bytes,
                   dist::tensor_parallel_all_reduce_bytes(t.device_train_batch_size * 2048, 768, 12, 2, 2, false));
  ASSERT_EQ(t.memory.size(), 2u) << "no NO_SHARD row";
  const MemoryRow& full = t.memory.back();
  const MemoryRow& full_plain = p.memory.back();
  ASSERT_EQ(full.strategy, dist::ShardingStrategy::kFullShard);
  EXPECT_NEAR(full.state.params, full_plain.state.params, 64.0);
  EXPECT_NEAR(full.state.optimizer, full_plain.state.optimizer, 256.0);
  EXPECT_LT(full.state.transient, full_plain.state.transient);
  const std::string text = render_plan(tp2, t, "8 x cpu");
  EXPECT_NE(text.find("groups of 2 ranks (4 data-parallel), 123,681,792 split parameters in 12 layers"),
            std::string::npos)
      << text;
  // A vocabulary that does not divide by the degree keeps the table and head whole: the blocks alone split.
  const TrainConfig odd = load_train_config(
      kRecipe, {"fsdp_config=null", "parallelism={tensor_parallel_degree: 2}", "model.vocab_size=50369"});
  EXPECT_EQ(make_plan(odd, 8, 8).tensor_split.params, 12 * block);
}

TEST(Plan, ActivationCheckpointingKeepsOnlyBlockInputs) {
  const TrainConfig cfg = load_train_config(kRecipe);
  const auto& m = std::any_cast<const models::MPTOptions&>(cfg.model.options);
  const double tokens = 16.0 * 2048;
  const double logits = tokens * 50368 * (2 + 4);
  const double block = tokens * (8 * 768 + 2 * 3072) * 2;  // bf16 values, no dropout
  EXPECT_DOUBLE_EQ(models::mpt_activation_bytes(m, 16, 2048, 2, false), 12 * block + logits);
  EXPECT_DOUBLE_EQ(models::mpt_activation_bytes(m, 16, 2048, 2, true), 12 * tokens * 768 * 2 + block + logits);
}

TEST(Plan, LlamaRecipesHaveThePublishedParameterCounts) {
  // Meta's figures for its releases: 8.03 B, 1.24 B and 70.6 B (the exact counts of the HF checkpoints).
  const std::map<std::string, int64_t> published = {
      {"llama3-8b", 8030261248}, {"llama3.2-1b", 1235814400}, {"llama3-70b", 70553706496}};
  for (const auto& [name, count] : published) {
    const TrainConfig cfg =
        load_train_config(std::string(::tessera::testing::source_dir()) + "/recipes/" + name + ".yaml");
    const auto& o = std::any_cast<const models::LlamaOptions&>(cfg.model.options);
    EXPECT_EQ(models::llama_param_count(o), count) << name;
    // The model itself, built on meta, has that many parameters; so does the plan `train --dry-run` prints.
    EXPECT_EQ(models::model_registry().build("llama", cfg.model, "meta", 0)->num_params(), count) << name;
    EXPECT_EQ(make_plan(cfg, 64, 8).n_params, count) << name;
  }
}

TEST(Plan, ARegisteredOptimizersOwnStateCountSizesTheOptimizerMemoryAndCheckpoints) {
  // A research optimizer that keeps three fp32 tensors per parameter says so in its options; the plan and the
  // checkpoint size follow it, as they follow Adam's two and Lion's one.
  optim::optimizer_registry().add(
      "three_moments",
      [](config::Section& s) {
        optim::OptimizerOptions o;
        o.name = "three_moments";
        o.lr = s.get_double("lr", 1e-3);
        o.state_tensors = 3;
        o.class_name = "ThreeMoments";
        s.finish();
        return o;
      },
      [](const optim::OptimizerOptions& o, std::vector<at::Tensor> p) {
        return optim::optimizer_registry().build("decoupled_lionw", o, std::move(p));
      });
  const TrainConfig adam = load_train_config(kRecipe);
  const TrainConfig lion = load_train_config(kRecipe, {"optimizer={name: decoupled_lionw, lr: 1.0e-4}"});
  const TrainConfig three = load_train_config(kRecipe, {"optimizer={name: three_moments, lr: 1.0e-3}"});
  EXPECT_EQ(adam.optimizer.state_tensors, 2);
  EXPECT_EQ(lion.optimizer.state_tensors, 1);
  EXPECT_EQ(three.optimizer.class_name, "ThreeMoments");
  const Plan pa = make_plan(adam, 1, 1), pl = make_plan(lion, 1, 1), p3 = make_plan(three, 1, 1);
  const double n = static_cast<double>(pa.n_params);
  // NO_SHARD, mixed precision: a 4-byte master copy plus 4 bytes per state tensor, per parameter.
  EXPECT_DOUBLE_EQ(p3.memory[0].state.optimizer - pa.memory[0].state.optimizer, 4 * n);
  EXPECT_DOUBLE_EQ(pa.memory[0].state.optimizer - pl.memory[0].state.optimizer, 4 * n);
  EXPECT_DOUBLE_EQ(checkpoint_bytes_per_rank(three, p3, dist::ShardingStrategy::kNoShard), n * 4 * (1 + 3));
}

TEST(Plan, CheckpointIntervalFollowsYoungAndDalyAndMinimisesTheExpectedLoss) {
  // Synchronous saves of a minute, a failure a day, 10-second steps.
  CheckpointCosts c{
      .mtbf_seconds = 86400, .save_seconds = 60, .blocking_seconds = 60, .step_seconds = 10, .async = false};
  const CheckpointAdvice a = advise_checkpoint_interval(c);
  EXPECT_NEAR(a.young_seconds, 3219.94, 0.01);  // sqrt(2 * 60 * 86400)
  // Daly: 3219.94 * (1 + sqrt(60 / 172800) / 3 + (60 / 172800) / 9) - 60.
  EXPECT_NEAR(a.daly_seconds, 3180.06, 0.01);
  EXPECT_EQ(a.interval_batches, 318);
  EXPECT_DOUBLE_EQ(a.lost_per_failure_seconds, 1590);
  // The advice minimises the expected loss it reports: no other interval does better than 0.01% of wall time.
  int64_t best = 1;
  for (int64_t k = 1; k < 5000; ++k) {
    if (checkpoint_overhead(c, k) < checkpoint_overhead(c, best)) best = k;
  }
  EXPECT_NEAR(static_cast<double>(best), 318, 318 * 0.03);
  EXPECT_LT(a.overhead_fraction - checkpoint_overhead(c, best), 1e-4);
  // 60/3240 saving + 1620/86400 rework: about 3.7% lost.
  EXPECT_NEAR(a.overhead_fraction, 60.0 / 3240 + 1620.0 / 86400, 1e-3);

  // A save at least twice the MTBF: Daly's interval is the MTBF itself.
  c.save_seconds = c.blocking_seconds = 2 * 86400;
  EXPECT_DOUBLE_EQ(advise_checkpoint_interval(c).daly_seconds, 86400);

  // Asynchronous: a tenth of a second of blocking, but a save takes 100 s to write, so saves are at least 100 s apart
  // (the next save waits for the write); a failure also loses the save in flight.
  c = {.mtbf_seconds = 3600, .save_seconds = 100, .blocking_seconds = 0.1, .step_seconds = 1, .async = true};
  const CheckpointAdvice b = advise_checkpoint_interval(c);
  EXPECT_NEAR(b.young_seconds, std::sqrt(2 * 0.1 * 3600), 1e-9);
  EXPECT_EQ(b.interval_batches, 100);
  EXPECT_DOUBLE_EQ(b.lost_per_failure_seconds, 50 + 100);
  EXPECT_GT(checkpoint_overhead(c, 10), checkpoint_overhead(c, 100))
      << "saving more often than a save completes blocks";

  c.mtbf_seconds = 0;
  EXPECT_THROW(advise_checkpoint_interval(c), ConfigError);
}

TEST(Plan, CheckpointBytesPerRankAreTheStoringRanksShare) {
  const TrainConfig cfg = load_train_config(kRecipe);
  const Plan p = make_plan(cfg, 16, 8);
  const double full = static_cast<double>(p.n_params) * 12;  // fp32 weights and Adam's two moments
  EXPECT_DOUBLE_EQ(checkpoint_bytes_per_rank(cfg, p, dist::ShardingStrategy::kNoShard), full);
  EXPECT_DOUBLE_EQ(checkpoint_bytes_per_rank(cfg, p, dist::ShardingStrategy::kFullShard), full / 16);
  EXPECT_DOUBLE_EQ(checkpoint_bytes_per_rank(cfg, p, dist::ShardingStrategy::kHybridShard), full / 8);
  const TrainConfig weights_only = load_train_config(kRecipe, {"save_weights_only=true"});
  EXPECT_DOUBLE_EQ(checkpoint_bytes_per_rank(weights_only, p, dist::ShardingStrategy::kNoShard), full / 3);
}

}  // namespace
}  // namespace tessera::trainer
