// optimizer_monitor, early_stopper and threshold_stopper on a tiny model: the logged norms equal norms computed by
// hand from the gradients and optimizer state, and the stoppers stop at the batch Composer's rules give.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "log_capture.h"
#include "tessera/callbacks/callbacks.h"
#include "tessera/callbacks/oom_observer.h"
#include "tessera/config/reader.h"
#include "tessera/config/value.h"
#include "tessera/core/state.h"
#include "tessera/data/mds.h"
#include "tessera/trainer/trainer.h"
#include "test_util.h"
#include "tiny_data.h"

namespace tessera::callbacks {
namespace {

using core::Event;
using core::Metrics;

namespace fs = std::filesystem;
using core::Event;
using core::Metrics;
using trainer::TrainConfig;
using trainer::Trainer;

fs::path dataset() {
  static const fs::path dir = [] {
    const fs::path d = fs::temp_directory_path() / "tessera_callbacks_test";
    testing::write_token_split(d / "train", 24, 1);
    testing::write_token_split(d / "val", 8, 2);
    return d;
  }();
  return dir;
}

// 3 batches of 8 per epoch; `components` is YAML added at the top level (callbacks:, algorithms:).
TrainConfig tiny_config(const std::string& components, const std::vector<std::string>& overrides = {}) {
  return testing::tiny_train_config(
      dataset(), "eval_interval: 1ba\ndevice_train_microbatch_size: 8\ndevice_eval_batch_size: 8\n" + components,
      overrides);
}

// Every log call, by step.
class Recorder : public core::LoggerDestination {
 public:
  std::string name() const override { return "Recorder"; }
  void log_metrics(const Metrics& metrics, int64_t step) override {
    for (const auto& [k, v] : metrics) logged[step][k] = v;
  }
  std::map<int64_t, Metrics> logged;
};

// At BATCH_END (after the recipe's callbacks): each parameter's gradient and Adam state norms, in double.
class HandNorms : public core::Callback {
 public:
  std::string name() const override { return "HandNorms"; }
  void run_event(Event e, core::State& s, core::Logger& /*l*/) override {
    if (e != Event::kBatchEnd) return;
    Metrics& m = at_batch[s.timestamp.batch];
    // One rank holds every parameter whole, as ranges of the engine's flat vectors (State::held_layout).
    auto norm = [](const at::Tensor& values, const dist::ShardSpan& sp) {
      const at::Tensor v = values.detach().reshape({-1}).narrow(0, sp.offset, sp.numel).to(at::kDouble);
      return std::sqrt(v.mul(v).sum().item<double>());
    };
    double sq = 0;
    const auto held = s.held_layout();
    for (const auto& h : held) {
      for (const dist::ShardSpan& sp : h.spans) {
        const double n = norm(h.tensor.grad(), sp);
        m["grad/model." + sp.name] = n;
        m["param/model." + sp.name] = norm(h.tensor, sp);
        sq += n * n;
      }
    }
    m["global"] = std::sqrt(sq);
    const auto params = s.optimizer->params();
    for (const auto& [key, t] : s.optimizer->state()) {
      if (key == "step") continue;
      const size_t i = std::stoul(key.substr(0, key.find('.')));
      for (const auto& h : held) {
        if (!h.tensor.is_same(params[i])) continue;
        for (const dist::ShardSpan& sp : h.spans) m[key.substr(key.find('.') + 1) + "/model." + sp.name] = norm(t, sp);
      }
    }
  }
  std::map<int64_t, Metrics> at_batch;
};

TEST(OptimizerMonitor, LogsGradientAndStateNormsEveryIntervalAfterClipping) {
  auto rec = std::make_shared<Recorder>();
  auto hand = std::make_shared<HandNorms>();
  Trainer t(tiny_config(R"(
callbacks: {optimizer_monitor: {batch_log_interval: 2}}
algorithms: {gradient_clipping: {clipping_type: norm, clipping_threshold: 0.05}}
)",
                        {"eval_interval=0"}),
            {.algorithms = {}, .callbacks = {rec, hand}});
  t.fit();
  std::vector<int64_t> logged_at;
  for (const auto& [step, m] : rec->logged) {
    if (m.count("l2_norm/grad/model.transformer.wte.weight")) logged_at.push_back(step);
    // The trainer's own global norm at every batch's end: the gradients the step used, after clipping. (Step 0
    // holds only the first batch's loss, logged before the batch count moves on, as Composer logs it.)
    if (step == 0) continue;
    EXPECT_NEAR(m.at("l2_norm/grad/global"), 0.05, 1e-4) << step;
  }
  EXPECT_EQ(static_cast<int64_t>(rec->logged.size()), t.state().timestamp.batch + 1);
  EXPECT_EQ(logged_at, (std::vector<int64_t>{2, 4, 6}));
  const size_t n_params = t.state().model->parameters().size();
  for (int64_t step : logged_at) {
    const Metrics& got = rec->logged.at(step);
    const Metrics& want = hand->at_batch.at(step);
    // Clipped to 0.05 (the unclipped norm of a fresh model is far larger): the norms are taken after clipping.
    EXPECT_NEAR(got.at("l2_norm/grad/global"), want.at("global"), 1e-6);
    EXPECT_NEAR(got.at("l2_norm/grad/global"), 0.05, 1e-4);
    size_t grads = 0, moments = 0, second = 0, params = 0;
    for (const auto& [name, value] : got) {
      auto check = [&](const std::string& prefix, const std::string& hand_key, size_t& count, bool take_sqrt) {
        if (name.rfind(prefix, 0) != 0 || name == "l2_norm/grad/global") return;
        const double w = want.at(hand_key + name.substr(prefix.size() - 1));
        EXPECT_NEAR(value, take_sqrt ? std::sqrt(w) : w, 1e-5 * std::max(1.0, w)) << name;
        ++count;
      };
      check("l2_norm/grad/", "grad", grads, false);
      check("l2_norm/moment/", "exp_avg", moments, false);
      check("l2_norm/second_moment_sqrt/", "exp_avg_sq", second, true);
      check("l2_norm/param/", "param", params, false);
    }
    EXPECT_EQ(grads, n_params);
    EXPECT_EQ(moments, n_params);
    EXPECT_EQ(second, n_params);
    EXPECT_EQ(params, n_params);
  }
  EXPECT_TRUE(rec->logged.at(2).count("l2_norm/grad/model.transformer.wte.weight"));
}

TEST(OptimizerMonitor, WithoutOptimizerMetricsLogsGradientsOnly) {
  auto rec = std::make_shared<Recorder>();
  Trainer t(tiny_config("callbacks: {optimizer_monitor: {log_optimizer_metrics: false, batch_log_interval: 3}}",
                        {"eval_interval=0"}),
            {.algorithms = {}, .callbacks = {rec}});
  t.fit();
  for (const auto& [name, value] : rec->logged.at(3)) {
    EXPECT_TRUE(name == "loss/train/total" || name.rfind("l2_norm/grad/", 0) == 0) << name;
  }
  EXPECT_GT(rec->logged.at(3).at("l2_norm/grad/global"), 0.0);
  // Between the monitor's intervals only the trainer's global norm (and the next batch's loss).
  for (const auto& [name, value] : rec->logged.at(2)) {
    EXPECT_TRUE(name == "loss/train/total" || name == "l2_norm/grad/global") << name;
  }
}

int64_t batches_trained(const std::string& components, const std::vector<std::string>& overrides = {}) {
  Trainer t(tiny_config(components, overrides));
  t.fit();
  return t.state().timestamp.batch;
}

TEST(EarlyStopper, StopsWhenNoImprovementForPatienceBatches) {
  // Nothing beats the first evaluation (batch 1) by 100 nats: stop once more than 2 batches have passed.
  EXPECT_EQ(batches_trained(R"(
callbacks: {early_stopper: {monitor: LanguageCrossEntropy, dataloader_label: eval, patience: 2ba, min_delta: 100}}
)"),
            4);
  // A learning rate of 0: the metric never changes, so it never improves (default comp for a cross entropy: less).
  EXPECT_EQ(batches_trained(R"(
callbacks: {early_stopper: {monitor: LanguagePerplexity, dataloader_label: eval, patience: 1ba}}
)",
                            {"optimizer.lr=0"}),
            3);
  // The train loss, checked at every batch end when patience is in batches.
  EXPECT_EQ(batches_trained(R"(
callbacks: {early_stopper: {monitor: loss/train/total, dataloader_label: train, patience: 1ba, min_delta: 100}}
)",
                            {"eval_interval=0"}),
            3);
}

