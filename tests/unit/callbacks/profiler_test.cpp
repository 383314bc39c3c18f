// `profiler:`: Composer's cyclic schedule, the time split of a trace's events, and a training run that writes a trace
// of the scheduled steps and logs where their time went.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tessera/callbacks/profiler.h"
#include "tessera/core/callback.h"
#include "tessera/trainer/trainer.h"
#include "test_util.h"
#include "tiny_data.h"

// A named namespace: the sanitizer trees' unity batches put this file beside the other callback tests.
namespace profiler_test {
namespace {

namespace fs = std::filesystem;
using tessera::callbacks::ProfilerAction;
using tessera::callbacks::ProfilerOptions;
using tessera::callbacks::TraceEvent;

// Composer's cyclic_schedule (every expected action below is what composer.profiler.cyclic_schedule returns for it):
// skip_first batches, then cycles of wait (skip), warmup and active batches, the last active one saving, `repeat`
// cycles per epoch (0: all of it); the epoch's last batch saves too; skip_first counts from where a resumed run started
// in its epoch.
TEST(Profiler, TheCyclicScheduleIsComposers) {
  ProfilerOptions o;
  o.skip_first = 1;
  o.wait = 1;
  o.warmup = 1;
  o.active = 2;
  o.repeat = 2;
  using A = ProfilerAction;
  const std::vector<A> want = {A::kSkip,   A::kSkip,   A::kWarmup,        A::kActive, A::kActiveAndSave, A::kSkip,
                               A::kWarmup, A::kActive, A::kActiveAndSave, A::kSkip,   A::kSkip};
  for (size_t b = 0; b < want.size(); ++b) {
    EXPECT_EQ(tessera::callbacks::cyclic_schedule(o, static_cast<int64_t>(b), 20, 0), want[b]) << "batch " << b;
  }
  o.repeat = 0;  // every cycle of the epoch
  EXPECT_EQ(tessera::callbacks::cyclic_schedule(o, 12, 20, 0), A::kActiveAndSave);
  EXPECT_EQ(tessera::callbacks::cyclic_schedule(o, 14, 20, 0), A::kWarmup);
  EXPECT_EQ(tessera::callbacks::cyclic_schedule(o, 15, 16, 0), A::kActiveAndSave);  // the epoch ends mid-cycle
  // Resumed at batch 3 of the epoch: skip_first counts from there (batch 4 waits, 5 warms up, 6 records).
  EXPECT_EQ(tessera::callbacks::cyclic_schedule(o, 4, 20, 3), A::kSkip);
  EXPECT_EQ(tessera::callbacks::cyclic_schedule(o, 5, 20, 3), A::kWarmup);
  EXPECT_EQ(tessera::callbacks::cyclic_schedule(o, 6, 20, 3), A::kActive);
}

// Host events: each operator's self time goes to its outermost categorised enclosing event (attention's matrix
// products are attention; the data and optimizer scopes take what runs in them), the steps' own time is idle.
// Device events: kernels by name; idle is the window no kernel covered.
TEST(Profiler, TheTimeSplitAssignsSelfTimeByTheOutermostCategory) {
  const std::vector<TraceEvent> host = {
      {"ProfilerStep#1", 0, 100, 7, false},      {"tessera/data", 0, 10, 7, false},
      {"aten::stack", 2, 8, 7, false},           {"aten::linear", 20, 60, 7, false},
      {"aten::addmm", 25, 55, 7, false},         {"aten::scaled_dot_product_attention", 60, 80, 7, false},
      {"aten::bmm", 62, 78, 7, false},           {"tessera/optimizer", 85, 98, 7, false},
      {"aten::_foreach_add_", 86, 96, 7, false}, {"aten::mm", 0, 50, 8, false},  // another thread: not counted
  };
  const tessera::callbacks::TimeSplit split = tessera::callbacks::time_split(host);
  EXPECT_EQ(split.steps, 1);
  EXPECT_NEAR(split.window_seconds, 100e-9, 1e-15);
  const std::map<std::string, double> want = {
      {"data", 10e-9}, {"gemm", 40e-9}, {"attention", 20e-9}, {"optimizer", 13e-9}, {"idle", 17e-9}};
  EXPECT_EQ(split.seconds.size(), want.size());
  for (const auto& [category, seconds] : want) EXPECT_NEAR(split.seconds.at(category), seconds, 1e-15) << category;

  const std::vector<TraceEvent> gpu = {
      {"ProfilerStep#1", 0, 1000, 7, false},
      {"sm90_xmma_gemm_bf16bf16_bf16f32", 100, 400, 0, true},
      {"flash_fwd_kernel", 400, 500, 0, true},
      {"ncclDevKernel_AllReduce_Sum_f32", 450, 650, 1, true},  // overlaps on another stream
      {"void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", 700, 800, 0, true},
  };
  const tessera::callbacks::TimeSplit g = tessera::callbacks::time_split(gpu);
  EXPECT_NEAR(g.window_seconds, 700e-9, 1e-15);  // first kernel to last
  EXPECT_NEAR(g.seconds.at("gemm"), 300e-9, 1e-15);
  EXPECT_NEAR(g.seconds.at("attention"), 100e-9, 1e-15);
  EXPECT_NEAR(g.seconds.at("communication"), 200e-9, 1e-15);
  EXPECT_NEAR(g.seconds.at("elementwise"), 100e-9, 1e-15);
  EXPECT_NEAR(g.seconds.at("idle"), 50e-9, 1e-15);  // 650..700
}

class Collect : public tessera::core::LoggerDestination {
 public:
  std::string name() const override { return "Collect"; }
  void log_metrics(const tessera::core::Metrics& m, int64_t step) override {
    for (const auto& [k, v] : m) {
      if (k.starts_with("profile/")) logged[step][k] = v;
    }
  }
  std::map<int64_t, std::map<std::string, double>> logged;
};

TEST(Profiler, ARunTracesTheScheduledStepsAndLogsTheirTimeSplit) {
  const fs::path root = fs::temp_directory_path() / ("tessera_profiler_" + std::to_string(::getpid()));
  fs::remove_all(root);
  tessera::testing::write_token_split(root / "data" / "train", 64, 1);
  tessera::testing::write_token_split(root / "data" / "val", 16, 2);
  const std::string extra =
      "profiler:\n  schedule: {skip_first: 1, wait: 0, warmup: 1, active: 2, repeat: 1}\n"
      "  torch_prof_folder: " +
      (root / "traces").string() + "\n  torch_prof_record_shapes: true\n";
  tessera::trainer::TrainerParts parts;
  auto collect = std::make_shared<Collect>();
  parts.callbacks.push_back(collect);
  {
    tessera::trainer::Trainer trainer(
        tessera::testing::tiny_train_config(root / "data", extra, {"max_duration=6ba", "eval_interval=0"}),
        std::move(parts));
    trainer.fit();
  }
  // Batches 1 skipped, 2 warming up, 3 and 4 recorded: one trace, named after the cycle's last batch.
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(root / "traces")) files.push_back(e.path().filename().string());
  ASSERT_EQ(files, std::vector<std::string>{"rank0.4.pt.trace.json"});
  std::ifstream in(root / "traces" / files[0]);
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::set<std::string> names;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.contains("name")) names.insert(e.at("name").get<std::string>());
  }
  for (const char* want : {"ProfilerStep#3", "ProfilerStep#4", "tessera/data", "tessera/loss", "tessera/optimizer"}) {
    EXPECT_TRUE(names.count(want)) << want;
  }
  EXPECT_FALSE(names.count("ProfilerStep#2"));  // warmup is not recorded
  EXPECT_TRUE(names.count("aten::mm") || names.count("aten::addmm"));
  // The split, logged at batch 4: fractions of the window that add up to it.
  ASSERT_TRUE(collect->logged.count(4));
  const auto& m = collect->logged.at(4);
  double total = 0;
  for (const auto& [k, v] : m) {
    if (k.starts_with("profile/fraction/")) total += v;
  }
  EXPECT_NEAR(total, 1.0, 1e-6);
  EXPECT_GT(m.at("profile/fraction/gemm"), 0.0);
  EXPECT_GT(m.at("profile/fraction/optimizer"), 0.0);
  EXPECT_GT(m.at("profile/step_seconds"), 0.0);
  // A second run into the same folder is refused unless it may overwrite.
  EXPECT_THROW(tessera::trainer::Trainer(
                   tessera::testing::tiny_train_config(root / "data", extra, {"max_duration=1ba", "eval_interval=0"})),
               tessera::ConfigError);
  fs::remove_all(root);
}

}  // namespace
}  // namespace profiler_test
