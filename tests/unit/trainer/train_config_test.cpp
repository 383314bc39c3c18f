// Recipes: LLM Foundry's schema mapped onto typed options; the recipes we ship; precedence and fallbacks.
#include <gtest/gtest.h>

#include <any>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "models/mpt/mpt_config.h"
#include "tessera/algorithms/options.h"
#include "tessera/callbacks/options.h"
#include "tessera/trainer/train_config.h"
#include "tessera/util/error.h"
#include "test_util.h"

namespace tessera::trainer {
namespace {

using core::Precision;

// The recipe's model section as MPT options.
const models::MPTOptions& mpt(const TrainConfig& cfg) {
  return std::any_cast<const models::MPTOptions&>(cfg.model.options);
}

const std::string kSource = ::tessera::testing::source_dir();

std::string write_recipe(const std::string& name, const std::string& yaml) {
  const auto dir = std::filesystem::temp_directory_path() / "tessera_recipes";
  std::filesystem::create_directories(dir);
  const auto path = dir / name;
  std::ofstream(path) << yaml;
  return path.string();
}

// Parameter counts of LLM Foundry's recipes, from its published throughput table (NumParams column).
TEST(Recipes, ParameterCountsMatchLlmFoundrysTable) {
  const std::map<std::string, int64_t> expected = {
      {"mpt-125m", 125311488},  {"mpt-350m", 355985408},  {"mpt-760m", 760470528},
      {"mpt-1b", 1315950592},   {"mpt-3b", 2651837440},   {"mpt-7b", 6658859008},
      {"mpt-13b", 12853954560}, {"mpt-30b", 29975214080}, {"mpt-70b", 64862437376}};
  // and FLOPs per token at S = 2048 (GFLOP, 4 significant digits), from the same table's MFU column
  const std::map<std::string, double> gflops = {{"mpt-125m", 0.978}, {"mpt-350m", 2.740}, {"mpt-760m", 5.469},
                                                {"mpt-1b", 9.104},   {"mpt-3b", 17.92},   {"mpt-7b", 43.17},
                                                {"mpt-13b", 82.16},  {"mpt-30b", 188.3},  {"mpt-70b", 405.3}};
  for (const auto& [name, params] : expected) {
    const TrainConfig cfg = load_train_config(kSource + "/recipes/" + name + ".yaml");
    EXPECT_EQ(models::mpt_param_count(mpt(cfg)), params) << name;
    const double f = models::mpt_flops_per_token(mpt(cfg), 2048) / 1e9;
    EXPECT_NEAR(f, gflops.at(name), gflops.at(name) * 6e-4) << name;
  }
}

TEST(Recipes, EveryShippedRecipeLoads) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kSource + "/recipes")) {
    if (entry.path().extension() != ".yaml") continue;
    EXPECT_NO_THROW(load_train_config(entry.path().string(), testing::shipped_recipe_overrides(entry.path())))
        << entry.path();
    ++n;
  }
  EXPECT_GE(n, 9);
}

