// health_monitor's judgement (HealthAssessor) on given figures: straggler scores and their persistence, the
// silent-failure rules, /proc/net/dev; and the callback in a one-process run (its metrics, response: stop). The
// straggler test on real ranks throttled from outside is DistTraining.AThrottledRankIsNamedAStraggler*.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tessera/callbacks/health_monitor.h"
#include "tessera/trainer/trainer.h"
#include "tessera/util/preemption.h"
#include "test_util.h"
#include "tiny_data.h"

namespace tessera::callbacks {
namespace {

namespace fs = std::filesystem;

// `n` ranks on nodes of 2, each 10 steps of `compute` seconds (plus 1 ms waiting), the loss moving.
std::vector<RankHealth> ranks(const std::vector<double>& compute) {
  std::vector<RankHealth> out;
  for (size_t i = 0; i < compute.size(); ++i) {
    RankHealth h;
    h.rank = static_cast<int>(i);
    h.node = static_cast<int>(i / 2);
    h.steps = 10;
    h.wait_seconds = 0.01;
    h.step_seconds = 10 * compute[i] + h.wait_seconds;
    h.loss = 2.0 + 0.1 * static_cast<double>(i);
    h.loss_changes = 9;
    out.push_back(h);
  }
  return out;
}

std::vector<HealthFinding> of_kind(const std::vector<HealthFinding>& all, const std::string& kind) {
  std::vector<HealthFinding> out;
  for (const HealthFinding& f : all) {
    if (f.kind == kind) out.push_back(f);
  }
  return out;
}

TEST(HealthAssessor, AStragglerIsScoredAndReportedOnceItStaysSlow) {
  HealthAssessor a({});
  core::Metrics m;
  // Rank 2 is 30% slower than the other ranks' median: slow once is not enough (straggler_windows 2).
  EXPECT_TRUE(a.assess(ranks({0.010, 0.010, 0.013, 0.010}), m).empty());
  EXPECT_NEAR(m.at("health/rank2/compute_ms"), 13.0, 1e-9);
  EXPECT_NEAR(m.at("health/rank2/wait_ms"), 1.0, 1e-9);
  EXPECT_NEAR(m.at("health/rank2/straggler_relative"), 10.0 / 13.0, 1e-9);
  EXPECT_NEAR(m.at("health/rank2/straggler_individual"), 1.0, 1e-9) << "its own best so far";
  const std::vector<HealthFinding> second = a.assess(ranks({0.010, 0.010, 0.013, 0.010}), m);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].kind, "straggler");
  EXPECT_EQ(second[0].rank, 2);
  EXPECT_EQ(second[0].node, 1);
  EXPECT_NE(
      second[0].evidence.find("compute 13.00 ms per step against a median of 10.00 ms over the other ranks (+30%)"),
      std::string::npos)
      << second[0].evidence;
  // Reported once per episode; a recovery resets it.
  EXPECT_TRUE(a.assess(ranks({0.010, 0.010, 0.013, 0.010}), m).empty());
  EXPECT_TRUE(a.assess(ranks({0.010, 0.010, 0.010, 0.010}), m).empty());
  EXPECT_NEAR(m.at("health/rank2/straggler_individual"), 1.0, 1e-9);
  // 5% slower is within the threshold.
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(a.assess(ranks({0.010, 0.0105, 0.010, 0.010}), m).empty());
  // Its individual score drops when it slows down against its own best.
  a.assess(ranks({0.010, 0.010, 0.020, 0.010}), m);
  EXPECT_NEAR(m.at("health/rank2/straggler_individual"), 0.5, 1e-9);
}

