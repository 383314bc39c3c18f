// Multi-process training on a device mesh (torchtitan's `parallelism:` section) against one process: tensor,
// sequence and vocabulary parallelism, context parallelism, and the layouts the engine refuses. Ranks are the `train`
// tool, spawned through dist::launch (the fixture in dist_training_fixture.h).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "dist_training_fixture.h"
#include "tessera/checkpoint/checkpoint.h"

using namespace tessera;
using namespace tessera::testing::dist_training;

// ---- Tensor parallelism --------------------------------------------------------------------------------------------

namespace {
// torchtitan's section as a shell-quoted override.
std::string tensor_parallel(int degree, const std::string& more = "") {
  return fmt::format("'parallelism={{tensor_parallel_degree: {}{}}}'", degree, more.empty() ? "" : ", " + more);
}
}  // namespace

TEST_F(DistTraining, TensorParallelTwoByFullShardTwoMatchesOneProcess) {
  if (is_worker()) GTEST_SKIP();
  // MPT's attention heads (fused Wqkv: query, key and value blocks), MLP and tied embedding table / head (along the
  // vocabulary) split over tensor-parallel groups, the blocks' norms and residuals on sequence shards (sequence
  // parallelism, the default), composed with FULL_SHARD over the data-parallel ranks: 20 steps equal one process's
  // losses and its final (gathered) weights, with the loss from each rank's share of the logits (loss parallel, the
  // default) and from gathered logits (disable_loss_parallel).
  expect_same(single(), run("tp2_fs2", 4, {tensor_parallel(2)}), "TP 2 x FSDP 2");
  EXPECT_NE(read_dist_log(root_ / "tp2_fs2.log").find("sequence parallelism on"), std::string::npos);
  expect_same(single(), run("tp2_fs2_gathered", 4, {tensor_parallel(2, "disable_loss_parallel: true")}),
              "TP 2 x FSDP 2, gathered logits");
  // Evaluation: a group's ranks evaluate the same batches (the eval loader sees the data-parallel ranks), the
  // forward runs on sequence shards without autograd, and the metrics equal one process's.
  auto eval_metrics = [&](const std::string& name, int nproc, std::vector<std::string> o) {
    o.insert(o.end(), {"eval_interval=5ba", "max_duration=10ba"});
    run(name, nproc, o);
    std::vector<double> out;
    std::ifstream f(root_ / "runs" / name / "metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("metrics/eval/LanguageCrossEntropy")) out.push_back(j["metrics/eval/LanguageCrossEntropy"]);
    }
    return out;
  };
  const std::vector<double> one = eval_metrics("tp_eval_single", 1, {});
  const std::vector<double> tp = eval_metrics("tp_eval", 4, {tensor_parallel(2)});
  ASSERT_EQ(one.size(), 2u);
  ASSERT_EQ(tp.size(), one.size());
  for (size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(tp[i], one[i], 1e-5 * one[i]) << "evaluation " << i;
}

TEST_F(DistTraining, TensorParallelLayoutsMatchOneProcessAndTheirCheckpointsReshard) {
  if (is_worker()) GTEST_SKIP();
  // Without sequence parallelism (the layers' norms and residuals whole on every rank; all-reduces instead of
  // reduce-scatter / all-gather), and with activation checkpointing on 2 ranks.
  expect_same(single(), run("tp2_fs2_nosp", 4, {tensor_parallel(2, "sequence_parallel: false")}),
              "TP 2 x FSDP 2 without sequence parallelism");
  expect_same(single(), run("tp2_fs1", 2, {tensor_parallel(2), "fsdp_config.activation_checkpointing=true"}),
              "TP 2, activation checkpointing");
  // Four heads for TP 4 (one per rank), against one process of the same model; SHARD_GRAD_OP
  // (fsdp_reshard_after_forward: never), and the unfused Wq / Wk / Wv.
  const std::string heads = "model.n_heads=4";
  const fs::path ckpt = root_ / "ckpt";
  auto saving = [&](const std::string& name, std::vector<std::string> o) {
    fs::remove_all(ckpt / name);
    for (const char* x : {"scheduler.t_max=20ba", "save_interval=10ba"}) o.emplace_back(x);
    o.push_back("save_folder=" + (ckpt / name).string());
    return o;
  };
  const TrainRun one = run("tp_single4", 1, saving("tp_single4", {heads}));
  expect_same(one, run("tp4", 4, {heads, tensor_parallel(4, "fsdp_reshard_after_forward: never")}), "TP 4");
  {  // (no HF export for the unfused layout: losses only)
    const std::vector<std::string> unfused = {heads, "model.attn_config.fused_qkv=false", "callbacks={}"};
    const TrainRun a = run("tp_single4_unfused", 1, unfused);
    std::vector<std::string> o = unfused;
    o.push_back(tensor_parallel(4));
    const TrainRun b = run("tp4_unfused", 4, o);
    ASSERT_EQ(a.losses.size(), 20u);
    ASSERT_EQ(b.losses.size(), 20u);
    for (size_t i = 0; i < a.losses.size(); ++i) {
      EXPECT_NEAR(b.losses[i], a.losses[i], 1e-5 * std::abs(a.losses[i])) << "TP 4, separate Wq/Wk/Wv, step " << i;
    }
  }
  // The checkpoints keep one logical layout: TP 2 x FSDP 2's (saved at 10 of 20 steps) holds the one process's
  // weights, and resumes under FSDP 4, TP 4 and one process with the uninterrupted run's next loss; one process's
  // resumes under TP 2 x FSDP 2.
  run("tp2_fs2_save", 4, saving("tp2_fs2_save", {heads, tensor_parallel(2), "max_duration=10ba"}));
  EXPECT_NE(read_dist_log(root_ / "tp2_fs2_save.log").find("tensor parallelism over groups of 2 ranks"),
            std::string::npos);
  {  // Row-parallel weights are stored as column windows of the whole matrix; column-parallel ones as row ranges.
    checkpoint::CheckpointReader r((ckpt / "tp2_fs2_save" / "ep0-ba10").string());
    const nlohmann::json& t = r.metadata().at("tensors");
    std::set<int64_t> windows;
    for (const auto& pc : t.at("model/transformer.blocks.0.attn.out_proj.weight").at("pieces")) {
      windows.insert(pc.value("col_start", int64_t{-1}));
    }
    EXPECT_EQ(windows, (std::set<int64_t>{0, 16})) << "two ranks' halves of the 32 columns";
    for (const auto& pc : t.at("model/transformer.blocks.0.attn.Wqkv.weight").at("pieces")) {
      EXPECT_FALSE(pc.contains("cols"));
    }
  }
  const auto saved = checkpoint_weights(ckpt / "tp2_fs2_save" / "ep0-ba10");
  const auto reference = checkpoint_weights(ckpt / "tp_single4" / "ep0-ba10");
  ASSERT_EQ(saved.size(), reference.size());
  for (const auto& [name, w] : reference) {
    ASSERT_EQ(saved.at(name).sizes(), w.sizes()) << name;
    EXPECT_TRUE(at::allclose(saved.at(name), w, 1e-4, 1e-5)) << name;
  }
  const double want = one.losses.at(10);
  auto resumed = [&](const std::string& name, int nproc, const std::string& from, const std::string& mesh) {
    std::vector<std::string> o = {heads, "max_duration=11ba", "scheduler.t_max=20ba",
                                  "load_path=" + (ckpt / from / "ep0-ba10").string()};
    if (!mesh.empty()) o.push_back(mesh);
    const TrainRun r = run(name, nproc, o);
    EXPECT_EQ(r.losses.size(), 1u) << name;
    return r.losses.empty() ? 0.0 : r.losses[0];
  };
  EXPECT_NEAR(resumed("tp2_to_fs4", 4, "tp2_fs2_save", ""), want, 1e-5 * want) << "TP 2 x FSDP 2 -> FSDP 4";
  EXPECT_NEAR(resumed("tp2_to_tp4", 4, "tp2_fs2_save", tensor_parallel(4)), want, 1e-5 * want)
      << "TP 2 x FSDP 2 -> TP 4";
  EXPECT_NEAR(resumed("tp2_to_1", 1, "tp2_fs2_save", ""), want, 1e-5 * want) << "TP 2 x FSDP 2 -> one process";
  EXPECT_NEAR(resumed("one_to_tp2", 4, "tp_single4", tensor_parallel(2)), want, 1e-5 * want)
      << "one process -> TP 2 x FSDP 2";
}

TEST_F(DistTraining, TensorParallelComposesWithHybridShardAndAutoMicrobatching) {
  if (is_worker()) GTEST_SKIP();
  // HYBRID_SHARD over two 2-rank nodes (two launchers), a tensor-parallel group per node: the dense shards within the
  // node, every slice on one rank of each node, replicated across the nodes.
  expect_same(single(), run_on_two_nodes("tp_hy", {tensor_parallel(2, "data_parallel_replicate_degree: 2")}),
              "TP 2 x HYBRID_SHARD (2 nodes x 2)");
  EXPECT_NE(read_dist_log(root_ / "tp_hy_node0.log").find("HYBRID_SHARD"), std::string::npos);
  // Automatic microbatching: rank 1 of 4 (TP 2 x FSDP 2) runs out of memory three times in the first batch; the
  // tensor-parallel collectives take part in the agreement (a sync point before each), every rank retries together,
  // and the run equals the one that used 1 sample from the start.
  const TrainRun retried =
      run_auto_microbatching("tp_auto_oom", 4, "parallelism.tensor_parallel_degree=2 max_duration=6ba");
  const TrainRun fixed = run("tp_mb1_gb16", 4,
                             {"parallelism.tensor_parallel_degree=2", "max_duration=6ba", "global_train_batch_size=16",
                              "device_train_microbatch_size=1", "fsdp_config.sharding_strategy=FULL_SHARD"});
  ASSERT_EQ(retried.losses.size(), 6u);
  EXPECT_EQ(retried.losses, fixed.losses);
}

TEST_F(DistTrainingLlama, TensorParallelLayoutsMatchOneProcess) {
  if (is_worker()) GTEST_SKIP();
  // Llama's q/k/v/o projections (grouped-query: 4 query heads over 2 key/value heads) and gated MLP.
  expect_same(single(), run("tp2_fs2", 4, {tensor_parallel(2)}), "TP 2 x FSDP 2");
  const std::string kv = "model.num_key_value_heads=4";
  expect_same(run("tp_single_kv4", 1, {kv}), run("tp4", 4, {kv, tensor_parallel(4)}), "TP 4");
}

// ---- Context parallelism -------------------------------------------------------------------------------------------

namespace {
std::string context_parallel(int degree, const std::string& more = "") {
  return fmt::format("'parallelism={{context_parallel_degree: {}{}}}'", degree, more.empty() ? "" : ", " + more);
}
}  // namespace

TEST_F(DistTraining, ContextParallelMatchesOneProcessAndComposesWithTensorParallelism) {
  if (is_worker()) GTEST_SKIP();
  // Each sequence cut over a group of ranks (chunks r and 2C - 1 - r), keys and values all-gathered in every attention
  // layer, each rank's loss on its positions: CP 2 x FSDP 2, CP 4 with activation checkpointing, and TP 2 x CP 2
  // (sequence parallelism inside each context shard) equal one process's 20 losses and final weights.
  expect_same(single(), run("cp2_fs2", 4, {context_parallel(2)}), "CP 2 x FSDP 2");
  EXPECT_NE(read_dist_log(root_ / "cp2_fs2.log").find("context parallelism over groups of 2 ranks"), std::string::npos);
  expect_same(single(), run("cp4", 4, {context_parallel(4), "fsdp_config.activation_checkpointing=true"}),
              "CP 4, activation checkpointing");
  expect_same(single(), run("tp2_cp2", 4, {context_parallel(2, "tensor_parallel_degree: 2")}), "TP 2 x CP 2");
  // Each microbatch's mean loss by its share of the samples (accumulate_train_batch_on_tokens: false) counts the whole
  // sequences' tokens on every rank of a group.
  expect_same(run("single_by_samples", 1, {"accumulate_train_batch_on_tokens=false"}),
              run("cp2_by_samples", 2, {context_parallel(2), "accumulate_train_batch_on_tokens=false"}),
              "CP 2, loss by samples");
  // A sequence that does not cut into 2 chunks per rank, and a family whose forward does not run on shards.
  const fs::path log = root_ / "cp_seq.log";
  const std::string cmd = fmt::format(
      "{} --recipe {} run_name=cp_seq max_duration=1ba --nproc-per-node 2 --master-port 0 {} max_seq_len=30 "
      "train_loader.dataset.max_seq_len=30 eval_loader.dataset.max_seq_len=30 model.max_seq_len=30 > {} 2>&1",
      ::tessera::testing::train_bin(), (root_ / "tiny.yaml").string(), context_parallel(2), log.string());
  EXPECT_NE(std::system(cmd.c_str()), 0);
  EXPECT_NE(read_dist_log(log).find("a sequence of 30 tokens does not cut into 4 equal chunks"), std::string::npos)
      << read_dist_log(log);
}

TEST_F(DistTrainingLlama, ContextParallelMatchesOneProcess) {
  if (is_worker()) GTEST_SKIP();
  // Rotary positions read at each token's own position, grouped-query keys and values gathered.
  expect_same(single(), run("cp2_fs2", 4, {context_parallel(2)}), "CP 2 x FSDP 2");
  expect_same(single(), run("cp4", 4, {context_parallel(4)}), "CP 4");
}

TEST_F(DistTrainingLlama, ContextParallelTrainsASequenceOneRankCannotHoldWithinItsBudget) {
  if (is_worker()) GTEST_SKIP();
  // One sequence of 8192 tokens through a Llama with a 16k vocabulary: the logits alone are 8192 x 16384 floats
  // (0.54 GB), and the loss's log-softmax and the gradients add more of that size. The budget is 1.5 GB of peak
  // resident memory per rank (memory_monitor's memory/peak_rss_gb, the process's VmHWM, rank 0): one process exceeds
  // it; under CP 4 each rank holds 2048 positions and stays within it, with the same two losses. Measured on a 2-core
  // EPYC (2026-12-05): one process 1.74 GB (2.18 GB before the shared attention block, the same ops), CP 4 rank 0
  // 0.96-1.10 GB.
  const double budget_gb = 1.5;
  tessera::testing::write_token_split(root_ / "long" / "train", 4, 1, 8193);
  std::ofstream(root_ / "long.yaml") << fmt::format(R"(
max_seq_len: 8192
seed: 3
model: {{name: llama, hidden_size: 64, num_attention_heads: 4, num_key_value_heads: 2, num_hidden_layers: 2,
        intermediate_size: 128, vocab_size: 16384, max_position_embeddings: 8192}}
tokenizer: {{name: unused}}
train_loader: {{name: text, dataset: {{local: {0}/long, split: train, shuffle: false, max_seq_len: 8192}},
               drop_last: true}}
optimizer: {{name: decoupled_adamw, lr: 0.01}}
scheduler: {{name: constant_with_warmup, t_warmup: 0ba}}
max_duration: 2ba
global_train_batch_size: 1
device_train_microbatch_size: 1
precision: fp32
device: cpu
log_to_console: false
loggers: {{jsonl: {{filename: "{0}/runs/{{run_name}}/metrics.jsonl"}}}}
callbacks: {{memory_monitor: {{}}}}
)",
                                                    root_.string());
  struct Long {
    std::vector<double> losses;
    double peak_gb = 0;
  };
  auto long_run = [&](const std::string& name, int nproc, const std::string& mesh) {
    std::string cmd = fmt::format("{} --recipe {} run_name={}", ::tessera::testing::train_bin(),
                                  (root_ / "long.yaml").string(), name);
    if (nproc > 1) cmd += fmt::format(" --nproc-per-node {} --master-port 0 {}", nproc, mesh);
    const fs::path log = root_ / (name + ".log");
    EXPECT_EQ(std::system((cmd + " > " + log.string() + " 2>&1").c_str()), 0) << cmd << "\n" << read_dist_log(log);
    Long out;
    std::ifstream f(root_ / "runs" / name / "metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("loss/train/total")) out.losses.push_back(j["loss/train/total"]);
      if (j.contains("memory/peak_rss_gb")) out.peak_gb = std::max(out.peak_gb, j["memory/peak_rss_gb"].get<double>());
    }
    return out;
  };
  const Long one = long_run("long_single", 1, "");
  const Long cp = long_run("long_cp4", 4, context_parallel(4));
  std::printf(
      "[context parallelism] 8192 tokens, vocabulary 16384: peak RSS one process %.2f GB, CP 4 rank 0 %.2f "
      "GB (budget %.2f GB)\n",
      one.peak_gb, cp.peak_gb, budget_gb);
  ASSERT_EQ(one.losses.size(), 2u);
  ASSERT_EQ(cp.losses.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(cp.losses[i], one.losses[i], 1e-5 * one.losses[i]) << "step " << i;
  EXPECT_GT(one.peak_gb, budget_gb) << "one process holds the whole sequence";
  EXPECT_LE(cp.peak_gb, budget_gb) << "a CP 4 rank holds a quarter of it";
}

TEST_F(DistTrainingMoe, ContextParallelIsRefusedForAModelThatDoesNotRunOnShards) {
  if (is_worker()) GTEST_SKIP();
  // A mixture of experts: its router's losses would count each rank's tokens as the whole batch.
  const fs::path log = root_ / "cp_moe.log";
  const std::string cmd =
      fmt::format("{} --recipe {} run_name=cp_moe max_duration=1ba --nproc-per-node 2 --master-port 0 {} > {} 2>&1",
                  ::tessera::testing::train_bin(), (root_ / "tiny.yaml").string(), context_parallel(2), log.string());
  EXPECT_NE(std::system(cmd.c_str()), 0);
  EXPECT_NE(read_dist_log(log).find("parallelism.context_parallel_degree 2: model family \"mpt\" does not run on "
                                    "context shards"),
            std::string::npos)
      << read_dist_log(log);
}

TEST_F(DistTraining, TensorParallelLayoutsTheEngineCannotBuildAreRefusedNamingTheKey) {
  if (is_worker()) GTEST_SKIP();
  auto refused = [&](const std::string& name, int nproc, const std::vector<std::string>& o, const std::string& want) {
    std::string cmd = fmt::format("{} --recipe {} run_name={} max_duration=1ba", ::tessera::testing::train_bin(),
                                  (root_ / "tiny.yaml").string(), name);
    if (nproc > 1) cmd += fmt::format(" --nproc-per-node {} --master-port 0", nproc);
    for (const std::string& x : o) cmd += " " + x;
    const fs::path log = root_ / (name + ".log");
    EXPECT_NE(std::system((cmd + " > " + log.string() + " 2>&1").c_str()), 0) << name;
    EXPECT_NE(read_dist_log(log).find(want), std::string::npos) << name << ":\n" << read_dist_log(log);
  };
  refused("tp_heads", 4, {tensor_parallel(4)},
          "tensor_parallel_degree 4: MPT's 2 query and 2 key/value heads (attn_config.kv_n_heads) do not split into 4 "
          "equal shares");
  refused("tp_world", 2, {tensor_parallel(4)}, "tensor_parallel_degree (4) does not divide the world size (2)");
  refused("tp_ddp", 4,
          {"'parallelism={tensor_parallel_degree: 2, data_parallel_replicate_degree: 2, data_parallel_shard_degree: "
           "1}'"},
          "tensor parallelism needs a sharded strategy (FULL_SHARD, SHARD_GRAD_OP or HYBRID_SHARD), not NO_SHARD");
  refused("tp_qk_ln", 2, {tensor_parallel(2), "model.attn_config.qk_ln=true"}, "attn_config.qk_ln");
  refused("tp_lora", 2, {tensor_parallel(2), "algorithms.lora.r=2", "algorithms.lora.target_modules=[Wqkv]"},
          "tensor parallelism: transformer.wte.weight is frozen; frozen weights (the base of LoRA) are not split");
}
