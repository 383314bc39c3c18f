// Pipeline parallelism on CPU with Gloo, against one process: `train` with parallelism.pipeline_parallel_degree runs
// each schedule to the single process's losses and weights, alone and inside a sharded mesh, with a tied embedding
// (MPT) and an untied head (Llama), over 2 and 3 stages (one with neither embeddings nor head), with tensor
// or context parallelism within the stages; checkpoints saved by
// stages resume without them and the other way round.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <ATen/ATen.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "dist_training_fixture.h"

namespace fs = std::filesystem;
using namespace tessera;
using namespace tessera::testing::dist_training;
using tessera::testing::is_worker;

namespace {

struct PipelineMpt : TinyMpt {  // three blocks, the embedding tied to the head
  static constexpr const char* kDir = "pipeline_training";
};
struct PipelineLlama : TinyLlama {  // an untied head
  static constexpr const char* kDir = "pipeline_training_llama";
};

std::string pipeline(int stages, const std::string& schedule, const std::string& more = "") {
  return fmt::format("'parallelism={{pipeline_parallel_degree: {}, pipeline_parallel_schedule: {}{}}}'", stages,
                     schedule, more);
}

}  // namespace

using PipelineTraining = DistTrainingOf<PipelineMpt>;
using PipelineTrainingLlama = DistTrainingOf<PipelineLlama>;

TEST_F(PipelineTraining, EachScheduleOnTwoStagesMatchesOneProcess) {
  if (is_worker()) GTEST_SKIP();
  // Four microbatches of 2 per device batch of 8 (the single process runs two of 4: the same sums, grouped otherwise).
  const std::string mb = ", pipeline_parallel_microbatch_size: 2";
  expect_same(single(), run("pp2_gpipe", 2, {pipeline(2, "GPipe", mb)}), "PP 2, GPipe");
  expect_same(single(), run("pp2_1f1b", 2, {pipeline(2, "1F1B", mb)}), "PP 2, 1F1B");
}

TEST_F(PipelineTraining, ThreeStagesAndStagesTimesFullShardMatchOneProcess) {
  if (is_worker()) GTEST_SKIP();
  // A block per stage: the middle stage holds neither the embeddings nor the head.
  expect_same(single(), run("pp3_1f1b", 3, {pipeline(3, "1F1B")}), "PP 3, 1F1B");
  // Stages of two ranks, FULL_SHARD within each.
  expect_same(single(), run("pp2_fs2", 4, {pipeline(2, "1F1B"), "fsdp_config.sharding_strategy=FULL_SHARD"}),
              "PP 2 x FULL_SHARD 2");
}

TEST_F(PipelineTraining, StagesTimesTensorOrContextParallelMatchOneProcess) {
  if (is_worker()) GTEST_SKIP();
  // Stages of two ranks that split each block's attention and MLP (sequence parallelism within a stage; the tied
  // embedding and head split along the vocabulary on the first and last stage).
  expect_same(single(), run("pp2_tp2", 4, {pipeline(2, "1F1B", ", tensor_parallel_degree: 2")}), "PP 2 x TP 2");
  // Stages of two ranks that each run half of every sequence's positions (activations travel as shards).
  expect_same(single(), run("pp2_cp2", 4, {pipeline(2, "GPipe", ", context_parallel_degree: 2")}), "PP 2 x CP 2");
}

TEST_F(PipelineTraining, CheckpointsReshardBetweenStagesAndShards) {
  if (is_worker()) GTEST_SKIP();
  const fs::path ckpt = root_ / "ckpt";
  const auto save = [&](const std::string& name, int nproc, std::vector<std::string> o) {
    fs::remove_all(ckpt / name);
    for (const std::string& x : {std::string("max_duration=10ba"), std::string("scheduler.t_max=20ba"),
                                 std::string("save_interval=10ba"), "save_folder=" + (ckpt / name).string()}) {
      o.push_back(x);
    }
    run(name, nproc, o);
    EXPECT_TRUE(fs::exists(ckpt / name / "ep0-ba10" / "metadata.json")) << name;
    return (ckpt / name / "ep0-ba10").string();
  };
  const auto resume = [&](const std::string& name, int nproc, std::vector<std::string> o, const std::string& from) {
    o.push_back("max_duration=11ba");
    o.push_back("scheduler.t_max=20ba");
    o.push_back("load_path=" + from);
    const TrainRun r = run(name, nproc, o);
    EXPECT_EQ(r.losses.size(), 1u) << name;
    return r.losses.empty() ? 0.0 : r.losses[0];
  };
  const double expected = single().losses.at(10);
  // PP 2 -> one process, and FULL_SHARD on 4 ranks -> PP 2 x FULL_SHARD 2.
  const std::string from_stages = save("pp2_save", 2, {pipeline(2, "1F1B")});
  EXPECT_NEAR(resume("pp2_to_1", 1, {}, from_stages), expected, 1e-5 * std::abs(expected));
  const std::string from_shards = save("fs4_save", 4, {"fsdp_config.sharding_strategy=FULL_SHARD"});
  EXPECT_NEAR(
      resume("fs4_to_pp2_fs2", 4, {pipeline(2, "GPipe"), "fsdp_config.sharding_strategy=FULL_SHARD"}, from_shards),
      expected, 1e-5 * std::abs(expected));
}

TEST_F(PipelineTrainingLlama, AnUntiedHeadOnTwoStagesMatchesOneProcess) {
  if (is_worker()) GTEST_SKIP();
  expect_same(single(), run("pp2_1f1b", 2, {pipeline(2, "1F1B", ", pipeline_parallel_microbatch_size: 2")}),
              "Llama, PP 2, 1F1B");
}

TEST_F(PipelineTraining, WhatStagesDoNotRunYetIsRefusedNamingIt) {
  if (is_worker()) GTEST_SKIP();
  const auto refused = [&](const std::string& name, int nproc, const std::vector<std::string>& o,
                           const std::string& says) {
    std::string cmd = fmt::format("{} --recipe {} run_name={}", ::tessera::testing::train_bin(),
                                  (root_ / "tiny.yaml").string(), name);
    if (nproc > 1) cmd += fmt::format(" --nproc-per-node {} --master-port 0", nproc);
    for (const auto& x : o) cmd += " " + x;
    const fs::path log = root_ / (name + ".log");
    EXPECT_NE(std::system((cmd + " > " + log.string() + " 2>&1").c_str()), 0) << cmd;
    const std::string out = ::tessera::testing::read_dist_log(log);
    EXPECT_NE(out.find(says), std::string::npos) << out;
  };
  refused("pp_interleaved", 1, {pipeline(2, "Interleaved1F1B")}, "Interleaved1F1B");
  refused("pp_eval", 2, {pipeline(2, "1F1B"), "eval_interval=5ba"}, "evaluation during training");
  refused("pp_stages", 2, {pipeline(4, "1F1B")}, "parallelism.pipeline_parallel_degree 4 does not divide");
}
