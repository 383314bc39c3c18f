// Pipeline schedules (distributed/pipeline.h): the orders themselves, and every stage's actions run against each
// other as the trainer runs them (a forward waits for the previous stage's, a backward for the next stage's): no
// schedule deadlocks, and the idle time of every stage is the schedule's theoretical bubble.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tessera/distributed/pipeline.h"

using namespace tessera;
using dist::PipelineAction;
using dist::PipelineSchedule;

namespace {

std::string order(const std::vector<PipelineAction>& actions) {
  std::string out;
  for (const auto& a : actions) {
    if (!out.empty()) out += " ";
    out += (a.kind == PipelineAction::Kind::kForward ? "F" : "B") + std::to_string(a.microbatch);
  }
  return out;
}

// Runs every stage's actions with forwards taking `tf` and backwards `tb`, each as soon as its stage is free and its
// input has arrived; returns each stage's busy and the step's total time. Fails the test on a deadlock.
struct Timeline {
  std::vector<double> busy;
  double total = 0;
};
Timeline simulate(PipelineSchedule s, int stages, int64_t microbatches, double tf, double tb) {
  std::vector<std::vector<PipelineAction>> plans;
  for (int st = 0; st < stages; ++st) plans.push_back(dist::pipeline_actions(s, st, stages, microbatches));
  std::map<std::pair<int, int64_t>, double> forward_done, backward_done;
  std::vector<size_t> next(static_cast<size_t>(stages), 0);
  std::vector<double> free_at(static_cast<size_t>(stages), 0), busy(static_cast<size_t>(stages), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int st = 0; st < stages; ++st) {
      auto& i = next[static_cast<size_t>(st)];
      if (i == plans[static_cast<size_t>(st)].size()) continue;
      const PipelineAction a = plans[static_cast<size_t>(st)][i];
      const bool forward = a.kind == PipelineAction::Kind::kForward;
      double ready = free_at[static_cast<size_t>(st)];
      if (forward && st > 0) {
        auto it = forward_done.find({st - 1, a.microbatch});
        if (it == forward_done.end()) continue;
        ready = std::max(ready, it->second);
      }
      if (!forward && st < stages - 1) {
        auto it = backward_done.find({st + 1, a.microbatch});
        if (it == backward_done.end()) continue;
        ready = std::max(ready, it->second);
      }
      const double t = forward ? tf : tb;
      (forward ? forward_done : backward_done)[{st, a.microbatch}] = ready + t;
      free_at[static_cast<size_t>(st)] = ready + t;
      busy[static_cast<size_t>(st)] += t;
      ++i;
      progress = true;
    }
  }
  for (int st = 0; st < stages; ++st) {
    EXPECT_EQ(next[static_cast<size_t>(st)], plans[static_cast<size_t>(st)].size())
        << dist::to_string(s) << ": stage " << st << " of " << stages << " waits forever at action "
        << next[static_cast<size_t>(st)] << " (" << order(plans[static_cast<size_t>(st)]) << ")";
  }
  return {busy, *std::max_element(free_at.begin(), free_at.end())};
}

}  // namespace

TEST(PipelineSchedule, OrdersOfGPipeAnd1F1B) {
  EXPECT_EQ(order(dist::pipeline_actions(PipelineSchedule::kGPipe, 0, 2, 4)), "F0 F1 F2 F3 B0 B1 B2 B3");
  EXPECT_EQ(order(dist::pipeline_actions(PipelineSchedule::kGPipe, 1, 2, 4)), "F0 F1 F2 F3 B0 B1 B2 B3");
  // 1F1B: stages - stage - 1 forwards, then forward and backward in turn, then the remaining backwards.
  EXPECT_EQ(order(dist::pipeline_actions(PipelineSchedule::k1F1B, 0, 2, 4)), "F0 F1 B0 F2 B1 F3 B2 B3");
  EXPECT_EQ(order(dist::pipeline_actions(PipelineSchedule::k1F1B, 1, 2, 4)), "F0 B0 F1 B1 F2 B2 F3 B3");
  EXPECT_EQ(order(dist::pipeline_actions(PipelineSchedule::k1F1B, 0, 4, 8)),
            "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  EXPECT_EQ(order(dist::pipeline_actions(PipelineSchedule::k1F1B, 0, 4, 2)), "F0 F1 B0 B1");  // fewer than stages
  EXPECT_EQ(dist::pipeline_schedule_named("1F1B"), PipelineSchedule::k1F1B);
  EXPECT_EQ(dist::pipeline_schedule_named("GPipe"), PipelineSchedule::kGPipe);
  EXPECT_FALSE(dist::pipeline_schedule_named("gpipe"));
  EXPECT_TRUE(dist::needs_virtual_stages("Interleaved1F1B"));
  EXPECT_TRUE(dist::needs_virtual_stages("DualPipeV"));
}

TEST(PipelineSchedule, NoDeadlockAndTheTheoreticalBubble) {
  for (PipelineSchedule s : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B}) {
    for (int stages : {2, 3, 4, 8}) {
      for (int64_t m : {1, 2, 4, 8, 16}) {
        // A backward takes twice a forward, as for a transformer block.
        const Timeline t = simulate(s, stages, m, 1.0, 2.0);
        for (int st = 0; st < stages; ++st) {
          const double idle = 1.0 - t.busy[static_cast<size_t>(st)] / t.total;
          EXPECT_NEAR(idle, dist::bubble_fraction(s, stages, m), 1e-12)
              << dist::to_string(s) << " stage " << st << " of " << stages << ", " << m << " microbatches";
        }
      }
    }
  }
}

TEST(PipelineSchedule, StagesSplitTheBlocksEvenly) {
  EXPECT_EQ(dist::stage_blocks(3, 0, 2), (std::pair<int64_t, int64_t>{1, 2}));
  EXPECT_EQ(dist::stage_blocks(3, 1, 2), (std::pair<int64_t, int64_t>{3, 3}));
  std::vector<int64_t> sizes;
  int64_t next = 1;
  for (int st = 0; st < 4; ++st) {
    const auto [first, last] = dist::stage_blocks(10, st, 4);
    EXPECT_EQ(first, next);
    sizes.push_back(last - first + 1);
    next = last + 1;
  }
  EXPECT_EQ(next, 11);
  EXPECT_EQ(sizes, (std::vector<int64_t>{3, 3, 2, 2}));
}