TEST(HealthAssessor, SilentFailuresNonFiniteFlatLossAndANetworkCollapse) {
  HealthAssessor a({.flat_loss_windows = 2});
  core::Metrics m;
  std::vector<RankHealth> r = ranks({0.01, 0.01, 0.01, 0.01});
  r[1].nonfinite = 3;
  r[1].loss = NAN;
  std::vector<HealthFinding> f = of_kind(a.assess(r, m), "non-finite loss");
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].rank, 1);
  EXPECT_NE(f[0].evidence.find("3 of its last 10 steps"), std::string::npos) << f[0].evidence;

  // Rank 3's loss does not move while the others' do: reported after flat_loss_windows intervals.
  r = ranks({0.01, 0.01, 0.01, 0.01});
  r[3].loss_changes = 0;
  EXPECT_TRUE(of_kind(a.assess(r, m), "flat loss").empty());
  f = of_kind(a.assess(r, m), "flat loss");
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].rank, 3);
  // Every rank flat (a constant-loss job): not one rank's failure.
  for (RankHealth& h : r) h.loss_changes = 0;
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(of_kind(a.assess(r, m), "flat loss").empty());

  // Node 1's throughput collapses to 5% of its usual while node 0 keeps its own.
  HealthAssessor net({});
  r = ranks({0.01, 0.01, 0.01, 0.01});
  r[0].net_bytes_per_second = 100e6;
  r[2].net_bytes_per_second = 100e6;
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(net.assess(r, m).empty());
  EXPECT_NEAR(m.at("health/node1/net_MBps"), 100.0, 1e-9);
  r[2].net_bytes_per_second = 5e6;
  f = net.assess(r, m);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].kind, "network collapse");
  EXPECT_EQ(f[0].node, 1);
  EXPECT_EQ(f[0].rank, -1);
  // Both nodes drop together (the job paused, an evaluation): no one node to blame.
  HealthAssessor both({});
  r[2].net_bytes_per_second = 100e6;
  for (int i = 0; i < 3; ++i) both.assess(r, m);
  r[0].net_bytes_per_second = r[2].net_bytes_per_second = 1e6;
  EXPECT_TRUE(both.assess(r, m).empty());
}

TEST(HealthAssessor, AGpuErrorIsAFindingAndTheGpuSignalsAreLogged) {
  HealthAssessor a{HealthMonitorOptions{}};
  std::vector<RankHealth> r = ranks({0.01, 0.01, 0.01});
  for (RankHealth& h : r) {
    h.gpu_util = 97;
    h.gpu_mem_gb = 41.5;
  }
  r[1].gpu_xids = 2;
  r[1].gpu_last_xid = 79;  // "GPU has fallen off the bus"
  r[2].gpu_ecc_new = 1;
  core::Metrics m;
  const std::vector<HealthFinding> found = of_kind(a.assess(r, m), "gpu error");
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].rank, 1);
  EXPECT_EQ(found[0].node, 0);
  EXPECT_EQ(found[0].evidence, "2 critical XID events on its GPU (last: XID 79)");
  EXPECT_EQ(found[1].rank, 2);
  EXPECT_EQ(found[1].node, 1);
  EXPECT_EQ(found[1].evidence, "1 new uncorrected ECC error on its GPU");
  EXPECT_EQ(m.at("health/rank0/gpu_util"), 97);
  EXPECT_EQ(m.at("health/rank2/gpu_mem_gb"), 41.5);
  // Without a GPU nothing is logged of it.
  core::Metrics cpu;
  a.assess(ranks({0.01, 0.01}), cpu);
  EXPECT_EQ(cpu.count("health/rank0/gpu_util"), 0u);
}