TEST(EarlyStopper, PatienceInEpochsAndBareIntegers) {
  // patience 0 (epochs): evaluated at epoch ends; the second epoch end is one epoch past the best.
  EXPECT_EQ(batches_trained(R"(
callbacks: {early_stopper: {monitor: LanguageCrossEntropy, dataloader_label: eval, patience: 0, min_delta: 100}}
)",
                            {"eval_interval=1ep", "max_duration=4ep"}),
            6);
}

TEST(EarlyStopper, KeepsTrainingWhileTheMetricImproves) {
  // The eval cross entropy of this run falls at every evaluation (checked), so patience 1ba never runs out.
  auto rec = std::make_shared<Recorder>();
  auto cfg = tiny_config(R"(
callbacks: {early_stopper: {monitor: LanguageCrossEntropy, dataloader_label: eval, patience: 1ba}}
)");
  Trainer t(cfg, {.algorithms = {}, .callbacks = {rec}});
  t.fit();
  EXPECT_EQ(t.state().timestamp.batch, 6);
  double previous = 1e9;
  for (int64_t b = 1; b <= 6; ++b) {
    const double ce = rec->logged.at(b).at("metrics/eval/LanguageCrossEntropy");
    EXPECT_LT(ce, previous) << "batch " << b;
    previous = ce;
  }
}

