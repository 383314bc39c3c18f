// Extension points beyond the model (docs/api.md#extension-points): the training loss (the built-in `cross_entropy`
// against its definition; the precedence of TrainerParts::loss, a recipe's `loss:` and the model's own
// CausalLM::loss), evaluation metrics (from the model and from a recipe's `metrics:`, against counts made here), and
// config.json model_types registered beside a family, and data loaders registered by name (trained from, checkpointed
// and resumed where they stood).
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tessera/data/data_loader.h"
#include "tessera/models/causal_lm.h"
#include "tessera/models/loss.h"
#include "tessera/models/metric.h"
#include "tessera/trainer/trainer.h"
#include "tessera/util/error.h"
#include "tiny_data.h"

// File-local names live in a named namespace: the sanitizer trees build the tests as unity batches, where an
// anonymous namespace is shared with the other trainer tests (trainer_test.cpp has a dataset() too).
namespace tessera::trainer::extension_points_test {

namespace fs = std::filesystem;

fs::path dataset() {
  static const fs::path dir = [] {
    const fs::path d = fs::temp_directory_path() / "tessera_loss_metrics_test";
    testing::write_token_split(d / "train", 16, 1);
    testing::write_token_split(d / "val", 10, 2);
    return d;
  }();
  return dir;
}

// One batch of 8 in one microbatch (so the step's loss is the microbatch's sum over its own loss tokens), evaluated
// once at the end in batches of 4.
TrainConfig one_batch(const std::string& extra = "", const std::vector<std::string>& overrides = {}) {
  std::vector<std::string> o = {"max_duration=1ba", "eval_interval=1ba"};
  o.insert(o.end(), overrides.begin(), overrides.end());
  return testing::tiny_train_config(dataset(), "device_train_microbatch_size: 8\ndevice_eval_batch_size: 4\n" + extra,
                                    o);
}

// The definition, token by token in double: (1 - e) * -log p(y) + e * mean over v of -log p(v) + z * (log Z)^2,
// summed over the positions whose next label is not ignored.
double reference_sum(const at::Tensor& logits, const at::Tensor& labels, double e, double z) {
  const at::Tensor l = logits.to(at::kDouble);
  const at::Tensor logp = at::log_softmax(l, -1), lse = at::logsumexp(l, {-1});
  double total = 0;
  for (int64_t b = 0; b < labels.size(0); ++b) {
    for (int64_t t = 0; t + 1 < labels.size(1); ++t) {
      const int64_t y = labels[b][t + 1].item<int64_t>();
      if (y == data::kIgnoreLabel) continue;
      total += (1 - e) * -logp[b][t][y].item<double>() + e * -logp[b][t].mean().item<double>() +
               z * std::pow(lse[b][t].item<double>(), 2);
    }
  }
  return total;
}

TEST(Losses, CrossEntropyWithSmoothingAndZLossIsTheirDefinition) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor logits = at::empty({3, 6, 11}).normal_(0, 2, gen);
  data::TokenBatch batch;
  batch.labels = at::randint(11, {3, 6}, gen, at::kLong);
  batch.labels[0][2] = data::kIgnoreLabel;
  batch.labels[2][5] = data::kIgnoreLabel;
  batch.labels[1][0] = data::kIgnoreLabel;  // position 0's label is never predicted: no effect
  for (const auto& [e, z] : std::vector<std::pair<double, double>>{{0, 0}, {0.1, 0}, {0, 1e-3}, {0.25, 0.01}}) {
    const double got = models::CrossEntropyLoss({e, z}).sum(logits, batch).item<double>();
    EXPECT_NEAR(got, reference_sum(logits, batch.labels, e, z), 1e-4) << "label_smoothing " << e << ", z_loss " << z;
  }
  // Without either, it is the model protocol's default loss.
  EXPECT_NEAR(models::CrossEntropyLoss().sum(logits, batch).item<double>(),
              models::causal_lm_loss(logits, batch.labels, data::kIgnoreLabel, at::Reduction::Sum).item<double>(),
              1e-6);
}

// Records, at AFTER_LOSS of every training microbatch, the step's loss and what `expected` says it should be.
class LossCheck : public core::Callback {
 public:
  explicit LossCheck(std::function<double(const core::State&)> expected) : expected_(std::move(expected)) {}
  std::string name() const override { return "LossCheck"; }
  void run_event(core::Event e, core::State& s, core::Logger& /*l*/) override {
    if (e != core::Event::kAfterLoss) return;
    got.push_back(s.loss.item<double>());
    want.push_back(expected_(s));
  }
  std::vector<double> got, want;

