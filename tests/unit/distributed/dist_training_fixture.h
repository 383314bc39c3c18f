// The fixture of the multi-process training tests (dist_training_test.cpp, mesh_training_test.cpp): a tiny model of
// each family, trained by the `train` tool on N local ranks (or as two nodes) and compared with one process.
#pragma once

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <ATen/ATen.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dist_test_util.h"
#include "tessera/checkpoint/checkpoint.h"
#include "tessera/checkpoint/safetensors.h"
#include "test_util.h"
#include "tiny_data.h"

// A named namespace: the fixture must be one class in every file that adds tests to its suites.
namespace tessera::testing::dist_training {

namespace fs = std::filesystem;
using tessera::testing::free_port;
using tessera::testing::is_worker;
using tessera::testing::launch_workers;
using tessera::testing::read_dist_log;

struct TrainRun {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> weights;  // the final model, from hf_checkpointer
};

// The models the distributed tests train: each family's tiny configuration (the rest of the recipe is shared).
struct TinyMpt {
  static constexpr const char* kDir = "dist_training";
  // no_bias (LLM Foundry's MPT default): the key slice of a Wqkv bias has an exactly-zero gradient, so its
  // gradient is rounding noise that Adam amplifies to full-size steps, and no two summation orders agree on it.
  static constexpr const char* kModel =
      "{name: mpt_causal_lm, d_model: 32, n_heads: 2, n_layers: 3, expansion_ratio: 2, max_seq_len: 32,\n"
      "        vocab_size: 64, no_bias: true, attn_config: {attn_impl: torch}}";
};
struct TinyLlama {
  static constexpr const char* kDir = "dist_training_llama";
  static constexpr const char* kModel =
      "{name: llama, hidden_size: 32, num_attention_heads: 4, num_key_value_heads: 2, num_hidden_layers: 3,\n"
      "        intermediate_size: 64, vocab_size: 64, max_position_embeddings: 32}";
};
// MegaBlocks' dMoE in every block with a router z-loss. (Not the load-balancing loss: MegaBlocks computes it from
// each rank's microbatch as a whole, so it depends on how the batch is split, where the z-loss, a mean over tokens,
// does not.)
struct TinyMoe {
  static constexpr const char* kDir = "dist_training_moe";
  static constexpr const char* kModel =
      "{name: mpt_causal_lm, d_model: 32, n_heads: 2, n_layers: 3, expansion_ratio: 2, max_seq_len: 32,\n"
      "        vocab_size: 64, no_bias: true, attn_config: {attn_impl: torch},\n"
      "        ffn_config: {ffn_type: mb_dmoe, moe_num_experts: 4, moe_top_k: 2, mlp_type: glu, moe_loss_weight: 0,\n"
      "                     moe_zloss_weight: 0.01}}";
};
struct TinyFalcon {  // Falcon 40B's block: grouped K/V, attention and MLP in parallel after their own LayerNorms
  static constexpr const char* kDir = "dist_training_falcon";
  static constexpr const char* kModel =
      "{name: falcon, hidden_size: 32, num_attention_heads: 4, num_kv_heads: 2, new_decoder_architecture: true,\n"
      "        num_hidden_layers: 3, ffn_hidden_size: 64, vocab_size: 64, max_position_embeddings: 32}";
};

struct TinyQwen35 {  // Qwen3.5: Gated DeltaNet linear layers before a gated full-attention layer (FSDP only: no TP/CP)
  static constexpr const char* kDir = "dist_training_qwen3_5";
  static constexpr const char* kModel =
      "{name: qwen3_5, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 3, num_attention_heads: 4,\n"
      "        num_key_value_heads: 2, head_dim: 8, linear_num_key_heads: 2, linear_num_value_heads: 4,\n"
      "        linear_key_head_dim: 8, linear_value_head_dim: 8, layer_types: [linear_attention, linear_attention,\n"
      "        full_attention], vocab_size: 64, max_position_embeddings: 32}";
};

template <class Model>
class DistTrainingOf : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / Model::kDir;
    fs::remove_all(root_);
    tessera::testing::write_token_split(root_ / "data" / "train", 256, 1);
    tessera::testing::write_token_split(root_ / "data" / "val", 32, 2);
    std::ofstream(root_ / "tiny.yaml") << fmt::format(R"(
max_seq_len: 32
seed: 3
model: {2}
tokenizer: {{name: unused}}
train_loader: {{name: text, dataset: {{local: {0}, split: train, shuffle: true, max_seq_len: 32}}, drop_last: true}}
eval_loader: {{name: text, dataset: {{local: {0}, split: val, shuffle: false, max_seq_len: 32}}, drop_last: false}}
eval_interval: 0ba
optimizer: {{name: decoupled_adamw, lr: 0.01, weight_decay: 0.0001}}
scheduler: {{name: cosine_with_warmup, t_warmup: 5ba}}
algorithms: {{gradient_clipping: {{clipping_type: norm, clipping_threshold: 0.5}}}}
max_duration: 20ba
global_train_batch_size: 8
device_train_microbatch_size: 4
device_eval_batch_size: 8
precision: fp32
device: cpu  # the 2-rank runs are CPU (Gloo) runs on any machine; the 1-rank runs they are compared with too
log_to_console: false
loggers: {{jsonl: {{filename: "{1}/runs/{{run_name}}/metrics.jsonl"}}}}
callbacks: {{hf_checkpointer: {{save_folder: "{1}/runs/{{run_name}}", save_interval: 1000ba}}}}
)",
                                                      (root_ / "data").string(), root_.string(), Model::kModel);
  }

  // Runs `train` on `nproc` local ranks (1: a plain process) and reads its losses and final weights.
  static TrainRun run(const std::string& name, int nproc, const std::vector<std::string>& overrides,
                      const std::vector<std::string>& launcher_args = {}) {
    std::string cmd = fmt::format("{} --recipe {} run_name={}", ::tessera::testing::train_bin(),
                                  (root_ / "tiny.yaml").string(), name);
    if (nproc > 1) cmd += fmt::format(" --nproc-per-node {} --master-port 0", nproc);
    for (const auto& a : launcher_args) cmd += " " + a;
    for (const auto& o : overrides) cmd += " " + o;
    const fs::path log = root_ / (name + ".log");
    const int rc = std::system((cmd + " > " + log.string() + " 2>&1").c_str());
    EXPECT_EQ(rc, 0) << cmd << "\n" << read_dist_log(log);
    return read_run(name);
  }

  // Launches DistWorker.AutoMicrobatch on `nproc` ranks (rank 1 runs out of memory three times in the first batch)
  // as run `name`, with more recipe overrides, space-separated; returns its run.
  static TrainRun run_auto_microbatching(const std::string& name, int nproc, const std::string& overrides = "") {
    setenv("TESSERA_DIST_TRAINING_ROOT", root_.c_str(), 1);
    const std::string all = "run_name=" + name + " " + overrides;
    setenv("TESSERA_DIST_TRAINING_OVERRIDES", all.c_str(), 1);
    EXPECT_EQ(launch_workers("AutoMicrobatch", nproc), 0);
    unsetenv("TESSERA_DIST_TRAINING_ROOT");
    unsetenv("TESSERA_DIST_TRAINING_OVERRIDES");
    return read_run(name);
  }

  // Runs `train` as two nodes of 2 ranks (two launchers on this machine) with one canonical node, which keeps
  // Streaming's sample order equal to the single process's; returns the run as read_run does.
  static TrainRun run_on_two_nodes(const std::string& name, const std::vector<std::string>& overrides) {
    // Both launchers need the port before either starts, so it is probed (free_port()), and another test may take it
    // before rank 0 listens on it: that run is retried once on a new port. dist_timeout bounds how long node 1's
    // ranks wait for a rendezvous that node 0 never serves (the default 600 s outlasts the test's timeout).
    for (int attempt = 0;; ++attempt) {
      const int port = free_port();
      auto node = [&](int k) {
        std::string cmd = fmt::format(
            "{} --recipe {} run_name={} --nproc-per-node 2 --nnodes 2 --node-rank {} --master-port {} "
            "train_loader.dataset.num_canonical_nodes=1 dist_timeout=60",
            ::tessera::testing::train_bin(), (root_ / "tiny.yaml").string(), name, k, port);
        for (const std::string& o : overrides) cmd += " " + o;
        cmd += " > " + (root_ / fmt::format("{}_node{}.log", name, k)).string() + " 2>&1";
        return std::async(std::launch::async, [cmd] { return std::system(cmd.c_str()); });
      };
      auto n0 = node(0), n1 = node(1);
      const int code0 = n0.get(), code1 = n1.get();
      const std::string log0 = read_dist_log(root_ / (name + "_node0.log"));
      if (attempt == 0 && code0 != 0 && log0.find("Address already in use") != std::string::npos) {
        fs::remove_all(root_ / "runs" / name);
        continue;
      }
      EXPECT_EQ(code0, 0) << log0;
      EXPECT_EQ(code1, 0) << read_dist_log(root_ / (name + "_node1.log"));
      return read_run(name);
    }
  }

  static TrainRun read_run(const std::string& name) {
    TrainRun r;
    std::ifstream f(root_ / "runs" / name / "metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("loss/train/total")) r.losses.push_back(j["loss/train/total"].get<double>());
    }
    const fs::path w = root_ / "runs" / name / "huggingface" / "ba20" / "model.safetensors";
    if (fs::exists(w)) {
      checkpoint::SafetensorsFile file(w.string());
      for (const auto& n : file.names()) r.weights[n] = file.load(n);
    }
    return r;
  }

  static void expect_same(const TrainRun& single, const TrainRun& sharded, const std::string& what) {
    ASSERT_EQ(single.losses.size(), 20u) << what;
    ASSERT_EQ(sharded.losses.size(), 20u) << what;
    for (size_t i = 0; i < single.losses.size(); ++i) {
      EXPECT_NEAR(sharded.losses[i], single.losses[i], 1e-5 * std::abs(single.losses[i])) << what << " step " << i;
    }
    ASSERT_EQ(single.weights.size(), sharded.weights.size()) << what;
    ASSERT_FALSE(single.weights.empty()) << what;
    for (const auto& [name, w] : single.weights) {
      const at::Tensor& v = sharded.weights.at(name);
      EXPECT_TRUE(at::allclose(v, w, 1e-4, 1e-5))
          << what << " " << name << ": max diff " << (v - w).abs().max().template item<double>();
    }
  }

  static const TrainRun& single() {
    static const TrainRun r = run("single", 1, {});
    return r;
  }

  // Trains 10 of the 20 batches (t_max pins the schedule to the full run's) on `nproc` ranks with `strategy` and
  // saves a checkpoint there; returns its directory.
  static std::string save_at_ten(const std::string& name, int nproc, const std::string& strategy) {
    const fs::path ckpt = root_ / "ckpt";
    fs::remove_all(ckpt / name);
    std::vector<std::string> o = {"max_duration=10ba", "scheduler.t_max=20ba", "save_interval=10ba",
                                  "save_folder=" + (ckpt / name).string()};
    if (!strategy.empty()) o.push_back("fsdp_config.sharding_strategy=" + strategy);
    run(name, nproc, o);
    EXPECT_TRUE(fs::exists(ckpt / name / "ep0-ba10" / "metadata.json")) << name;
    return (ckpt / name / "ep0-ba10").string();
  }

  // Loads checkpoint `from` on `nproc` ranks with `strategy` and trains one step: its loss.
  static double loss_after_resuming(const std::string& name, int nproc, const std::string& strategy,
                                    const std::string& from) {
    std::vector<std::string> o = {"max_duration=11ba", "scheduler.t_max=20ba", "load_path=" + from};
    if (!strategy.empty()) o.push_back("fsdp_config.sharding_strategy=" + strategy);
    const TrainRun r = run(name, nproc, o);
    EXPECT_EQ(r.losses.size(), 1u) << name << ": resumed at batch 10, so one step";
    return r.losses.empty() ? 0.0 : r.losses[0];
  }

  // tests/fault_injection/kill_random_rank.sh: kill -9 of a random rank at a random step under --max-restarts and
  // autoresume; the final weights must equal an uninterrupted run's, byte for byte.
  // `env`: more of the script's variables (NPROC, EXTRA, FINAL).
  static void expect_kills_resume_bitwise(int trials, const std::string& env = "") {
    const fs::path log = root_ / "fault_injection.log";
    const std::string cmd =
        fmt::format("{} RUNS_DIR={} {}/tests/fault_injection/kill_random_rank.sh {} {} {} {} > {} 2>&1", env,
                    (root_ / "runs").string(), ::tessera::testing::source_dir(), ::tessera::testing::train_bin(),
                    (root_ / "tiny.yaml").string(), (root_ / "fault").string(), trials, log.string());
    EXPECT_EQ(std::system(cmd.c_str()), 0) << read_dist_log(log);
    EXPECT_NE(read_dist_log(log).find(fmt::format("{0}/{0} trials passed", trials)), std::string::npos)
        << read_dist_log(log);
  }

  static fs::path root_;
};
template <class Model>
fs::path DistTrainingOf<Model>::root_;

using DistTraining = DistTrainingOf<TinyMpt>;
using DistTrainingLlama = DistTrainingOf<TinyLlama>;
using DistTrainingFalcon = DistTrainingOf<TinyFalcon>;
using DistTrainingQwen35 = DistTrainingOf<TinyQwen35>;
using DistTrainingMoe = DistTrainingOf<TinyMoe>;

// Every model tensor of checkpoint `dir`, whole, by name ("model/transformer.wte.weight", ...).
inline std::map<std::string, at::Tensor> checkpoint_weights(const fs::path& dir) {
  checkpoint::CheckpointReader r(dir.string());
  std::map<std::string, at::Tensor> out;
  for (const std::string& n : r.tensor_names("model/")) out[n] = r.read_full(n);
  return out;
}

}  // namespace tessera::testing::dist_training
