// The health monitor: per-rank step, wait and data times and losses, per-node network throughput, exchanged every
// interval and judged the same way on every rank (straggler scores and silent-failure rules).
#include "tessera/callbacks/health_monitor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>

#include "tessera/core/state.h"
#include "tessera/distributed/communicator.h"
#include "tessera/util/error.h"

namespace tessera::callbacks {
namespace {

using core::Event;

double monitor_clock_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The fields of RankHealth, in the order they travel in the all_gather.
constexpr int kFields = 15;

std::vector<double> pack(const RankHealth& h) {
  return {static_cast<double>(h.rank),
          static_cast<double>(h.node),
          h.steps,
          h.step_seconds,
          h.wait_seconds,
          h.data_seconds,
          h.loss,
          h.loss_changes,
          h.nonfinite,
          h.net_bytes_per_second,
          h.gpu_util,
          h.gpu_mem_gb,
          h.gpu_ecc_new,
          h.gpu_xids,
          h.gpu_last_xid};
}

RankHealth unpack(const double* v) {
  RankHealth h;
  h.rank = static_cast<int>(v[0]);
  h.node = static_cast<int>(v[1]);
  h.steps = v[2];
  h.step_seconds = v[3];
  h.wait_seconds = v[4];
  h.data_seconds = v[5];
  h.loss = v[6];
  h.loss_changes = v[7];
  h.nonfinite = v[8];
  h.net_bytes_per_second = v[9];
  h.gpu_util = v[10];
  h.gpu_mem_gb = v[11];
  h.gpu_ecc_new = v[12];
  h.gpu_xids = v[13];
  h.gpu_last_xid = v[14];
  return h;
}

}  // namespace

double RankHealth::compute_per_step() const {
  return std::max(0.0, step_seconds - wait_seconds) / std::max(1.0, steps);
}

std::optional<double> network_bytes() {
  std::ifstream in("/proc/net/dev");
  if (!in) return std::nullopt;
  std::string line;
  double total = 0;
  bool any = false;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;  // the two header lines
    std::istringstream fields(line.substr(colon + 1));
    // receive: bytes packets errs drop fifo frame compressed multicast; transmit: bytes ...
    double v[9] = {};
    for (double& x : v) fields >> x;
    if (!fields) continue;
    total += v[0] + v[8];
    any = true;
  }
  return any ? std::optional<double>(total) : std::nullopt;
}

