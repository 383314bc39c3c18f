// Fine-tuning in the trainer (tests/composer/test_finetuning_vs_llmfoundry.py checks the batches against LLM
// Foundry's loader): gradient accumulation over padded batches normalised by loss tokens, a crash-and-resume of a
// packed, shuffled fine-tuning run ending bitwise on the uninterrupted weights, and bad rows named by file and line.
#include "tessera/data/finetuning.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tessera/config/value.h"
#include "tessera/data/tokenizer.h"
#include "tessera/trainer/trainer.h"
#include "tessera/util/error.h"
#include "tiny_data.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;

// A byte-level tokenizer (Tessera's BPE trainer) saved as a folder whose eos is <|endoftext|>, and 40 prompt/response
// rows of very different lengths (so microbatches hold different numbers of loss tokens).
fs::path workdir() {
  static const fs::path dir = [] {
    const fs::path d = fs::temp_directory_path() / "tessera_finetuning_test";
    fs::remove_all(d);
    fs::create_directories(d / "tok");
    std::vector<std::string> docs;
    std::ofstream rows(d / "train.jsonl");
    for (int i = 0; i < 40; ++i) {
      std::string prompt = "count " + std::to_string(i) + ":", response;
      for (int k = 0; k < 1 + (i * 7) % 23; ++k) response += " " + std::to_string((i + k) % 10);
      docs.push_back(prompt + response);
      rows << nlohmann::json{{"prompt", prompt}, {"response", response}}.dump() << "\n";
    }
    BpeTrainerOptions o;
    o.vocab_size = 300;
    o.min_frequency = 1;
    train_bpe_tokenizer(docs, o).save(d / "tok" / "tokenizer.json");
    std::ofstream(d / "tok" / "tokenizer_config.json") << R"({"eos_token": "<|endoftext|>"})";
    return d;
  }();
  return dir;
}

trainer::TrainConfig config(const std::string& run, const std::vector<std::string>& overrides) {
  const fs::path d = workdir();
  const std::string yaml = R"(
max_seq_len: 48
model: {name: mpt_causal_lm, d_model: 32, n_heads: 2, n_layers: 2, expansion_ratio: 2, max_seq_len: 48,
        vocab_size: 320, attn_config: {attn_impl: torch, attn_uses_sequence_id: true}}
tokenizer: {name: )" + (d / "tok").string() +
                           R"(}
train_loader:
  name: finetuning
  dataset: {hf_name: json, hf_kwargs: {data_files: {train: )" +
                           (d / "train.jsonl").string() + R"(}}, split: train, max_seq_len: 48,
            decoder_only_format: true, shuffle: true, shuffle_seed: 5}
  drop_last: true
optimizer: {name: decoupled_sgdw, lr: 0.5, weight_decay: 0.0}
scheduler: {name: constant_with_warmup, t_warmup: 0ba}
max_duration: 3ba
global_train_batch_size: 8
device_train_microbatch_size: 8
device_eval_batch_size: 8
precision: fp32
seed: 3
log_to_console: false
save_folder: )" + (d / "runs" / run).string() +
                           R"(
save_interval: 2ba
)";
  config::Value v = config::parse_yaml(yaml, config::Origin{"ft.yaml", 1, ""});
  for (const std::string& o : overrides) config::apply_override(v, o);
  config::resolve_interpolations(v);
  return trainer::parse_train_config(std::move(v), "ft.yaml");
}

std::vector<at::Tensor> weights_of(trainer::Trainer& t) {
  std::vector<at::Tensor> out;
  for (const auto& p : t.state().model->parameters()) out.push_back(p.detach().clone());
  return out;
}

TEST(Finetuning, AccumulationOverPaddedBatchesMatchesOneBigBatch) {
  // Rows of 4 .. 48 tokens: weighting microbatches by samples would differ from the whole batch; by loss tokens
  // (LLM Foundry's accumulate_train_batch_on_tokens) it is the same gradient.
  std::vector<std::vector<at::Tensor>> w;
  for (const char* micro : {"device_train_microbatch_size=8", "device_train_microbatch_size=2"}) {
    fs::remove_all(workdir() / "runs" / "acc");
    trainer::Trainer t(config("acc", {micro}));
    t.fit();
    w.push_back(weights_of(t));
  }
  for (size_t i = 0; i < w[0].size(); ++i) EXPECT_TRUE(at::allclose(w[0][i], w[1][i], 1e-5, 1e-6)) << "tensor " << i;
  fs::remove_all(workdir() / "runs" / "acc");
  trainer::Trainer samples(config("acc", {"device_train_microbatch_size=2", "accumulate_train_batch_on_tokens=false"}));
  samples.fit();
  const auto by_samples = weights_of(samples);
  bool differs = false;
  for (size_t i = 0; i < w[0].size(); ++i) differs = differs || !at::allclose(w[0][i], by_samples[i], 1e-5, 1e-6);
  EXPECT_TRUE(differs) << "sample weighting should differ on padded batches";
}