TEST(ThresholdStopper, StopsAtTheFirstEvaluationPastTheThreshold) {
  // A run without the stopper gives the eval cross entropy at each batch; a threshold between those of batches 2 and
  // 3 must stop training at batch 3.
  auto rec = std::make_shared<Recorder>();
  Trainer reference(tiny_config(""), {.algorithms = {}, .callbacks = {rec}});
  reference.fit();
  const double at2 = rec->logged.at(2).at("metrics/eval/LanguageCrossEntropy");
  const double at3 = rec->logged.at(3).at("metrics/eval/LanguageCrossEntropy");
  ASSERT_LT(at3, at2);
  const std::string threshold = fmt::format("{:.17g}", (at2 + at3) / 2);
  EXPECT_EQ(batches_trained("callbacks: {threshold_stopper: {monitor: LanguageCrossEntropy, dataloader_label: eval, "
                            "threshold: " +
                            threshold + "}}"),
            3);
  // comp greater: stop as soon as the metric is above the threshold (the first evaluation already is).
  EXPECT_EQ(batches_trained("callbacks: {threshold_stopper: {monitor: LanguageCrossEntropy, dataloader_label: eval, "
                            "threshold: " +
                            threshold + ", comp: greater}}"),
            1);
}

TEST(ThresholdStopper, TrainLossAtEpochEndOrEveryBatch) {
  const std::string stop =
      "callbacks: {threshold_stopper: {monitor: loss/train/total, dataloader_label: train, "
      "threshold: 100";
  EXPECT_EQ(batches_trained(stop + "}}", {"eval_interval=0"}), 3);                       // at the first epoch end
  EXPECT_EQ(batches_trained(stop + ", stop_on_batch: true}}", {"eval_interval=0"}), 1);  // at the first batch end
  EXPECT_EQ(batches_trained(stop + ", comp: gt, stop_on_batch: true}}", {"eval_interval=0"}), 6);  // never above
}

