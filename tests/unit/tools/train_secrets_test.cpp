// Issue 61: secrets written into a recipe (a password in the MLflow tracking URI's user-info, a Hugging Face token in
// model.use_auth_token, a token in a URI's query) are used but never leave the process: a tiny `train` run with every
// writer on (JSONL, TensorBoard, MLflow against a stand-in server, checkpoints) writes none of them to any file, the
// console or the server's params; the checkpoint's stored recipe, with "***" in their place, still parses as a recipe.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "loggers/fake_mlflow_server.h"
#include "tessera/config/value.h"
#include "tessera/trainer/train_config.h"
#include "tessera/util/file_io.h"
#include "test_util.h"
#include "tiny_data.h"

namespace train_secrets_test {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPassword = "PWSECRET-hunter2";
constexpr const char* kHfToken = "hf_PLANTEDtokenSECRET";
constexpr const char* kQueryToken = "qsSECRET42";

TEST(TrainSecrets, NoSecretOfTheRecipeReachesAFileTheConsoleOrTheTrackingServer) {
  const tessera::util::TempFolder tmp("train_secrets");
  const fs::path dir = tmp.path;
  const fs::path run = dir / "run";  // the run's working folder: everything it writes is under it
  fs::create_directories(run);
  tessera::testing::write_token_split(dir / "data" / "train", 16, 1);
  // A tiny GPT-2 through hf_causal_lm (not pretrained: no weights), which accepts use_auth_token.
  nlohmann::json hf = nlohmann::json::parse(
      tessera::util::read_file(std::string(tessera::testing::source_dir()) + "/tests/data/hub_configs/gpt2.json"));
  hf.update({{"n_embd", 32}, {"n_head", 2}, {"n_layer", 2}, {"n_positions", 32}, {"n_ctx", 32}, {"vocab_size", 64}});
  fs::create_directories(dir / "tiny-gpt2");
  std::ofstream(dir / "tiny-gpt2" / "config.json") << hf.dump(2);

  tessera::testing::FakeMlflowServer server;
  const std::string recipe = (dir / "recipe.yaml").string();
  std::ofstream(recipe) << fmt::format(R"(variables:
  hf_token: {hf_token}
  shards_url: "https://example.com/shards?token={query}&page=2"
run_name: secrets
max_seq_len: 32
model:
  name: hf_causal_lm
  pretrained_model_name_or_path: {dir}/tiny-gpt2
  pretrained: false
  use_auth_token: ${{variables.hf_token}}
tokenizer: {{name: unused}}
train_loader: {{name: text, dataset: {{local: {dir}/data, split: train, max_seq_len: 32}}, drop_last: true}}
optimizer: {{name: decoupled_adamw, lr: 0.01}}
scheduler: {{name: constant_with_warmup, t_warmup: 0ba}}
max_duration: 2ba
eval_interval: 0
global_train_batch_size: 8
device: cpu
precision: fp32
save_folder: {run}/{{run_name}}/checkpoints
save_interval: 1ba
loggers:
  jsonl: {{filename: {run}/metrics.jsonl}}
  tensorboard: {{log_dir: {run}/tensorboard}}
  mlflow:
    tracking_uri: http://alice:{password}@127.0.0.1:{port}
    experiment_name: secrets
    synchronous: true
)",
                                       fmt::arg("hf_token", kHfToken), fmt::arg("query", kQueryToken),
                                       fmt::arg("dir", dir.string()), fmt::arg("run", run.string()),
                                       fmt::arg("password", kPassword), fmt::arg("port", server.port()));
  const std::string env =
      "env -u MLFLOW_TRACKING_URI -u MLFLOW_TRACKING_TOKEN -u MLFLOW_TRACKING_USERNAME -u MLFLOW_TRACKING_PASSWORD "
      "-u MLFLOW_EXPERIMENT_ID -u MLFLOW_EXPERIMENT_NAME -u MLFLOW_RUN_ID -u RUN_NAME OMP_NUM_THREADS=1 ";
  const auto result = tessera::testing::run_command("cd " + run.string() + " && " + env +
                                                    tessera::testing::train_bin() + " --recipe " + recipe);
  ASSERT_EQ(result.exit_code, 0) << result.output;

  const std::vector<std::string> secrets = {kPassword, kHfToken, kQueryToken};
  auto expect_none = [&](const std::string& where, const std::string& text) {
    for (const std::string& s : secrets) EXPECT_EQ(text.find(s), std::string::npos) << s << " in " << where;
  };
  // The console.
  expect_none("the console output", result.output);
  EXPECT_NE(result.output.find(fmt::format("http://***@127.0.0.1:{}", server.port())), std::string::npos)
      << result.output;
  // Every file the run wrote.
  std::vector<fs::path> metadata;
  size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(run)) {
    if (!e.is_regular_file()) continue;
    ++files;
    expect_none(e.path().string(), tessera::util::read_file(e.path().string()));
    if (e.path().filename() == "metadata.json") metadata.push_back(e.path());
  }
  EXPECT_GE(files, 4U);  // metrics.jsonl, an event file, two checkpoints' files
  ASSERT_FALSE(metadata.empty());
  // What went to the tracking server: params and metrics (the real password authenticated every request).
  bool params = false;
  for (const auto& r : server.requests()) {
    expect_none(r.method + " " + r.target, r.target + "\n" + r.body);
    EXPECT_EQ(r.header("Authorization"), "Basic YWxpY2U6UFdTRUNSRVQtaHVudGVyMg==");  // base64("alice:PWSECRET-hunter2")
    if (r.body.find("\"model.use_auth_token\"") != std::string::npos) {
      params = true;
      const auto batch = nlohmann::json::parse(r.body);
      for (const auto& p : batch.at("params")) {
        if (p.at("key") == "model.use_auth_token" || p.at("key") == "variables.hf_token") {
          EXPECT_EQ(p.at("value"), "***");
        }
        if (p.at("key") == "loggers.mlflow.tracking_uri") {
          EXPECT_EQ(p.at("value"), fmt::format("http://***@127.0.0.1:{}", server.port()));
        }
      }
    }
  }
  EXPECT_TRUE(params);

  // The recipe as the checkpoint stores it: the secrets are "***", the rest as resolved, and it parses again.
  const auto meta = nlohmann::json::parse(tessera::util::read_file(metadata.front().string()));
  const nlohmann::json& stored = meta.at("config");
  EXPECT_EQ(stored.at("model").at("use_auth_token"), "***");
  EXPECT_EQ(stored.at("variables").at("shards_url"), "https://example.com/shards?token=***&page=2");
  EXPECT_EQ(stored.at("loggers").at("mlflow").at("tracking_uri"),
            fmt::format("http://***@127.0.0.1:{}", server.port()));
  EXPECT_EQ(stored.at("max_seq_len"), 32);
  EXPECT_NO_THROW(tessera::trainer::parse_train_config(
      tessera::config::parse_yaml(stored.dump(), tessera::config::Origin{"metadata.json", 0, ""}), "metadata.json"));
}

}  // namespace
}  // namespace train_secrets_test
