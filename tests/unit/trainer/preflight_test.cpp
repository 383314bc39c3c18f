// Pre-flight: every input and output a run will touch, checked before anything is built, with every problem reported
// at once under its recipe key and line, exit 2, and nothing written.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tessera/checkpoint/hf.h"
#include "tessera/data/tokenizer.h"
#include "tessera/models/causal_lm.h"
#include "tessera/trainer/preflight.h"
#include "tessera/trainer/trainer.h"
#include "test_util.h"
#include "tiny_data.h"

// A named namespace: the sanitizer trees' unity batches put this file beside the other trainer tests.
namespace preflight_test {
namespace {

namespace fs = std::filesystem;
using tessera::trainer::PreflightProblem;

struct Dirs {
  fs::path root = fs::temp_directory_path() / ("tessera_preflight_" + std::to_string(::getpid()));
  Dirs() {
    fs::remove_all(root);
    fs::create_directories(root);
  }
  ~Dirs() { fs::remove_all(root); }
};

// The problems by key.
std::map<std::string, PreflightProblem> by_key(const std::vector<PreflightProblem>& problems) {
  std::map<std::string, PreflightProblem> out;
  for (const PreflightProblem& p : problems) out.emplace(p.key, p);
  return out;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Preflight, EveryMissingInputAndUnwritableOutputIsReportedAtOnceWithItsKeyAndLine) {
  Dirs d;
  const fs::path blocker = d.root / "a-file";
  std::ofstream(blocker) << "not a folder";
  const std::string under = (blocker / "sub").string();
  const std::string extra = "icl_tasks: " + (d.root / "tasks.yaml").string() +
                            "\nload_path: " + (d.root / "no-checkpoint").string() + "\nsave_folder: " + under +
                            "/ckpt\nloggers:\n  jsonl: {filename: " + under +
                            "/metrics.jsonl}\n  mlflow: {tracking_uri: 'http://127.0.0.1:9'}\n"
                            "callbacks:\n  hf_checkpointer: {save_folder: " +
                            under + "/hf}\n";
  const tessera::trainer::TrainConfig cfg = tessera::testing::tiny_train_config(d.root / "no-data", extra);
  const auto problems = by_key(tessera::trainer::preflight(cfg, {.rank = 0, .probe_writes = true}));
  // tiny.yaml's lines: tokenizer 5, train_loader 6, eval_loader 7, then `extra` from line 14.
  const std::map<std::string, std::pair<std::string, std::string>> expected = {
      {"train_loader.dataset.local", {"tiny.yaml:6", "no-data/train/index.json does not exist"}},
      {"eval_loader.dataset.local", {"tiny.yaml:7", "no-data/val/index.json does not exist"}},
      {"tokenizer.name", {"tiny.yaml:5", "unused"}},  // needed: the run has ICL tasks
      {"icl_tasks", {"tiny.yaml:14", "tasks.yaml does not exist"}},
      {"load_path", {"tiny.yaml:15", "no-checkpoint does not exist"}},
      {"save_folder", {"tiny.yaml:16", "a-file is a file, not a folder"}},
      {"loggers.jsonl.filename", {"tiny.yaml:18", "a-file is a file, not a folder"}},
      {"loggers.mlflow.tracking_uri", {"tiny.yaml:19", "127.0.0.1:9"}},
      {"callbacks.hf_checkpointer.save_folder", {"tiny.yaml:21", "a-file is a file, not a folder"}},
  };
  for (const auto& [key, want] : expected) {
    ASSERT_TRUE(problems.count(key)) << key;
    EXPECT_EQ(problems.at(key).where, want.first) << key;
    EXPECT_TRUE(has(problems.at(key).message, want.second)) << key << ": " << problems.at(key).message;
  }
  EXPECT_EQ(problems.size(), expected.size());
  // As an error: every problem in one message, exit 2; and the Trainer stops there, before writing anything.
  try {
    tessera::trainer::Trainer trainer(cfg);
    FAIL() << "the Trainer was built";
  } catch (const tessera::trainer::PreflightError& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_EQ(e.problems().size(), expected.size());
    EXPECT_TRUE(has(e.what(), "9 problems found before the first step (nothing was started or written):")) << e.what();
    EXPECT_TRUE(has(e.what(), "\n  tiny.yaml:16: save_folder: ")) << e.what();
  }
  EXPECT_TRUE(fs::is_regular_file(blocker));
  EXPECT_EQ(std::distance(fs::directory_iterator(d.root), fs::directory_iterator()), 1);
}

TEST(Preflight, CorruptAndMismatchedInputsAreFoundBeforeTheFirstStep) {
  Dirs d;
  const fs::path data = d.root / "data";
  tessera::testing::write_token_split(data / "train", 64, 1);
  tessera::testing::write_token_split(data / "val", 16, 2);
  fs::remove(data / "train" / "shard.00000.mds");
  // A tokenizer.json that does not parse; then one with more tokens than the model's 64 embeddings.
  std::ofstream(d.root / "tokenizer.json") << "{\"model\": ";
  const fs::path big = d.root / "big";
  fs::create_directories(big);
  tessera::data::train_bpe_tokenizer({"the cat sat on the mat"}, {.vocab_size = 300}).save(big / "tokenizer.json");
  // An HF folder of a wider model.
  const tessera::trainer::TrainConfig wide =
      tessera::testing::tiny_train_config(data, "", {"model.d_model=64", "model.init_device=cpu"});
  auto model = tessera::models::model_registry().build(wide.model.name, wide.model, "cpu", 0);
  tessera::checkpoint::save_hf_model(*model, (d.root / "wide-hf").string());

  const std::string overrides_base = "tokenizer.name=" + (d.root / "tokenizer.json").string();
  auto cfg =
      tessera::testing::tiny_train_config(data, "", {overrides_base, "load_path=" + (d.root / "wide-hf").string()});
  auto problems = by_key(tessera::trainer::preflight(cfg));
  ASSERT_EQ(problems.size(), 3u);
  EXPECT_TRUE(has(problems.at("train_loader.dataset.local").message,
                  "1 of the 1 shards index.json lists are missing (first: shard.00000.mds)"))
      << problems.at("train_loader.dataset.local").message;
  EXPECT_TRUE(has(problems.at("tokenizer.name").message, "tokenizer.json")) << problems.at("tokenizer.name").message;
  EXPECT_EQ(problems.at("tokenizer.name").where, "command line `" + overrides_base + "`");
  EXPECT_TRUE(has(problems.at("load_path").message, "[64")) << problems.at("load_path").message;

  // A model whose checkpoints (fp32 weights and Adam's two moments: 12 bytes per parameter) the disk cannot hold.
  cfg = tessera::testing::tiny_train_config(data, "save_folder: " + (d.root / "ckpt").string() + "\n",
                                            {"model.d_model=16384", "model.n_heads=128", "model.n_layers=200"});
  problems = by_key(tessera::trainer::preflight(cfg));
  ASSERT_TRUE(problems.count("save_folder"));
  EXPECT_TRUE(has(problems.at("save_folder").message, "GB free, and the run keeps up to 1 checkpoint(s) of "))
      << problems.at("save_folder").message;

  cfg = tessera::testing::tiny_train_config(data, "", {"tokenizer.name=" + big.string()});
  problems = by_key(tessera::trainer::preflight(cfg));
  ASSERT_TRUE(problems.count("tokenizer.name"));
  const int64_t tokens = tessera::data::Tokenizer::from_file(big / "tokenizer.json").vocab_size();
  EXPECT_TRUE(has(problems.at("tokenizer.name").message,
                  "has " + std::to_string(tokens) + " tokens, more than the model's vocab_size 64"))
      << problems.at("tokenizer.name").message;
}

// A checkpoint of a narrower model: the run that would resume from it, or load it, is refused before it builds.
TEST(Preflight, ACheckpointOfAnotherModelIsRefusedAsResumePointAndAsLoadPath) {
  Dirs d;
  const fs::path data = d.root / "data";
  tessera::testing::write_token_split(data / "train", 64, 1);
  tessera::testing::write_token_split(data / "val", 16, 2);
  const std::string save = "save_folder: " + (d.root / "ckpt").string() + "\n";
  {
    tessera::trainer::Trainer trainer(tessera::testing::tiny_train_config(data, save, {"max_duration=1ba"}));
    trainer.fit();
  }
  ASSERT_TRUE(fs::exists(d.root / "ckpt" / "ep0-ba1" / "metadata.json"));
  auto cfg = tessera::testing::tiny_train_config(data, save + "autoresume: true\n", {"model.d_model=64"});
  auto problems = by_key(tessera::trainer::preflight(cfg));
  ASSERT_EQ(problems.size(), 1u) << tessera::trainer::render_preflight(cfg, tessera::trainer::preflight(cfg));
  EXPECT_TRUE(has(problems.at("autoresume").message, "ep0-ba1: transformer.")) << problems.at("autoresume").message;
  EXPECT_TRUE(has(problems.at("autoresume").message, "in the model (another model size?)"));
  cfg = tessera::testing::tiny_train_config(data, "",
                                            {"model.d_model=64", "load_path=" + (d.root / "ckpt/ep0-ba1").string()});
  problems = by_key(tessera::trainer::preflight(cfg));
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_TRUE(has(problems.at("load_path").message, "in the model (another model size?)"));
}

TEST(Preflight, AGoodRecipePassesAndAnUnusedTokenizerIsNotRequired) {
  Dirs d;
  const fs::path data = d.root / "data";
  tessera::testing::write_token_split(data / "train", 64, 1);
  tessera::testing::write_token_split(data / "val", 16, 2);
  const auto cfg = tessera::testing::tiny_train_config(
      data, "save_folder: " + (d.root / "ckpt").string() +
                "\nloggers: {jsonl: {filename: " + (d.root / "logs/m.jsonl").string() + "}}\n");
  const auto problems = tessera::trainer::preflight(cfg, {.rank = 0, .probe_writes = true});
  EXPECT_TRUE(problems.empty()) << tessera::trainer::render_preflight(cfg, problems);
  EXPECT_FALSE(fs::exists(d.root / "ckpt"));  // checked, not created
  EXPECT_FALSE(fs::exists(d.root / "logs"));
}

}  // namespace
}  // namespace preflight_test