TEST(Recipes, LlmFoundrysOwnYamlLoadsUnchanged) {
  const TrainConfig cfg = load_train_config(kSource + "/tests/data/foundry/mpt-125m.yaml");
  EXPECT_EQ(cfg.max_seq_len, 2048);
  EXPECT_EQ(mpt(cfg).d_model, 768);
  EXPECT_EQ(mpt(cfg).init_device, "meta");
  EXPECT_EQ(mpt(cfg).attn.attn_impl, "flash");
  EXPECT_EQ(mpt(cfg).norm_type, models::NormType::kLowPrecisionLayerNorm);
  EXPECT_TRUE(mpt(cfg).learned_pos_emb);
  EXPECT_EQ(cfg.tokenizer.model_max_length, 2048);
  EXPECT_EQ(cfg.train_loader.dataset.streams.at(0).local, "./my-copy-c4");
  EXPECT_EQ(cfg.train_loader.dataset.streams.at(0).split, "train");
  EXPECT_EQ(cfg.train_loader.dataset.shuffle_seed, 17u);
  EXPECT_EQ(cfg.train_loader.num_workers, 8);
  ASSERT_TRUE(cfg.eval_loader.has_value());
  EXPECT_FALSE(cfg.eval_loader->dataset.shuffle);
  EXPECT_FALSE(cfg.eval_loader->tokens.drop_last);
  EXPECT_EQ(cfg.optimizer.name, "decoupled_adamw");
  EXPECT_DOUBLE_EQ(cfg.optimizer.lr, 6.0e-4);
  EXPECT_EQ(cfg.optimizer.betas, (std::vector<double>{0.9, 0.95}));
  EXPECT_DOUBLE_EQ(cfg.optimizer.eps, 1e-8);
  EXPECT_EQ(cfg.scheduler.name, "cosine_with_warmup");
  EXPECT_EQ(cfg.scheduler.t_warmup, config::Time::batches(100));
  EXPECT_EQ(cfg.scheduler.t_max, config::Time(1, config::TimeUnit::kDuration));
  EXPECT_DOUBLE_EQ(cfg.scheduler.alpha_f, 0.1);
  ASSERT_EQ(cfg.algorithms.size(), 1u);
  const auto& clip = std::any_cast<const algorithms::GradientClippingOptions&>(cfg.algorithms[0].options);
  EXPECT_EQ(clip.clipping_type, "norm");
  EXPECT_DOUBLE_EQ(clip.clipping_threshold, 1.0);
  ASSERT_EQ(cfg.callbacks.size(), 4u);
  EXPECT_EQ(std::any_cast<const callbacks::SpeedMonitorOptions&>(cfg.callbacks[0].options).window_size, 10);
  EXPECT_EQ(cfg.max_duration, config::Time::batches(4800));
  EXPECT_EQ(cfg.eval_interval, config::Time::batches(500));
  EXPECT_EQ(cfg.global_train_batch_size, 256);
  EXPECT_FALSE(cfg.device_train_microbatch_size.automatic);
  EXPECT_EQ(cfg.device_train_microbatch_size.samples, 16);
  EXPECT_EQ(cfg.precision, Precision::kAmpBf16);
  EXPECT_EQ(cfg.seed, 17);
  EXPECT_EQ(cfg.fsdp.strategy, dist::ShardingStrategy::kFullShard);
  EXPECT_EQ(cfg.fsdp.mixed_precision, dist::MixedPrecision::kPure);
  EXPECT_EQ(cfg.console_log_interval, config::Time::batches(1));
}

TEST(Recipes, LlmFoundrysSmallCpuYamlLoadsUnchanged) {
  const TrainConfig cfg = load_train_config(kSource + "/tests/data/foundry/mpt-small-cpu.yaml");
  EXPECT_EQ(cfg.run_name, "mpt_causal_lm_cpu");
  EXPECT_EQ(mpt(cfg).ffn_hidden(), 80);
  EXPECT_EQ(mpt(cfg).loss_fn, "torch_crossentropy");
  EXPECT_EQ(cfg.precision, Precision::kFp32);
  EXPECT_EQ(cfg.eval_subset_num_batches, 5);
  EXPECT_EQ(models::mpt_param_count(mpt(cfg)), 823200);
}