// The counters see traffic this test makes itself: 1 MiB sent over a loopback TCP connection counts on `lo` once
// transmitted and once received.
TEST(HealthMonitor, ReadsTheNetworkInterfaces) {
  const std::optional<double> before = network_bytes();
  ASSERT_TRUE(before.has_value()) << "/proc/net/dev";
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(listener, 1), 0);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int out = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(::connect(out, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  const int in = ::accept(listener, nullptr, nullptr);
  ASSERT_GE(in, 0);
  constexpr size_t kBytes = 1 << 20;
  std::thread reader([in] {
    std::vector<char> buf(1 << 16);
    size_t got = 0;
    while (got < kBytes) {
      const ssize_t n = ::read(in, buf.data(), buf.size());
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
  });
  const std::vector<char> data(kBytes, 'x');
  size_t sent = 0;
  while (sent < kBytes) {
    const ssize_t n = ::write(out, data.data() + sent, kBytes - sent);
    ASSERT_GT(n, 0);
    sent += static_cast<size_t>(n);
  }
  reader.join();
  for (int fd : {out, in, listener}) ::close(fd);
  const std::optional<double> after = network_bytes();
  ASSERT_TRUE(after.has_value());
  EXPECT_GE(*after - *before, 2.0 * kBytes) << "before " << *before << ", after " << *after;
}

fs::path data_dir() {
  static const fs::path d = [] {
    const fs::path dir = fs::temp_directory_path() / "tessera_health_monitor";
    testing::write_token_split(dir / "train", 64, 1);
    testing::write_token_split(dir / "val", 8, 2);
    return dir;
  }();
  return d;
}

TEST(HealthMonitor, LogsEachRanksSignalsEveryInterval) {
  // One process: the figures of its one rank, every 3 batches.
  const fs::path metrics = data_dir() / "runs" / "health" / "metrics.jsonl";
  fs::remove_all(metrics.parent_path());
  trainer::Trainer t(
      testing::tiny_train_config(data_dir(),
                                 "device_train_microbatch_size: 4\ndevice_eval_batch_size: 4\neval_interval: 0\n"
                                 "callbacks: {health_monitor: {interval: 3}}\nloggers: {jsonl: {filename: " +
                                     metrics.string() + "}}\n",
                                 {"max_duration=7ba"}));
  t.fit();
  std::ifstream in(metrics);
  int logged = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.find("health/rank0/compute_ms") == std::string::npos) continue;
    ++logged;
    EXPECT_NE(line.find("health/rank0/straggler_relative\":1.0"), std::string::npos) << line;
    EXPECT_NE(line.find("health/findings\":0.0"), std::string::npos) << line;
    EXPECT_NE(line.find("health/node0/net_MBps"), std::string::npos) << line;
    // The monitor's own time per step: measured, and a small part of the step.
    const nlohmann::json j = nlohmann::json::parse(line);
    ASSERT_TRUE(j.contains("health/overhead_ms")) << line;
    EXPECT_GT(j["health/overhead_ms"].get<double>(), 0) << line;
    EXPECT_LT(j["health/overhead_ms"].get<double>(), 0.5 * j["health/rank0/compute_ms"].get<double>()) << line;
  }
  EXPECT_EQ(logged, 2) << "after batches 3 and 6";
}

TEST(HealthMonitor, ExcludeNodeSavesStopsAndMarksTheNodeOfTheFindingBad) {
  // An absurd learning rate makes the loss non-finite within a few batches: a silent failure on rank 0 (node 0).
  const fs::path save = data_dir() / "ckpt" / "health_exclude";
  fs::remove_all(save);
  trainer::Trainer t(testing::tiny_train_config(
      data_dir(),
      "device_train_microbatch_size: 4\ndevice_eval_batch_size: 4\neval_interval: 0\n"
      "callbacks: {health_monitor: {interval: 2, response: exclude_node}}\n",
      {"max_duration=20ba", "optimizer.lr=1e30", "save_interval=1000ba", "save_folder=" + save.string()}));
  t.fit();
  EXPECT_EQ(t.stop_reason(), core::State::StopReason::kNodeBad);
  const int64_t stopped_at = t.state().timestamp.batch;
  EXPECT_LT(stopped_at, 20) << "stopped early";
  EXPECT_EQ(stopped_at % 2, 0) << "at an interval's end";
  EXPECT_TRUE(fs::exists(save / fmt::format("ep0-ba{}", stopped_at) / "metadata.json")) << "saved where it stopped";
}

TEST(HealthMonitor, BadOptionsNameTheKey) {
  for (const auto& [option, key] : std::vector<std::pair<std::string, std::string>>{
           {"{interval: 0}", "callbacks.health_monitor.interval"},
           {"{response: restart}", "callbacks.health_monitor.response"},
           {"{straggler_threshold: -1}", "callbacks.health_monitor.straggler_threshold"},
           {"{net_collapse_fraction: 1.5}", "callbacks.health_monitor.net_collapse_fraction"},
           {"{intervall: 3}", "callbacks.health_monitor.intervall"}}) {
    const std::string opt = option;  // lambdas capture no structured bindings in clang
    const std::string error = testing::error_of([&] {
      testing::tiny_train_config(data_dir(),
                                 "device_train_microbatch_size: 4\ndevice_eval_batch_size: 4\n"
                                 "callbacks: {health_monitor: " +
                                     opt + "}\n");
    });
    EXPECT_NE(error.find(key), std::string::npos) << opt << ": " << error;
  }
}

}  // namespace
}  // namespace tessera::callbacks