TEST(StopperOptions, BadOptionsNameTheKey) {
  auto error = [](const std::string& components) { return testing::error_of([&] { tiny_config(components); }); };
  EXPECT_NE(error("callbacks: {early_stopper: {dataloader_label: eval}}").find("callbacks.early_stopper.monitor"),
            std::string::npos);
  EXPECT_NE(error("callbacks: {early_stopper: {monitor: Accuracy, dataloader_label: eval}}")
                .find("callbacks.early_stopper.monitor: \"Accuracy\""),
            std::string::npos);
  EXPECT_NE(error("callbacks: {early_stopper: {monitor: LanguageCrossEntropy, dataloader_label: val}}")
                .find("callbacks.early_stopper.dataloader_label"),
            std::string::npos);
  EXPECT_NE(error("callbacks: {early_stopper: {monitor: LanguageCrossEntropy, dataloader_label: eval, "
                  "patience: 100sp}}")
                .find("callbacks.early_stopper.patience: \"100sp\": must be in ep or ba"),
            std::string::npos);
  EXPECT_NE(error("callbacks: {early_stopper: {monitor: LanguageCrossEntropy, dataloader_label: eval, comp: more}}")
                .find("callbacks.early_stopper.comp"),
            std::string::npos);
  EXPECT_NE(error("callbacks: {early_stopper: {monitr: LanguageCrossEntropy, dataloader_label: eval}}")
                .find("callbacks.early_stopper.monitr"),
            std::string::npos);
  EXPECT_NE(error("callbacks: {threshold_stopper: {monitor: LanguageCrossEntropy, dataloader_label: eval}}")
                .find("callbacks.threshold_stopper.threshold"),
            std::string::npos);
  EXPECT_NE(error("callbacks: {optimizer_monitor: {batch_log_interval: 0}}")
                .find("callbacks.optimizer_monitor.batch_log_interval"),
            std::string::npos);
}

TEST(OomObserver, ReadsComposersKeysAndDoesNothingOnACpu) {
  // Composer's keys are read (remote_file_name only as null: uploads are not supported yet, listed with the others).
  auto error = [](const std::string& components) { return testing::error_of([&] { tiny_config(components); }); };
  EXPECT_NE(error("callbacks: {oom_observer: {max_entries: 0}}").find("callbacks.oom_observer.max_entries"),
            std::string::npos);
  EXPECT_NE(error("callbacks: {oom_observer: {filename: a/b}}").find("callbacks.oom_observer.filename"),
            std::string::npos);
  EXPECT_NE(error("callbacks: {oom_observer: {folders: x}}").find("callbacks.oom_observer.folders"), std::string::npos);
  EXPECT_NE(error("callbacks: {oom_observer: {remote_file_name: 'oom/rank{rank}'}}")
                .find("callbacks.oom_observer.remote_file_name"),
            std::string::npos);
  // On a CPU it says so and records nothing (as Composer's does); its folder is not even made.
  const fs::path folder = fs::temp_directory_path() / ("tessera_oom_" + std::to_string(::getpid()));
  testing::LogCapture log;
  Trainer t(tiny_config("callbacks: {oom_observer: {folder: " + folder.string() + ", remote_file_name: null}}",
                        {"max_duration=1ba"}));
  t.fit();
  EXPECT_NE(log.text().find("oom_observer: the model is on cpu, and the observer works on CUDA devices only"),
            std::string::npos)
      << log.text();
  EXPECT_FALSE(fs::exists(folder));
}

TEST(StopperOptions, DefaultComparisonFollowsTheMetricName) {
  auto parse = [](const std::string& monitor, const std::string& label) {
    const TrainConfig cfg = tiny_config("callbacks: {threshold_stopper: {monitor: " + monitor +
                                        ", dataloader_label: " + label + ", threshold: 1}}");
    return std::any_cast<const ThresholdStopperOptions&>(cfg.callbacks.at(0).options).metric.less;
  };
  EXPECT_TRUE(parse("LanguageCrossEntropy", "eval"));
  EXPECT_TRUE(parse("LanguagePerplexity", "eval"));
  EXPECT_TRUE(parse("loss/train/total", "train"));
}

// A model transformers cannot load as the same function (grouped-query attention with learned positions) is refused
// when training starts, naming the reason, rather than at the first save after hours of training.
TEST(HfCheckpointerCallback, AModelWithNoTransformersFormIsRefusedAtFitStart) {
  const fs::path folder = dataset().parent_path() / "hf_refused";
  fs::remove_all(folder);
  Trainer t(tiny_config("callbacks: {hf_checkpointer: {save_folder: " + folder.string() + ", save_interval: 1ba}}\n",
                        {"model.attn_config.attn_type=grouped_query_attention", "model.attn_config.kv_n_heads=1"}));
  std::string err;
  try {
    t.fit();
  } catch (const ConfigError& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("[hf_checkpointer]"), std::string::npos) << err;
  EXPECT_NE(err.find("grouped_query_attention (kv_n_heads 1 of 2 heads)"), std::string::npos) << err;
  EXPECT_EQ(t.state().timestamp.batch, 0);
  EXPECT_FALSE(fs::exists(folder / "huggingface"));
}