// Keys of LLM Foundry's YAMLs that only tune its Python side are accepted (with a warning); python_log_level sets the
// log level; run_timeout is a real callback.
TEST(Recipes, LlmFoundrysPythonSideKeysAreAcceptedAndPythonLogLevelMaps) {
  std::ifstream in(kSource + "/tests/data/foundry/mpt-125m.yaml");
  const std::string yaml =
      std::string(std::istreambuf_iterator<char>(in), {}) + "python_log_level: WARNING\ndist_timeout: 300.0\n";
  const std::string path = write_recipe("python_side.yaml", yaml);
  const TrainConfig cfg =
      load_train_config(path, {"optimizer.foreach=true", "optimizer.fused=false",
                               "callbacks.scheduled_gc.batch_interval=2000", "callbacks.run_timeout.timeout=600"});
  EXPECT_EQ(cfg.log_level, "warn");
  EXPECT_EQ(cfg.dist_timeout, std::chrono::milliseconds(300000));
  std::vector<std::string> names;
  for (const config::ComponentOptions& c : cfg.callbacks) names.push_back(c.name);
  EXPECT_EQ(names, (std::vector<std::string>{"speed_monitor", "lr_monitor", "memory_monitor", "runtime_estimator",
                                             "scheduled_gc", "run_timeout"}));
  EXPECT_EQ(std::any_cast<const callbacks::RunTimeoutOptions&>(cfg.callbacks.back().options).timeout, 600.0);
  EXPECT_THROW(load_train_config(path, {"python_log_level=loud"}), ConfigError);
}

TEST(Recipes, UnimplementedLlmFoundryKeysAreListedTogether) {
  std::string yaml = "load_ignore_keys: [a]\nloggers:\n  neptune: {}\n  comet_ml: {}\n";
  std::ifstream in(kSource + "/tests/data/foundry/mpt-125m.yaml");
  yaml += std::string(std::istreambuf_iterator<char>(in), {});
  const std::string path = write_recipe("unsupported.yaml", yaml);
  try {
    load_train_config(path, {"fsdp_config.activation_cpu_offload=true"});
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "[recipe] " + path +
                  ": not supported yet: loggers.neptune (logger neptune), loggers.comet_ml (logger comet_ml), "
                  "fsdp_config.activation_cpu_offload (true), load_ignore_keys");
  }
}

TEST(Recipes, OverridesBeatTheFileAndFeedInterpolation) {
  const TrainConfig cfg = load_train_config(
      kSource + "/recipes/mpt-125m.yaml",
      {"variables.max_seq_len=512", "optimizer.lr=1e-4", "optimizer.betas=[0.8, 0.9]",
       "device_train_microbatch_size=auto", "max_duration=2ep", "fsdp_config.sharding_strategy=NO_SHARD"});
  EXPECT_EQ(cfg.max_seq_len, 512);
  EXPECT_EQ(mpt(cfg).max_seq_len, 512);
  EXPECT_EQ(cfg.train_loader.tokens.max_seq_len, 512);
  EXPECT_EQ(cfg.tokenizer.model_max_length, 512);
  EXPECT_DOUBLE_EQ(cfg.optimizer.lr, 1e-4);
  EXPECT_EQ(cfg.optimizer.betas, (std::vector<double>{0.8, 0.9}));
  EXPECT_TRUE(cfg.device_train_microbatch_size.automatic);
  EXPECT_EQ(cfg.max_duration, config::Time::epochs(2));
  EXPECT_EQ(cfg.fsdp.strategy, dist::ShardingStrategy::kNoShard);
}

TEST(Recipes, RunNameFallsBackToEnvironmentThenFileName) {
  const std::string path = kSource + "/recipes/mpt-125m.yaml";
  ::setenv("RUN_NAME", "from-env", 1);
  EXPECT_EQ(load_train_config(path).run_name, "from-env");
  EXPECT_EQ(load_train_config(path, {"variables.run_name=explicit"}).run_name, "explicit");
  ::unsetenv("RUN_NAME");
  EXPECT_EQ(load_train_config(path).run_name, "mpt-125m");
}