 private:
  std::function<double(const core::State&)> expected_;
};

// The step's loss as the trainer normalises it: the microbatch's sum over its loss tokens.
double per_token(const at::Tensor& sum, const core::State& s) {
  return sum.item<double>() / static_cast<double>(data::loss_token_count(s.batch));
}

TEST(Losses, ARecipesLossIsTheOneTrainedOnAndTrainerPartsComeFirst) {
  const std::string recipe_loss = "loss: {name: cross_entropy, label_smoothing: 0.2, z_loss: 0.001}\n";
  auto smoothed = std::make_shared<LossCheck>([](const core::State& s) {
    return per_token(models::CrossEntropyLoss({0.2, 0.001}).sum(s.outputs, s.batch), s);
  });
  {
    Trainer t(one_batch(recipe_loss), {.algorithms = {}, .callbacks = {smoothed}});
    t.fit();
  }
  ASSERT_EQ(smoothed->got.size(), 1u);
  EXPECT_NEAR(smoothed->got[0], smoothed->want[0], 1e-6);

  // The default is plain cross-entropy, which label smoothing raises on the same first batch (same seed and data).
  auto plain = std::make_shared<LossCheck>([](const core::State& s) {
    return per_token(models::causal_lm_loss(s.outputs, s.batch.labels, data::kIgnoreLabel, at::Reduction::Sum), s);
  });
  {
    Trainer t(one_batch(), {.algorithms = {}, .callbacks = {plain}});
    t.fit();
  }
  ASSERT_EQ(plain->got.size(), 1u);
  EXPECT_NEAR(plain->got[0], plain->want[0], 1e-6);
  EXPECT_GT(smoothed->got[0], plain->got[0] + 0.05);

  // A loss given in C++ wins over the recipe's.
  struct Tripled : models::Loss {
    at::Tensor sum(const at::Tensor& logits, const data::TokenBatch& b) const override {
      return 3 * models::causal_lm_loss(logits, b.labels, data::kIgnoreLabel, at::Reduction::Sum);
    }
  };
  auto tripled = std::make_shared<LossCheck>([&](const core::State& /*s*/) { return 3 * plain->want[0]; });
  {
    Trainer t(one_batch(recipe_loss), {.algorithms = {}, .callbacks = {tripled}, .loss = std::make_shared<Tripled>()});
    t.fit();
  }
  ASSERT_EQ(tripled->got.size(), 1u);
  EXPECT_NEAR(tripled->got[0], 3 * plain->got[0], 1e-5);
}

TEST(Losses, ABadLossSectionNamesTheKey) {
  try {
    (void)one_batch("loss: {name: focal}\n");
    ADD_FAILURE() << "an unknown loss was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown loss \"focal\" (available: cross_entropy"), std::string::npos)
        << e.what();
  }
  try {
    (void)one_batch("loss: {name: cross_entropy, label_smoothing: 1.5}\n");
    ADD_FAILURE() << "label_smoothing 1.5 was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("loss.label_smoothing"), std::string::npos) << e.what();
  }
}

// A research model in a few lines: next-token logits from a (V, V) table, with its own loss (half the
// cross-entropy) and its own metric (TokenAccuracy).
class BigramLM : public models::CausalLM {
 public:
  BigramLM() { table_ = register_parameter("table", at::zeros({64, 64})); }
  // Through the unit runner, which the sharding engine gathers the unit's parameters in.
  at::Tensor forward(const at::Tensor& ids, const models::ForwardOptions& /*o*/ = {}) override {
    return models::run_unit(
        runner_, 0, [this](const at::Tensor& in) { return at::embedding(named_parameters(false)["table"], in); }, ids);
  }
  int64_t num_units() const override { return 1; }
  int64_t unit_of_parameter(const std::string& /*name*/) const override { return 0; }
  void set_unit_runner(std::shared_ptr<models::UnitRunner> runner) override { runner_ = std::move(runner); }
  void init_weights(uint64_t seed, const std::function<bool(const std::string&)>& /*select*/ = nullptr) override {
    at::NoGradGuard no_grad;
    table_.normal_(0, 0.02, at::make_generator<at::CPUGeneratorImpl>(seed));
  }
  std::shared_ptr<CausalLM> rebuild(const std::string& /*device*/, std::optional<uint64_t> seed) const override {
    auto m = std::make_shared<BigramLM>();
    if (seed) m->init_weights(*seed);
    return m;
  }
  double flops_per_token(int64_t /*seq_len*/) const override { return 6.0 * 64 * 64; }
  int64_t vocab_size() const override { return 64; }
  int64_t max_seq_len() const override { return 32; }
  std::string family() const override { return "bigram_lm"; }