TEST(Finetuning, APackedRunResumedAfterACrashEndsOnTheUninterruptedWeights) {
  const std::vector<std::string> packed = {"train_loader.dataset.packing_ratio=1.5", "max_duration=2ep",
                                           "deterministic_mode=true"};
  for (const char* run : {"whole", "resumed"}) fs::remove_all(workdir() / "runs" / run);
  trainer::Trainer whole(config("whole", packed));
  EXPECT_EQ(*whole.state().dataloader_len, 3);  // 40 examples, 12 per batch of 8 packed rows
  whole.fit();
  const auto expected = weights_of(whole);
  {
    trainer::Trainer first(config("resumed", packed),
                           {.algorithms = {}, .callbacks = {std::make_shared<testing::CrashAt>(3)}});
    first.fit();
  }
  auto again = packed;
  again.push_back("autoresume=true");
  trainer::Trainer second(config("resumed", again));
  EXPECT_EQ(second.state().timestamp.batch, 2);  // mid-epoch: the first two batches are collated again and dropped
  EXPECT_EQ(second.state().timestamp.batch_in_epoch, 2);
  second.fit();
  EXPECT_EQ(second.state().timestamp.batch, 6);
  const auto got = weights_of(second);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::equal(got[i], expected[i])) << "tensor " << i;
}

TEST(Finetuning, BadRowsAreNamedByFileAndLine) {
  const fs::path d = workdir() / "bad";
  fs::create_directories(d);
  const ChatTokenizer tok(Tokenizer::from_file(workdir() / "tok"), "1 Jan 2026");
  const auto error_of = [&](const std::string& jsonl) {
    std::ofstream(d / "train.jsonl") << jsonl;
    FinetuningOptions o;
    o.hf_name = d.string();
    o.max_seq_len = 32;
    try {
      FinetuningDataset ds(o, tok, 2);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string file = (d / "train.jsonl").string();
  EXPECT_NE(error_of("{\"prompt\": \"a\", \"response\": \"b\"}\n{\"prompt\": \"a\",\n").find(file + ":2: malformed"),
            std::string::npos);
  EXPECT_NE(error_of("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"user\", \"content\": "
                     "\"x\"}]}\n")
                .find(file + ":1: the last message must be from the assistant"),
            std::string::npos);
  EXPECT_NE(error_of("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"user\", \"content\": "
                     "\"x\"}, {\"role\": \"assistant\", \"content\": \"y\"}]}\n")
                .find(file + ":1: message 1: two user messages in a row"),
            std::string::npos);
  EXPECT_NE(error_of("{\"prompt\": \"a\", \"answer\": \"b\"}\n").find("unknown example type with keys"),
            std::string::npos);
  EXPECT_NE(error_of("{\"prompt\": \"" + std::string(200, 'x') + "\", \"response\": \"b\"}\n")
                .find("no valid examples after dropping 1"),
            std::string::npos);
}

// A hub dataset id that is not a local folder is read from its snapshot in the Hugging Face cache (HF_HUB_CACHE), and
// the preprocessing function LLM Foundry registers under that id applies (its outputs are checked against LLM Foundry
// in tests/composer/test_finetuning_vs_llmfoundry.py).
TEST(Finetuning, AHubIdIsReadFromTheCacheWithItsRegisteredPreprocessing) {
  const fs::path hub = workdir() / "hub";
  const fs::path snapshot = hub / "datasets--tatsu-lab--alpaca" / "snapshots" / "0123abc";
  fs::create_directories(snapshot / "data");
  fs::create_directories(hub / "datasets--tatsu-lab--alpaca" / "refs");
  std::ofstream(hub / "datasets--tatsu-lab--alpaca" / "refs" / "main") << "0123abc";
  std::ofstream(snapshot / "data" / "train-00000-of-00001.jsonl")
      << "{\"text\": \"Say hi.\\n\\n### Response: hi\", \"instruction\": \"Say hi.\"}\n"
      << "{\"text\": \"Count.\\n### Response:1 2 3\", \"instruction\": \"Count.\"}\n";
  std::ofstream(snapshot / "README.md") << "# alpaca";
  const char* old = std::getenv("HF_HUB_CACHE");
  const std::string saved = old ? old : "";
  setenv("HF_HUB_CACHE", hub.c_str(), 1);
  FinetuningOptions o;
  o.hf_name = "tatsu-lab/alpaca";
  const auto rows = read_finetuning_rows(o);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].first, (nlohmann::ordered_json{{"prompt", "Say hi.\n\n### Response:"}, {"response", " hi"}}));
  EXPECT_EQ(rows[1].first, (nlohmann::ordered_json{{"prompt", "Count.\n### Response:"}, {"response", "1 2 3"}}));
  EXPECT_NE(rows[0].second.find("train-00000-of-00001.jsonl:1"), std::string::npos);
  o.hf_name = "tatsu-lab/not-cached";
  std::string error;
  try {
    read_finetuning_rows(o);
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("tatsu-lab/not-cached: no such folder"), std::string::npos) << error;
  EXPECT_NE(error.find(hub.string()), std::string::npos) << error;
  if (old) {
    setenv("HF_HUB_CACHE", saved.c_str(), 1);
  } else {
    unsetenv("HF_HUB_CACHE");
  }
}

}  // namespace
}  // namespace tessera::data