std::vector<HealthFinding> HealthAssessor::assess(const std::vector<RankHealth>& ranks, core::Metrics& metrics) {
  const size_t n = ranks.size();
  best_.resize(n, INFINITY);
  slow_.resize(n, 0);
  flat_.resize(n, 0);
  std::vector<HealthFinding> out;
  std::vector<double> compute;
  for (const RankHealth& r : ranks) compute.push_back(r.compute_per_step());
  const double fastest = *std::min_element(compute.begin(), compute.end());
  bool others_move = false;
  for (const RankHealth& r : ranks) others_move = others_move || r.loss_changes > 0;
  for (size_t i = 0; i < n; ++i) {
    const RankHealth& r = ranks[i];
    const double c = compute[i];
    best_[i] = std::min(best_[i], c);
    const std::string key = fmt::format("health/rank{}/", r.rank);
    metrics[key + "compute_ms"] = 1e3 * c;
    metrics[key + "wait_ms"] = 1e3 * r.wait_seconds / std::max(1.0, r.steps);
    metrics[key + "data_ms"] = 1e3 * r.data_seconds / std::max(1.0, r.steps);
    metrics[key + "loss"] = r.loss;
    // 1 is the fastest rank / the rank's own best; a rank taking twice as long scores 0.5.
    metrics[key + "straggler_relative"] = c > 0 ? fastest / c : 1.0;
    metrics[key + "straggler_individual"] = c > 0 ? best_[i] / c : 1.0;
    // Slower than the median of the other ranks by the threshold (with two ranks: than the other one): a straggler
    // once it stays so (one slow interval is noise).
    std::vector<double> others = compute;
    others.erase(others.begin() + static_cast<std::ptrdiff_t>(i));
    const double med = median(others);
    if (n > 1 && med > 0 && c >= (1 + o_.straggler_threshold) * med) {
      if (++slow_[i] == o_.straggler_windows) {
        out.push_back({"straggler", r.rank, r.node,
                       fmt::format("compute {:.2f} ms per step against a median of {:.2f} ms over the other ranks "
                                   "(+{:.0f}%) "
                                   "for {} intervals; its own best {:.2f} ms",
                                   1e3 * c, 1e3 * med, 100 * (c / med - 1), slow_[i], 1e3 * best_[i])});
      }
    } else {
      slow_[i] = 0;
    }
    if (r.nonfinite > 0) {
      out.push_back(
          {"non-finite loss", r.rank, r.node,
           fmt::format("{} of its last {:.0f} steps had a non-finite loss (last: {})", r.nonfinite, r.steps, r.loss)});
    }
    if (r.gpu_util >= 0) {
      metrics[key + "gpu_util"] = r.gpu_util;
      metrics[key + "gpu_mem_gb"] = r.gpu_mem_gb;
    }
    if (r.gpu_xids > 0 || r.gpu_ecc_new > 0) {
      std::string evidence;
      if (r.gpu_xids > 0) {
        evidence = fmt::format("{} critical XID event{} on its GPU (last: XID {})", r.gpu_xids,
                               r.gpu_xids == 1 ? "" : "s", r.gpu_last_xid);
      }
      if (r.gpu_ecc_new > 0) {
        evidence += fmt::format("{}{} new uncorrected ECC error{} on its GPU", evidence.empty() ? "" : "; ",
                                r.gpu_ecc_new, r.gpu_ecc_new == 1 ? "" : "s");
      }
      out.push_back({"gpu error", r.rank, r.node, evidence});
    }
    bool others_changed = false;
    for (size_t j = 0; j < n; ++j) others_changed = others_changed || (j != i && ranks[j].loss_changes > 0);
    if (r.steps > 1 && r.loss_changes == 0 && others_changed) {
      if (++flat_[i] == o_.flat_loss_windows) {
        out.push_back(
            {"flat loss", r.rank, r.node,
             fmt::format("its loss stayed at {} for {} intervals while the other ranks' changed", r.loss, flat_[i])});
      }
    } else {
      flat_[i] = 0;
    }
  }
  // Network throughput per node; a collapse counts when the other nodes keep theirs.
  std::vector<std::pair<int, double>> nodes;
  for (const RankHealth& r : ranks) {
    if (r.net_bytes_per_second >= 0) nodes.emplace_back(r.node, r.net_bytes_per_second);
  }
  int max_node = 0;
  for (const auto& [node, rate] : nodes) max_node = std::max(max_node, node);
  net_.resize(static_cast<size_t>(max_node) + 1);
  std::vector<bool> collapsed(net_.size(), false);
  for (const auto& [node, rate] : nodes) {
    metrics[fmt::format("health/node{}/net_MBps", node)] = rate / 1e6;
    std::vector<double>& history = net_[static_cast<size_t>(node)];
    const double usual = median(history);
    collapsed[static_cast<size_t>(node)] = history.size() >= 3 && usual > 0 && rate < o_.net_collapse_fraction * usual;
    history.push_back(rate);
    if (history.size() > 20) history.erase(history.begin());
  }
  for (const auto& [node_of_rate, rate] : nodes) {
    const int node = node_of_rate;  // a plain variable: lambdas capture no structured bindings before C++20 in clang
    const bool others_fine = std::any_of(nodes.begin(), nodes.end(), [&](const auto& o) {
      return o.first != node && !collapsed[static_cast<size_t>(o.first)];
    });
    if (collapsed[static_cast<size_t>(node)] && others_fine) {
      out.push_back({"network collapse", -1, node,
                     fmt::format("{:.2f} MB/s over its interfaces against its usual {:.2f} MB/s", rate / 1e6,
                                 median(net_[static_cast<size_t>(node)]) / 1e6)});
    }
  }
  metrics["health/findings"] = static_cast<double>(out.size());
  return out;
}

HealthMonitor::~HealthMonitor() = default;

void HealthMonitor::run_event(Event event, core::State& s, core::Logger& logger) {
  // The monitor's own cost per step, every event included, reported as health/overhead_ms. FIT_START's one-time
  // setup (loading NVML and registering for the GPU's XID events, tens of milliseconds) is not a per-step cost: it
  // is logged once instead of being spread over the first interval's steps.
  const double entered = monitor_clock_seconds();
  handle(event, s, logger);
  const double spent = monitor_clock_seconds() - entered;
  if (event == Event::kFitStart) {
    spdlog::debug("[health] rank {}: monitor set up in {:.1f} ms", s.rank, 1e3 * spent);
  } else {
    own_seconds_ += spent;
  }
}

void HealthMonitor::handle(Event event, core::State& s, core::Logger& logger) {
  switch (event) {
    case Event::kFitStart:
      mine_ = {};
      first_batch_ = s.timestamp.batch;
      if (s.device.is_cuda() && !nvml_) {
        std::string why;
        gpu_bus_id_ = util::cuda_pci_bus_id(s.device.index() >= 0 ? s.device.index() : 0);
        if (!gpu_bus_id_.empty()) nvml_ = util::Nvml::open(&why);
        if (nvml_) {
          try {  // the first read registers for the GPU's XID events and gives the ECC count to compare with
            ecc_seen_ = nvml_->read(gpu_bus_id_).ecc_uncorrected;
          } catch (const Error& e) {
            why = e.what();
            nvml_.reset();
          }
        }
        if (!nvml_) {
          spdlog::warn("[health] rank {}: no GPU signals (utilisation, memory, XID and ECC errors): {}", s.rank,
                       gpu_bus_id_.empty() ? std::string("no PCI bus id for the device") : why);
        }
      }
      if (s.local_rank == 0) {
        if (auto b = network_bytes()) {
          net_bytes_ = *b;
          net_at_ = monitor_clock_seconds();
        }
      }
      return;
    case Event::kBeforeDataloader:
      data_started_ = monitor_clock_seconds();
      return;
    case Event::kAfterDataloader:
      mine_.data_seconds += monitor_clock_seconds() - data_started_;
      return;
    case Event::kBatchStart:
      step_started_ = monitor_clock_seconds();
      wait_at_start_ = dist::collective_wait_seconds();
      return;
    case Event::kBatchEnd:
      break;
    default:
      return;
  }
  mine_.steps += 1;
  mine_.step_seconds += monitor_clock_seconds() - step_started_;
  mine_.wait_seconds += dist::collective_wait_seconds() - wait_at_start_;
  const double loss = s.train_loss;
  if (!std::isfinite(loss)) mine_.nonfinite += 1;
  if (previous_loss_ && loss != *previous_loss_) mine_.loss_changes += 1;
  previous_loss_ = loss;
  mine_.loss = loss;
  if (s.timestamp.batch - first_batch_ >= o_.interval) exchange(s, logger);
}