// save_interval in Composer's `dur` unit: a folder each time the elapsed fraction of max_duration passes a multiple
// of it. 0.5dur over 4 batches: at batches 2 and 4 only; 1dur: once, at the end.
TEST(HfCheckpointerCallback, DurationIntervalsSaveWhenTheElapsedFractionPassesAMultiple) {
  for (const auto& [interval, expected] : {std::pair<std::string, std::vector<int>>{"0.5dur", {2, 4}},
                                           std::pair<std::string, std::vector<int>>{"1dur", {4}}}) {
    const fs::path folder = dataset().parent_path() / ("hf_dur_" + interval);
    fs::remove_all(folder);
    Trainer t(tiny_config(
        "callbacks: {hf_checkpointer: {save_folder: " + folder.string() + ", save_interval: " + interval + "}}\n",
        {"max_duration=4ba", "eval_interval=0"}));
    t.fit();
    for (int batch = 1; batch <= 4; ++batch) {
      const bool want = std::find(expected.begin(), expected.end(), batch) != expected.end();
      EXPECT_EQ(fs::exists(folder / "huggingface" / ("ba" + std::to_string(batch)) / "config.json"), want)
          << interval << " batch " << batch;
    }
    fs::remove_all(folder);
  }
}

// transformers_version picks the form of the folder's config.json: transformers 5's by default (dtype), transformers
// 4's with 4 (torch_dtype); other versions are refused naming the key.
TEST(HfCheckpointerCallback, TransformersVersionPicksTheConfigForm) {
  for (const std::string version : {"", "4"}) {
    const fs::path folder = dataset().parent_path() / ("hf_form_" + version);
    fs::remove_all(folder);
    const std::string extra = version.empty() ? "" : ", transformers_version: " + version;
    Trainer t(tiny_config(
        "callbacks: {hf_checkpointer: {save_folder: " + folder.string() + ", save_interval: 1ba" + extra + "}}\n",
        {"max_duration=1ba", "eval_interval=0"}));
    t.fit();
    std::ifstream in(folder / "huggingface" / "ba1" / "config.json");
    const nlohmann::json config = nlohmann::json::parse(in);
    EXPECT_EQ(config.contains("dtype"), version.empty()) << version;
    EXPECT_EQ(config.contains("torch_dtype"), !version.empty()) << version;
    fs::remove_all(folder);
  }
  const std::string err = testing::error_of(
      [] { tiny_config("callbacks: {hf_checkpointer: {save_folder: /tmp/x, transformers_version: 3}}"); });
  EXPECT_NE(err.find("callbacks.hf_checkpointer.transformers_version"), std::string::npos) << err;
}

// run_timeout: a process still alive `timeout` seconds after FIT_END is interrupted (SIGINT); close() in time
// cancels the timer. The hanging process is a forked child that only runs the callback.
TEST(RunTimeout, InterruptsAProcessThatHangsAfterFitEndAndSparesOneThatCloses) {
  const double scale = ::tessera::testing::time_scale();
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    core::State state;
    core::Logger logger(state);
    RunTimeout guard(RunTimeoutOptions{0.2});
    guard.run_event(core::Event::kFitEnd, state, logger);
    std::this_thread::sleep_for(std::chrono::seconds(60));  // "hangs"
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT) << status;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 0.2 + 10 * scale);

  core::State state;
  core::Logger logger(state);
  RunTimeout guard(RunTimeoutOptions{0.2});
  guard.run_event(core::Event::kFitEnd, state, logger);
  guard.close(state, logger);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // past the timeout: this process is still here
  SUCCEED();
}

}  // namespace
}  // namespace tessera::callbacks
