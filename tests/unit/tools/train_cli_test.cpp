// The `train` command: exit codes and the messages users see for bad recipes and bad usage.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "test_util.h"
#include "tiny_data.h"

namespace {

const std::string kSource = ::tessera::testing::source_dir();
const std::string kTrain = ::tessera::testing::train_bin();

using Result = ::tessera::testing::CommandResult;

Result run(const std::string& args) {
  return ::tessera::testing::run_command(kTrain + " " + args);
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Writes recipes/mpt-125m.yaml with `from` replaced by `to`; returns the path and the 1-based line of `to`.
std::pair<std::string, int> mutated(const std::string& name, const std::string& from, const std::string& to) {
  std::string text = read(kSource + "/recipes/mpt-125m.yaml");
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
  const auto dir = std::filesystem::temp_directory_path() / "tessera_cli";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path) << text;
  const int line = 1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<long>(at), '\n'));
  return {path, line};
}

void expect_config_error(const Result& r, const std::string& message) {
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output, "error: " + message + "\n");
}

TEST(TrainCli, DryRunOfEveryShippedRecipeSucceeds) {
  for (const auto& entry : std::filesystem::directory_iterator(kSource + "/recipes")) {
    if (entry.path().extension() != ".yaml") continue;
    std::string overrides;
    for (const std::string& o : tessera::testing::shipped_recipe_overrides(entry.path())) overrides += " " + o;
    const Result r = run("--recipe " + entry.path().string() + " --dry-run --no-preflight" + overrides);
    EXPECT_EQ(r.exit_code, 0) << entry.path() << "\n" << r.output;
    EXPECT_NE(r.output.find("parameters"), std::string::npos);
  }
  const Result r =
      run("--recipe " + kSource + "/recipes/mpt-7b.yaml --dry-run --no-preflight --world-size 64 --ranks-per-node 8");
  EXPECT_NE(r.output.find("6,658,859,008 (6.66 B)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("43.17 GFLOP"), std::string::npos);
  EXPECT_NE(r.output.find("2,097,152 tokens per optimizer step"), std::string::npos);
  EXPECT_NE(r.output.find("2 per step of 8 sequences"), std::string::npos);
  EXPECT_NE(r.output.find("* FULL_SHARD"), std::string::npos);
}

TEST(TrainCli, DryRunAdvisesACheckpointInterval) {
  // Given figures: a failure every 2 h, 60 s synchronous saves, 12 s steps: Daly's 14.8 min is 74 steps.
  const std::string recipe = kSource + "/recipes/mpt-7b.yaml --dry-run --no-preflight --world-size 512 ";
  Result r = run("--recipe " + recipe +
                 "--mtbf-hours 2 --save-seconds 60 --step-seconds 12 save_async=false save_folder=s3://bucket/ckpt");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("14.8 min = save_interval: 74ba (Daly; Young 15.5 min)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("1 min per save (synchronous saves)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the recipe's interval   1000ba"), std::string::npos) << r.output;
  // Estimated: the save folder's write rate and the snapshot copy are measured here; a remote folder needs a figure.
  const std::string dir = ::testing::TempDir() + "/advice";
  r = run("--recipe " + recipe + "--step-seconds 12 save_folder=" + dir + "/{run_name}/checkpoints");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Llama 3's rate"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("measured writing to"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the snapshot:"), std::string::npos) << r.output;
  // A relative save folder none of whose parts exists yet (runs/x/checkpoints in a fresh clone) is measured in the
  // working directory, and nothing is left there.
  r = run("--recipe " + recipe + "--step-seconds 12 save_folder=tessera-no-such-folder/{run_name}/checkpoints");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("measured writing to"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists("tessera-no-such-folder"));
  r = run("--recipe " + recipe + "--step-seconds 12 save_folder=s3://bucket/ckpt");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("s3://bucket/ckpt is remote"), std::string::npos) << r.output;
  // No save folder and no failure rate: no advice.
  EXPECT_EQ(run("--recipe " + recipe).output.find("checkpoint interval"), std::string::npos);
}

// The performance model's estimate on a described cluster. mpt-7b at a global batch of 512 on 16 x 8 H100: compute
// 43.17 GFLOP/token x 1,048,576 tokens x 4/3 (activation checkpointing) / (128 x 989 TFLOP/s x 0.4) = 1.192 s;
// FULL_SHARD moves 3 x 127/128 x 13.3 GB per rank and step over the 50 GB/s inter-node links plus the ring latencies,
// 0.915 s, of which half the compute (0.596 s) hides: a 1.511 s step, 1.192 / 1.511 = 78.9% scaling efficiency.
TEST(TrainCli, DryRunOnAClusterEstimatesStepTimeThroughputAndScaling) {
  const std::string cluster = kSource + "/tests/data/planner/h100-128.yaml";
  Result r = run("--recipe " + kSource + "/recipes/mpt-7b.yaml --dry-run --no-preflight --cluster " + cluster +
                 " global_train_batch_size=512");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("world size                128 (8 per node)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step time           1.511 s: compute 1.192 s at 40% MFU, communication 0.915 s of which "
                          "0.596 s hidden"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("throughput          694067 tokens/s (5422 per device)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("scaling efficiency  78.9% of 128"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("time to train       26.8 h (63900 steps, 120 s startup)"), std::string::npos) << r.output;
  // Llama 3 70B on 64 H100 with tensor parallelism 8 and FSDP over the 8 data-parallel ranks (torchtitan's layout,
  // docs/performance.md): the all-reduces add to the step, and the recommendation searches every configuration.
  r = run("--recipe " + kSource + "/recipes/llama3-70b.yaml --dry-run --no-preflight --cluster " + kSource +
          "/tests/data/planner/h100-64.yaml global_train_batch_size=128 device_train_microbatch_size=16 "
          "fsdp_config.activation_checkpointing=true 'parallelism={tensor_parallel_degree: 8}'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tensor parallelism        groups of 8 ranks (8 data-parallel)"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("configuration       TP 8 x FULL_SHARD, act. ckpt, microbatch 16, 1 microbatch per step"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("throughput          34251 tokens/s (535 per device)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("recommendation      TP 8 x SHARD_GRAD_OP, microbatch 1: 22.827 s per step"),
            std::string::npos)
      << r.output;
  // The world must divide the batch.
  r = run("--recipe " + kSource + "/recipes/llama3-8b.yaml --dry-run --no-preflight --cluster " + cluster);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("not divisible by the world size (128)"), std::string::npos) << r.output;
}

TEST(TrainCli, LlmFoundrysYamlDryRunsUnchanged) {
  for (const char* name : {"mpt-125m.yaml", "mpt-small-cpu.yaml"}) {
    const Result r = run("--recipe " + kSource + "/tests/data/foundry/" + name + " --dry-run --no-preflight");
    EXPECT_EQ(r.exit_code, 0) << r.output;
  }
}

TEST(TrainCli, UsageAndRuntimeExitCodes) {
  EXPECT_EQ(run("--help").exit_code, 0);
  EXPECT_NE(run("--help").output.find("--dry-run"), std::string::npos);
  EXPECT_EQ(run("").exit_code, 2) << "--recipe is required";
  EXPECT_EQ(run("--recipe x.yaml --no-such-flag").exit_code, 2);
  EXPECT_EQ(run("--recipe " + kSource + "/recipes/mpt-125m.yaml --world-size 0 --dry-run --no-preflight").exit_code, 2);
  EXPECT_EQ(run("--recipe " + kSource + "/recipes/mpt-125m.yaml --log-level loud --dry-run --no-preflight").exit_code,
            2);
  // Without the pre-flight, a missing dataset is a failure of the run under way: exit code 1, naming the dataset.
  const Result train =
      run("--recipe " + kSource + "/recipes/mpt-tiny-cpu.yaml --no-preflight variables.data_local=/no/such/data");
  EXPECT_EQ(train.exit_code, 1);
  EXPECT_NE(train.output.find("/no/such/data/train: no index.json"), std::string::npos) << train.output;
}

// Pre-flight: every bad input at once, each under its recipe key and line, exit 2 before anything is started or
// written; the dry run prints its plan and the same problems.
TEST(TrainCli, BadInputsAreAllReportedBeforeTheFirstStepWithExit2) {
  const auto dir = std::filesystem::temp_directory_path() / ("tessera_cli_preflight_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "a-file") << "x";
  const std::string run_name = "preflight-" + std::to_string(::getpid());
  const std::string args = "--recipe " + kSource +
                           "/recipes/mpt-tiny-cpu.yaml variables.data_local=" + (dir / "no-data").string() +
                           " run_name=" + run_name + " save_folder=" + (dir / "a-file" / "ckpt").string() +
                           " load_path=" + (dir / "no-ckpt").string();
  // The data folder is the override's (through the recipe's ${variables.data_local}): the problem names it.
  const std::string data = "command line `variables.data_local=" + (dir / "no-data").string() + "`";
  for (const std::string& mode : {std::string(), std::string(" --dry-run")}) {
    const Result r = run(args + mode);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("mpt-tiny-cpu.yaml: 4 problems found before the first step (nothing was started or "
                            "written):"),
              std::string::npos)
        << r.output;
    for (const std::string& line :
         {data + ": train_loader.dataset.local: " + (dir / "no-data/train/index.json").string() +
              " does not exist (no MDS dataset there)",
          data + ": eval_loader.dataset.local: " + (dir / "no-data/val/index.json").string() +
              " does not exist (no MDS dataset there)",
          "command line `load_path=" + (dir / "no-ckpt").string() + "`: load_path: " + (dir / "no-ckpt").string() +
              " does not exist",
          "command line `save_folder=" + (dir / "a-file/ckpt").string() + "`: save_folder: "}) {
      EXPECT_NE(r.output.find("\n  " + line), std::string::npos) << line << "\n" << r.output;
    }
    EXPECT_EQ(r.output.find("parameters") != std::string::npos, !mode.empty()) << r.output;  // the plan, dry run
    EXPECT_FALSE(std::filesystem::exists("runs/" + run_name));  // no log, export or checkpoint folder
  }
  std::filesystem::remove_all(dir);
}

// At least ten kinds of bad recipe, each with the exact message and exit code 2.
TEST(TrainCli, BadRecipesNameFileKeyAndLine) {
  {  // 1. unknown key, with a suggestion
    auto [path, line] = mutated("typo.yaml", "max_duration: 4800ba", "max_duraton: 4800ba");
    expect_config_error(
        run("--recipe " + path + " --dry-run --no-preflight"),
        "[recipe] " + path + ":" + std::to_string(line) + ": max_duraton: unknown key (did you mean 'max_duration'?)");
  }
  {  // 2. wrong type
    auto [path, line] = mutated("type.yaml", "lr: 6.0e-4", "lr: fast");
    expect_config_error(
        run("--recipe " + path + " --dry-run --no-preflight"),
        "[recipe] " + path + ":" + std::to_string(line) + ": optimizer.lr: expected a number, got a string \"fast\"");
  }
  {  // 3. missing required key (reported at the section that lacks it)
    auto [path, line] = mutated("missing.yaml", "  lr: 6.0e-4\n", "");
    (void)line;
    const Result r = run("--recipe " + path + " --dry-run --no-preflight --print-config");
    EXPECT_EQ(r.exit_code, 0) << "decoupled_adamw has a default lr";
    auto [path2, line2] = mutated("missing2.yaml", "global_train_batch_size: 256\n", "");
    (void)line2;
    expect_config_error(run("--recipe " + path2 + " --dry-run --no-preflight"),
                        "[recipe] " + path2 + ": global_train_batch_size: missing required key");
  }
  {  // 4. malformed duration
    auto [path, line] = mutated("duration.yaml", "eval_interval: 500ba", "eval_interval: 500 batches");
    expect_config_error(
        run("--recipe " + path + " --dry-run --no-preflight"),
        "[recipe] " + path + ":" + std::to_string(line) +
            ": eval_interval: \"500 batches\" has no time unit; write a number followed by ep, ba, sp, tok "
            "or dur (e.g. 100ba)");
  }
  {  // 5. fractional batches
    auto [path, line] = mutated("fraction.yaml", "t_warmup: 100ba", "t_warmup: 1.5ba");
    expect_config_error(run("--recipe " + path + " --dry-run --no-preflight"),
                        "[recipe] " + path + ":" + std::to_string(line) +
                            ": scheduler.t_warmup: a duration in `ba` must be a whole number, got 1.5");
  }
  {  // 6. unresolvable interpolation
    auto [path, line] = mutated("interp.yaml", "shuffle_seed: ${variables.global_seed}\n  drop_last: true",
                                "shuffle_seed: ${variables.global_sed}\n  drop_last: true");
    expect_config_error(run("--recipe " + path + " --dry-run --no-preflight"),
                        "[recipe] " + path + ":" + std::to_string(line) +
                            ": train_loader.dataset.shuffle_seed: cannot resolve ${variables.global_sed}: key "
                            "'variables.global_sed' not found");
  }
  {  // 7. value out of range
    auto [path, line] = mutated("range.yaml", "  n_heads: 12", "  n_heads: 7");
    expect_config_error(run("--recipe " + path + " --dry-run --no-preflight"),
                        "[recipe] " + path + ":" + std::to_string(line) + ": model.n_heads: must divide d_model (768)");
  }
  {  // 8. unknown component name
    auto [path, line] = mutated("name.yaml", "name: decoupled_adamw", "name: adamm");
    expect_config_error(run("--recipe " + path + " --dry-run --no-preflight"),
                        "[recipe] " + path + ":" + std::to_string(line) +
                            ": optimizer.name: unknown optimizer \"adamm\" (available: adamw, decoupled_adamw, "
                            "decoupled_lionw, decoupled_sgdw)");
  }
  {  // 9. not an allowed choice
    auto [path, line] = mutated("choice.yaml", "sharding_strategy: FULL_SHARD", "sharding_strategy: ZERO3");
    expect_config_error(run("--recipe " + path + " --dry-run --no-preflight"),
                        "[recipe] " + path + ":" + std::to_string(line) +
                            ": fsdp_config.sharding_strategy: \"ZERO3\" is not one of: NO_SHARD, SHARD_GRAD_OP, "
                            "FULL_SHARD, HYBRID_SHARD, _HYBRID_SHARD_ZERO2");
  }
  {  // 10. YAML syntax error
    auto [path, line] = mutated("syntax.yaml", "  betas:\n  - 0.9\n  - 0.95", "  betas: [0.9, 0.95");
    const Result r = run("--recipe " + path + " --dry-run --no-preflight");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.output.find("error: [recipe] " + path + ":"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("invalid YAML"), std::string::npos) << r.output;
  }
  {  // 11. duplicate key
    auto [path, line] = mutated("dup.yaml", "eval_first: false", "eval_first: false\neval_first: true");
    expect_config_error(run("--recipe " + path + " --dry-run --no-preflight"),
                        "[recipe] " + path + ":" + std::to_string(line + 1) + ": eval_first: duplicate key");
  }
  {  // 12. a section of the wrong shape
    auto [path, line] = mutated("shape.yaml", "  lr_monitor: {}", "  lr_monitor: yes please");
    expect_config_error(run("--recipe " + path + " --dry-run --no-preflight"),
                        "[recipe] " + path + ":" + std::to_string(line) +
                            ": callbacks.lr_monitor: expected a mapping of keys, got a string \"yes please\"");
  }
  {  // 13. microbatch neither a number nor auto
    auto [path, line] = mutated("micro.yaml", "device_train_microbatch_size: 16", "device_train_microbatch_size: big");
    expect_config_error(run("--recipe " + path + " --dry-run --no-preflight"),
                        "[recipe] " + path + ":" + std::to_string(line) +
                            ": device_train_microbatch_size: expected a positive integer or \"auto\", got a string "
                            "\"big\"");
  }
  {  // 14. interpolation cycle
    auto [path, line] = mutated("cycle.yaml", "  global_seed: 17", "  global_seed: ${seed}");
    const Result r = run("--recipe " + path + " --dry-run --no-preflight");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.output.find("interpolation cycle"), std::string::npos) << r.output;
  }
  // 15. missing file
  expect_config_error(run("--recipe /no/such/recipe.yaml --dry-run --no-preflight"),
                      "[recipe] /no/such/recipe.yaml: cannot open the recipe file");
  // 16. bad command-line override
  expect_config_error(
      run("--recipe " + kSource + "/recipes/mpt-125m.yaml --dry-run --no-preflight optimizer.lr=abc"),
      "[recipe] command line `optimizer.lr=abc`: optimizer.lr: expected a number, got a string \"abc\"");
  expect_config_error(run("--recipe " + kSource + "/recipes/mpt-125m.yaml --dry-run --no-preflight optimizer.lr"),
                      "[recipe] command line `optimizer.lr`: an override must look like key.sub=value");
  // 17. not divisible by the world size
  expect_config_error(
      run("--recipe " + kSource + "/recipes/mpt-125m.yaml --dry-run --no-preflight --world-size 3"),
      "[recipe] " + kSource +
          "/recipes/mpt-125m.yaml: global_train_batch_size (256) is not divisible by the world size (3)");
  // 18. LLM Foundry keys Tessera lacks: one list, exit 2
  expect_config_error(
      run("--recipe " + kSource + "/recipes/mpt-125m.yaml --dry-run --no-preflight loggers.neptune={} " +
          "load_ignore_keys=[a] model.fc_type=te"),
      "[recipe] " + kSource +
          "/recipes/mpt-125m.yaml: not supported yet: model.fc_type (te), loggers.neptune (logger "
          "neptune), load_ignore_keys");
}

// A component name nobody registered: exit 2, the key path and the registered names (research code's entries join
// them; examples/research/research_lm.cpp trains one).
TEST(TrainCli, UnregisteredComponentNamesListTheRegisteredOnes) {
  {
    auto [path, line] = mutated("model_name.yaml", "name: mpt_causal_lm", "name: my_lm");
    // The list is every family the binary registers (sorted); each shipped one must be in it.
    const Result r = run("--recipe " + path + " --dry-run --no-preflight");
    const std::string prefix =
        "error: [recipe] " + path + ":" + std::to_string(line) + ": model.name: unknown model \"my_lm\" (available: ";
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_EQ(r.output.rfind(prefix, 0), 0U) << r.output;
    for (const char* name : {"falcon", "gpt_neo", "gpt_neox", "hf_causal_lm", "llama", "mpt_causal_lm", "opt"}) {
      EXPECT_NE(r.output.find(std::string(", ") + name), std::string::npos) << name << ": " << r.output;
    }
    // Sorted: a family added later takes its place without this test knowing it.
    EXPECT_LT(r.output.find("dbrx, "), r.output.find(", falcon")) << r.output;
    EXPECT_TRUE(r.output.ends_with(")\n")) << r.output;
  }
  {
    auto [path, line] =
        mutated("algorithm_name.yaml", "  gradient_clipping:\n    clipping_type: norm\n    clipping_threshold: 1.0\n",
                "  gradient_clippin: {clipping_type: norm, clipping_threshold: 1.0}\n");
    expect_config_error(run("--recipe " + path + " --dry-run --no-preflight"),
                        "[recipe] " + path + ":" + std::to_string(line) +
                            ": algorithms.gradient_clippin: unknown algorithm \"gradient_clippin\" (available: alibi, "
                            "ema, gradient_clipping, lora, loss_spike_detection, low_precision_layernorm, "
                            "seq_length_warmup)");
  }
  {
    auto [path, line] =
        mutated("callback_name.yaml", "  speed_monitor:\n    window_size: 10\n", "  speed_monitr: {window_size: 10}\n");
    expect_config_error(
        run("--recipe " + path + " --dry-run --no-preflight"),
        "[recipe] " + path + ":" + std::to_string(line) +
            ": callbacks.speed_monitr: unknown callback \"speed_monitr\" (available: early_stopper, health_monitor, "
            "hf_checkpointer, lr_monitor, memory_monitor, oom_observer, optimizer_monitor, run_timeout, "
            "runtime_estimator, scheduled_gc, speed_monitor, threshold_stopper)");
  }
}

}  // namespace

namespace {

// A tiny MPT recipe over a tiny MDS split in a fresh directory, for runs of the `train` binary.
std::string tiny_recipe(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / "tessera_cli" / name;
  ::tessera::testing::write_token_split(dir / "data" / "train", 32, 1);
  const std::string path = (dir / "tiny.yaml").string();
  std::ofstream(path) << "max_seq_len: 32\n"
                         "model: {name: mpt_causal_lm, d_model: 32, n_heads: 2, n_layers: 2, expansion_ratio: 2,\n"
                         "        max_seq_len: 32, vocab_size: 64, attn_config: {attn_impl: torch}}\n"
                         "tokenizer: {name: unused}\n"
                         "train_loader: {name: text, dataset: {local: "
                      << (dir / "data").string()
                      << ", split: train, max_seq_len: 32}, drop_last: true}\n"
                         "optimizer: {name: decoupled_adamw, lr: 0.01}\n"
                         "scheduler: {name: constant_with_warmup, t_warmup: 0ba}\n"
                         "max_duration: 1ba\n"
                         "eval_interval: 0\n"
                         "global_train_batch_size: 8\n"
                         "device_eval_batch_size: 8\n"
                         "device: cpu\n"
                         "callbacks: {speed_monitor: {window_size: 1}}\n";
  return path;
}

}  // namespace

// Issue 37: on a CPU that only emulates bf16 (~50x slower than fp32), `precision: auto` trains in fp32, and an explicit
// amp_bf16 run is warned about by the speed monitor with the measured figures. LibTorch restricted to AVX2
// (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA) emulates bf16 on any x86 CPU, so this holds on every machine.
TEST(TrainCli, OnACpuThatEmulatesBf16AutoPicksFp32AndAmpBf16IsWarnedAbout) {
  const std::string recipe = tiny_recipe("emulated_bf16");
  const std::string avx2 = "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 OMP_NUM_THREADS=1 ";
  const Result autop = ::tessera::testing::run_command(avx2 + kTrain + " --recipe " + recipe + " precision=auto");
  ASSERT_EQ(autop.exit_code, 0) << autop.output;
  EXPECT_NE(autop.output.find("precision: auto -> fp32 (bf16 is "), std::string::npos) << autop.output;
  EXPECT_EQ(autop.output.find("bf16 is emulated on this CPU: "), std::string::npos) << autop.output;
  const Result bf16 = ::tessera::testing::run_command(avx2 + kTrain + " --recipe " + recipe + " precision=amp_bf16");
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  EXPECT_NE(bf16.output.find("speed_monitor: bf16 is emulated on this CPU: "), std::string::npos) << bf16.output;
  EXPECT_NE(bf16.output.find("GFLOP/s; use precision: fp32 (or auto)"), std::string::npos) << bf16.output;
}

// LLM Foundry's python_log_level sets train's log level; an explicit --log-level wins.
TEST(TrainCli, PythonLogLevelSetsTheLogLevelUnlessTheFlagIsGiven) {
  const std::string recipe = tiny_recipe("python_log_level");
  const Result quiet = ::tessera::testing::run_command(kTrain + " --recipe " + recipe + " python_log_level=WARNING");
  ASSERT_EQ(quiet.exit_code, 0) << quiet.output;
  EXPECT_EQ(quiet.output.find("[info]"), std::string::npos) << quiet.output;
  const Result flag =
      ::tessera::testing::run_command(kTrain + " --recipe " + recipe + " python_log_level=WARNING --log-level info");
  ASSERT_EQ(flag.exit_code, 0) << flag.output;
  EXPECT_NE(flag.output.find("[info]"), std::string::npos) << flag.output;
}