void HealthMonitor::exchange(core::State& s, core::Logger& logger) {
  mine_.rank = static_cast<int>(s.rank);
  mine_.node = static_cast<int>(s.rank / std::max<int64_t>(1, s.local_world_size));
  mine_.net_bytes_per_second = -1;
  if (s.local_rank == 0 && net_bytes_ >= 0) {
    if (auto b = network_bytes()) {
      const double t = monitor_clock_seconds();
      mine_.net_bytes_per_second = (*b - net_bytes_) / std::max(1e-9, t - net_at_);
      net_bytes_ = *b;
      net_at_ = t;
    }
  }
  if (nvml_) {
    try {
      const util::GpuHealth g = nvml_->read(gpu_bus_id_);
      mine_.gpu_util = g.utilization_percent;
      mine_.gpu_mem_gb = g.memory_used_bytes / 1e9;
      if (g.ecc_uncorrected >= 0) {
        if (ecc_seen_ >= 0)
          mine_.gpu_ecc_new = static_cast<double>(std::max<int64_t>(0, g.ecc_uncorrected - ecc_seen_));
        ecc_seen_ = g.ecc_uncorrected;
      }
      mine_.gpu_xids = static_cast<double>(g.xids.size());
      if (!g.xids.empty()) mine_.gpu_last_xid = static_cast<double>(g.xids.back());
    } catch (const Error& e) {
      spdlog::warn("[health] rank {}: GPU signals off after an NVML error: {}", s.rank, e.what());
      nvml_.reset();
    }
  }
  const std::vector<double> packed = pack(mine_);
  at::Tensor in = at::tensor(packed, at::kDouble);
  at::Tensor all = at::empty({static_cast<int64_t>(kFields * s.world_size)}, at::kDouble);
  if (s.comm) {
    s.comm->all_gather(all, in).wait();
  } else {
    all.copy_(in);
  }
  std::vector<RankHealth> ranks;
  const double* v = all.data_ptr<double>();
  for (int64_t r = 0; r < s.world_size; ++r) ranks.push_back(unpack(v + r * kFields));
  core::Metrics metrics;
  const std::vector<HealthFinding> findings = assessor_.assess(ranks, metrics);
  // This rank's time in the monitor per step over the interval (the previous exchange included).
  metrics["health/overhead_ms"] =
      1e3 * own_seconds_ / std::max(1.0, static_cast<double>(s.timestamp.batch - first_batch_));
  own_seconds_ = 0;
  logger.log_metrics(metrics);
  for (const HealthFinding& f : findings) {
    if (s.rank == 0) {
      spdlog::warn("[health] {}: {} over batches {}-{}: {}", f.kind,
                   f.rank >= 0 ? fmt::format("rank {} (node {})", f.rank, f.node) : fmt::format("node {}", f.node),
                   first_batch_ + 1, s.timestamp.batch, f.evidence);
    }
  }
  if (!findings.empty() && o_.response != "log" && !s.preempted()) {
    // Every rank reached the same findings from the same figures: all stop after this batch, with a checkpoint.
    s.stop_training(core::State::StopReason::kUnhealthy);
    std::vector<int> bad;
    if (o_.response == "exclude_node") {
      for (const HealthFinding& f : findings) {
        if (std::find(bad.begin(), bad.end(), f.node) == bad.end()) bad.push_back(f.node);
      }
      std::sort(bad.begin(), bad.end());
      if (std::find(bad.begin(), bad.end(), mine_.node) != bad.end()) {
        s.stop_training(core::State::StopReason::kNodeBad);
      }
    }
    if (s.rank == 0) {
      if (bad.empty()) {
        spdlog::warn("[health] response stop: every rank saves a checkpoint after batch {} and the job exits 76",
                     s.timestamp.batch);
      } else {
        spdlog::warn(
            "[health] response exclude_node: every rank saves a checkpoint after batch {}; the ranks of node{} {} "
            "exit 77 (node bad), the others 76",
            s.timestamp.batch, bad.size() == 1 ? "" : "s", fmt::format("{}", fmt::join(bad, ", ")));
      }
    }
  }
  mine_ = {};
  first_batch_ = s.timestamp.batch;
}

}  // namespace tessera::callbacks