  at::Tensor loss(const at::Tensor& logits, const data::TokenBatch& batch) const override {
    return 0.5 * CausalLM::loss(logits, batch);
  }
  std::vector<std::shared_ptr<const models::EvalMetric>> eval_metrics() const override {
    return {std::make_shared<models::TokenAccuracy>()};
  }

 private:
  at::Tensor table_;
  std::shared_ptr<models::UnitRunner> runner_;
};

// Counts correct next-token predictions at every eval batch, by hand.
class CountCorrect : public core::Callback {
 public:
  std::string name() const override { return "CountCorrect"; }
  void run_event(core::Event e, core::State& s, core::Logger& /*l*/) override {
    if (e != core::Event::kEvalAfterForward) return;
    const at::Tensor predicted = s.outputs.argmax(-1);
    for (int64_t b = 0; b < s.batch.labels.size(0); ++b) {
      for (int64_t t = 0; t + 1 < s.batch.labels.size(1); ++t) {
        const int64_t y = s.batch.labels[b][t + 1].item<int64_t>();
        if (y == data::kIgnoreLabel) continue;
        ++counted;
        correct += predicted[b][t].item<int64_t>() == y ? 1 : 0;
      }
    }
  }
  int64_t correct = 0, counted = 0;
};

TEST(Losses, TheModelsOwnLossAndMetricsAreTheDefaults) {
  models::model_registry().add(
      "bigram_lm",
      [](config::Section& s) {
        s.finish();
        return models::ModelOptions{"bigram_lm", {}, 32, "cpu", {}};
      },
      [](const models::ModelOptions& /*o*/, const std::string& /*device*/, uint64_t seed) {
        auto m = std::make_shared<BigramLM>();
        m->init_weights(seed);
        return std::static_pointer_cast<models::CausalLM>(m);
      });
  auto half = std::make_shared<LossCheck>([](const core::State& s) {
    return 0.5 *
           per_token(models::causal_lm_loss(s.outputs, s.batch.labels, data::kIgnoreLabel, at::Reduction::Sum), s);
  });
  auto counter = std::make_shared<CountCorrect>();
  // 30 batches at a high rate, evaluated on the training split: the table learns the bigrams it saw, so the accuracy
  // is far from 0 and from 1 (each token has up to 5 successors in this data).
  Trainer t(one_batch("", {"model={name: bigram_lm}", "max_duration=30ba", "eval_interval=30ba", "optimizer.lr=0.1",
                           "eval_loader.dataset.split=train"}),
            {.algorithms = {}, .callbacks = {half, counter}});
  t.fit();
  ASSERT_EQ(half->got.size(), 30u);
  for (size_t i = 0; i < half->got.size(); ++i) EXPECT_NEAR(half->got[i], half->want[i], 1e-6) << "batch " << i;
  ASSERT_GT(counter->counted, 0);
  const double accuracy = static_cast<double>(counter->correct) / static_cast<double>(counter->counted);
  const auto& eval = t.state().eval_metrics.at("eval");
  ASSERT_TRUE(eval.count("TokenAccuracy"));
  EXPECT_DOUBLE_EQ(eval.at("TokenAccuracy"), accuracy);
  std::printf("TokenAccuracy %.4f over %lld tokens\n", accuracy, static_cast<long long>(counter->counted));
  EXPECT_GT(accuracy, 0.1);
  EXPECT_LT(accuracy, 1.0);
  EXPECT_TRUE(eval.count("LanguageCrossEntropy"));
}