TEST(Recipes, DefaultsFollowLlmFoundryAndComposer) {
  const std::string path = write_recipe("minimal.yaml", R"(
max_seq_len: 64
model: {name: mpt_causal_lm, d_model: 32, n_heads: 2, n_layers: 2, vocab_size: 100}
tokenizer: {name: ./tok}
train_loader:
  name: text
  dataset: {local: ./data, max_seq_len: 64}
optimizer: {name: decoupled_adamw}
scheduler: {name: constant_with_warmup, t_warmup: 0.1dur}
max_duration: 1
global_train_batch_size: 8
device_eval_batch_size: 4
)");
  const TrainConfig cfg = load_train_config(path);
  EXPECT_EQ(mpt(cfg).max_seq_len, 2048) << "MPTConfig's default";
  EXPECT_EQ(cfg.max_duration, config::Time::epochs(1)) << "a bare integer is epochs";
  EXPECT_EQ(cfg.eval_interval, config::Time::epochs(1));
  EXPECT_TRUE(cfg.device_train_microbatch_size.automatic);
  EXPECT_EQ(cfg.precision, Precision::kAmpBf16);
  EXPECT_EQ(cfg.seed, 17);
  EXPECT_DOUBLE_EQ(cfg.optimizer.weight_decay, 1e-5) << "Composer's DecoupledAdamW default";
  EXPECT_EQ(cfg.optimizer.betas, (std::vector<double>{0.9, 0.95}));
  EXPECT_EQ(cfg.scheduler.t_warmup, config::Time(0.1, config::TimeUnit::kDuration));
  EXPECT_EQ(cfg.save.interval, config::Time::batches(1000));
  EXPECT_EQ(cfg.train_loader.dataset.shuffle_seed, 9176u) << "StreamingTextDataset's default seed";
  EXPECT_EQ(cfg.train_loader.dataset.shuffle_algo, "py1e");
  EXPECT_FALSE(cfg.fsdp_configured);
  EXPECT_EQ(mpt(cfg).attn.kv_n_heads, 2);
  EXPECT_NEAR(mpt(cfg).init.init_div_is_residual, 2.0, 1e-12) << "sqrt(2 * n_layers)";
}

TEST(Recipes, PreemptionSignalsDefaultToTermAndUsr1AndNameABadOne) {
  const std::string path = kSource + "/recipes/mpt-125m.yaml";
  EXPECT_EQ(load_train_config(path).preemption_signals, (std::vector<int>{SIGTERM, SIGUSR1}));
  EXPECT_EQ(load_train_config(path, {"preemption_signals=[usr2, SIGHUP]"}).preemption_signals,
            (std::vector<int>{SIGUSR2, SIGHUP}));
  EXPECT_TRUE(load_train_config(path, {"preemption_signals=[]"}).preemption_signals.empty());
  try {
    (void)load_train_config(path, {"preemption_signals=[SIGTERM, SIGKILL]"});
    ADD_FAILURE() << "SIGKILL accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("preemption_signals"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("SIGKILL"), std::string::npos) << e.what();
  }
}

TEST(Recipes, InlineIclTasksAndPaths) {
  std::ifstream in(kSource + "/recipes/mpt-125m.yaml");
  std::string base(std::istreambuf_iterator<char>(in), {});
  const std::string inline_path = write_recipe("icl.yaml", base + R"(
icl_tasks:
- label: piqa
  dataset_uri: eval/local_data/commonsense_reasoning/piqa.jsonl
  num_fewshot: [0, 5]
  icl_task_type: multiple_choice
  continuation_delimiter: "\nAnswer: "
)");
  const TrainConfig cfg = load_train_config(inline_path);
  ASSERT_EQ(cfg.icl_tasks.size(), 1u);
  EXPECT_EQ(cfg.icl_tasks[0].num_fewshot, (std::vector<int64_t>{0, 5}));
  const TrainConfig by_path = load_train_config(kSource + "/recipes/mpt-125m.yaml", {"icl_tasks=eval/tasks.yaml"});
  EXPECT_EQ(by_path.icl_tasks_path, "eval/tasks.yaml");
  // icl_subset_num_batches: a positive count or null (unset).
  EXPECT_EQ(load_train_config(inline_path, {"icl_subset_num_batches=3"}).icl_subset_num_batches, 3);
  EXPECT_FALSE(load_train_config(inline_path, {"icl_subset_num_batches=null"}).icl_subset_num_batches.has_value());
  EXPECT_NE(testing::error_of([&] {
              load_train_config(inline_path, {"icl_subset_num_batches=0"});
            }).find("icl_subset_num_batches: expected a positive integer or null, got 0"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera::trainer