TEST(Metrics, ARecipesMetricsAreReportedBesideCrossEntropy) {
  auto counter = std::make_shared<CountCorrect>();
  Trainer t(one_batch("metrics: {token_accuracy: {}}\n"), {.algorithms = {}, .callbacks = {counter}});
  t.fit();
  const auto& eval = t.state().eval_metrics.at("eval");
  ASSERT_TRUE(eval.count("TokenAccuracy"));
  EXPECT_DOUBLE_EQ(eval.at("TokenAccuracy"),
                   static_cast<double>(counter->correct) / static_cast<double>(counter->counted));
  EXPECT_EQ(counter->counted, 10 * 31);  // the val split: 10 samples cut to 32 tokens, 31 of them predicted
  try {
    (void)one_batch("metrics: {top_k: {}}\n");
    ADD_FAILURE() << "an unknown metric was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown metric \"top_k\" (available: token_accuracy)"), std::string::npos)
        << e.what();
  }
}

TEST(HfModelTypes, AResearchFamilysModelTypeRebuildsItAndAnUnknownOneListsTheRegistered) {
  const nlohmann::json config = {{"model_type", "bigram_lm"}};
  try {
    (void)models::build_from_hf_config(config, "/x/config.json", "cpu");
    ADD_FAILURE() << "an unregistered model_type was built";
  } catch (const Error& e) {
    // Every registered type, sorted: the built-in families at least.
    const std::vector<std::string> types = models::hf_model_type_registry().model_types();
    for (const char* family : {"falcon", "gpt2", "llama", "mistral", "mpt", "qwen2"}) {
      EXPECT_NE(std::find(types.begin(), types.end(), family), types.end()) << family;
    }
    EXPECT_TRUE(std::is_sorted(types.begin(), types.end()));
    EXPECT_NE(std::string(e.what()).find(fmt::format("/x/config.json: model_type is \"bigram_lm\"; Tessera reads: {}",
                                                     fmt::join(types, ", "))),
              std::string::npos)
        << e.what();
  }
  models::hf_model_type_registry().add(
      "bigram_lm",
      [](const nlohmann::json& /*c*/, const std::string& /*where*/, const std::string& /*device*/,
         std::optional<uint64_t> seed) -> std::shared_ptr<models::CausalLM> {
        auto m = std::make_shared<BigramLM>();
        if (seed) m->init_weights(*seed);
        return m;
      });
  const auto built = models::build_from_hf_config(config, "/x/config.json", "cpu", 3);
  EXPECT_EQ(built->family(), "bigram_lm");
  EXPECT_TRUE(at::equal(built->parameters()[0], BigramLM().rebuild("cpu", 3)->parameters()[0]));
}

// ---- Data loaders ---------------------------------------------------------------------------------------------------

// A research loader: `batches` batches per epoch of 32 tokens whose ids depend on (epoch, batch, row, rank), so a run
// that resumed at the wrong place trains on other tokens. Records where each epoch opened and what state it loaded.
struct CountingLog {
  std::vector<std::pair<int64_t, int64_t>> opened;  // (epoch, batch_in_epoch)
  std::vector<nlohmann::json> loaded;
};
CountingLog& counting_log() {
  static CountingLog log;
  return log;
}

class CountingLoader : public data::DataLoader {
 public:
  CountingLoader(int64_t batches, const data::LoaderContext& ctx) : batches_(batches), ctx_(ctx) {}
  std::optional<int64_t> batches_per_epoch() const override { return batches_; }
  std::unique_ptr<data::BatchIterator> open(const config::Timestamp& at) override {
    counting_log().opened.emplace_back(at.epoch, at.batch_in_epoch);
    return std::make_unique<Epoch>(*this, at.epoch, at.batch_in_epoch);
  }
  nlohmann::json state(const config::Timestamp& at) const override {
    return {{"counting", {at.epoch, at.batch_in_epoch}}};
  }
  void load_state(const nlohmann::json& state, const config::Timestamp& at, const std::string& where) override {
    counting_log().loaded.push_back(state);
    if (state.value("counting", nlohmann::json()) != nlohmann::json{at.epoch, at.batch_in_epoch}) {
      throw Error("counting", where + ": not a counting loader's state at this timestamp: " + state.dump());
    }
  }

 private:
  class Epoch : public data::BatchIterator {
   public:
    Epoch(const CountingLoader& l, int64_t epoch, int64_t batch) : l_(l), epoch_(epoch), batch_(batch) {}
    std::optional<data::TokenBatch> next() override {
      if (batch_ >= l_.batches_) return std::nullopt;
      const int64_t rows = l_.ctx_.device_batch_size, base = 7 * epoch_ + 3 * batch_ + 11 * l_.ctx_.rank;
      data::TokenBatch b;
      b.input_ids = (at::arange(32, at::kLong).unsqueeze(0) * (at::arange(rows, at::kLong).unsqueeze(1) + 1) + base)
                        .remainder(64);
      b.labels = b.input_ids.clone();
      b.samples = rows;
      ++batch_;
      return b;
    }

   private:
    const CountingLoader& l_;
    int64_t epoch_, batch_;
  };
  int64_t batches_;
  data::LoaderContext ctx_;
};

void register_counting_loader() {
  data::loader_registry().add(
      "counting",
      [](config::Section& s) {
        data::LoaderOptions o;
        o.name = "counting";
        o.tokens.max_seq_len = 32;
        o.extra = s.get_int("batches", 4);
        s.finish();
        return o;
      },
      [](const data::LoaderOptions& o, const data::LoaderContext& ctx) -> std::unique_ptr<data::DataLoader> {
        EXPECT_EQ(ctx.split, "train_loader");
        EXPECT_EQ(ctx.device_batch_size, 8);
        return std::make_unique<CountingLoader>(std::any_cast<int64_t>(o.extra), ctx);
      });
}

std::map<std::string, at::Tensor> weights_of(Trainer& t) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : t.state().model->named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

TEST(DataLoaders, ARegisteredLoaderTrainsAndResumesWhereItStoodAcrossAnEpoch) {
  register_counting_loader();
  const fs::path dir = fs::temp_directory_path() / "tessera_counting_loader";
  fs::remove_all(dir);
  // 4 batches per epoch, a checkpoint every 3 batches into `folder`, resumed from the newest one there.
  auto config = [&](const std::string& duration, const std::string& folder) {
    return testing::tiny_train_config(
        dataset(), "device_eval_batch_size: 4\n",
        {"train_loader={name: counting, batches: 4}", "eval_interval=0", "device_train_microbatch_size=8",
         "run_name=counting", "save_folder=" + (dir / folder).string(), "save_interval=3ba", "autoresume=true",
         "max_duration=" + duration});
  };
  counting_log() = {};
  Trainer whole(config("6ba", "whole"));
  EXPECT_EQ(whole.state().dataloader_len, 4);
  whole.fit();
  // Epoch 0 from its start, then epoch 1 from its start: 4 + 2 batches.
  EXPECT_EQ(counting_log().opened, (std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {1, 0}}));
  const auto want = weights_of(whole);

  {
    Trainer first(config("3ba", "split"));
    first.fit();
  }
  counting_log() = {};
  Trainer resumed(config("6ba", "split"));  // autoresume: the checkpoint at batch 3
  ASSERT_EQ(counting_log().loaded.size(), 1u);
  EXPECT_EQ(counting_log().loaded[0], (nlohmann::json{{"counting", {0, 3}}}));
  resumed.fit();
  EXPECT_EQ(counting_log().opened, (std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {1, 0}}));
  const auto got = weights_of(resumed);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, w] : want) EXPECT_TRUE(at::equal(w, got.at(name))) << name;

  // A text loader's checkpoint is not this loader's: the run refuses it, naming the checkpoint.
  Trainer text(testing::tiny_train_config(dataset(), "device_eval_batch_size: 4\n",
                                          {"max_duration=3ba", "eval_interval=0", "save_interval=3ba",
                                           "save_folder=" + (dir / "text").string(), "run_name=counting"}));
  text.fit();
  try {
    Trainer wrong(config("6ba", "text"));
    ADD_FAILURE() << "a text loader's checkpoint was resumed by the counting loader";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find((dir / "text").string()), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("not a counting loader's state"), std::string::npos) << e.message();
  }
  // And the text loader refuses the counting loader's checkpoint.
  try {
    Trainer wrong(testing::tiny_train_config(dataset(), "device_eval_batch_size: 4\n",
                                             {"max_duration=6ba", "eval_interval=0", "autoresume=true",
                                              "save_folder=" + (dir / "split").string(), "run_name=counting"}));
    ADD_FAILURE() << "the counting loader's checkpoint was resumed by the text loader";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("is not a text loader's"), std::string::npos) << e.message();
  }
  fs::remove_all(dir);
}

}  // namespace tessera::trainer::extension_points_test
