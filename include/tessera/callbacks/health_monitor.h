// health_monitor: per rank and per step, the step's compute time, the time spent waiting in collectives, the
// data-loading time and the loss; per node, the network interfaces' throughput (/proc/net/dev). Every `interval`
// batches the ranks exchange their figures (one all_gather) and every rank judges them the same way:
//   - a straggler score per rank, as NVIDIA's resiliency extension scores them: its compute time per step against the
//     fastest rank's (relative) and against its own best (individual); a rank whose compute time stays at least
//     `straggler_threshold` above the median of the other ranks for `straggler_windows` intervals is reported;
//   - silent failures: a non-finite loss, a loss that stays exactly unchanged on one rank while the others' move, and
//     a node whose network throughput collapses while the other nodes' does not.
//   - GPU errors (on CUDA ranks, through NVML when the driver has it): a critical XID event or new uncorrected ECC
//     errors on a rank's GPU during the interval. Its utilisation and memory are logged.
// Each finding is logged with the rank, the node and the evidence; with `response: stop` the job then saves a
// checkpoint and stops with exit code 76, so that the supervisor restarts it (docs/checkpointing.md); with
// `response: exclude_node` the ranks on the nodes the findings name exit 77 instead, which marks their node bad for an
// elastic job's launcher (docs/distributed.md#elastic-jobs-node-exclusion).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/core/callback.h"
#include "tessera/util/nvml.h"

namespace tessera::callbacks {

struct HealthMonitorOptions {
  int64_t interval = 10;               // batches between the ranks' exchanges
  double straggler_threshold = 0.10;   // compute time this far above the other ranks' median makes a straggler
  int64_t straggler_windows = 2;       // intervals a straggler must stay slow before it is reported
  int64_t flat_loss_windows = 5;       // intervals a rank's loss may stay unchanged while the others' move
  double net_collapse_fraction = 0.1;  // a node's network throughput below this fraction of its own median
  // log | stop (save a checkpoint and exit 76) | exclude_node (as stop, and the ranks on the nodes of the findings exit
  // 77 instead: an elastic job's launcher then excludes those nodes)
  std::string response = "log";
};

// One rank's figures over one interval.
struct RankHealth {
  int rank = 0;
  int node = 0;
  double steps = 0;
  double step_seconds = 0;           // batch start to batch end, summed
  double wait_seconds = 0;           // of which blocked in collectives
  double data_seconds = 0;           // loading the batches, summed
  double loss = 0;                   // the last step's loss
  double loss_changes = 0;           // steps whose loss differed from the step before
  double nonfinite = 0;              // steps with a non-finite loss
  double net_bytes_per_second = -1;  // the node's interfaces, read by its first rank (-1 on the others)
  // The rank's GPU through NVML (util/nvml.h), read at the interval's end; -1 without a GPU or NVML.
  double gpu_util = -1;             // percent of the driver's last sample period a kernel ran
  double gpu_mem_gb = -1;           // memory in use, GB
  double gpu_ecc_new = 0;           // uncorrected ECC errors that appeared during the interval
  double gpu_xids = 0;              // critical XID events during the interval
  double gpu_last_xid = 0;          // the last one's code
  double compute_per_step() const;  // (step - wait) / steps
};

struct HealthFinding {
  std::string kind;  // "straggler", "non-finite loss", "flat loss", "network collapse", "gpu error"
  int rank = -1;     // -1 for a node's finding
  int node = 0;
  std::string evidence;
};

// The judgement, one interval at a time (stateful: it remembers each rank's best and the slow streaks). Every rank
// holds one and feeds it the same figures, so every rank reaches the same findings.
class HealthAssessor {
 public:
  explicit HealthAssessor(HealthMonitorOptions o) : o_(std::move(o)) {}
  // The findings of this interval; `metrics` receives each signal (health/rank{r}/..., health/node{n}/...).
  std::vector<HealthFinding> assess(const std::vector<RankHealth>& ranks, core::Metrics& metrics);

 private:
  HealthMonitorOptions o_;
  std::vector<double> best_;              // per rank: its lowest compute time per step so far
  std::vector<int64_t> slow_;             // per rank: consecutive slow intervals
  std::vector<int64_t> flat_;             // per rank: consecutive intervals without a loss change
  std::vector<std::vector<double>> net_;  // per node: throughput history
};

class HealthMonitor : public core::Callback {
 public:
  explicit HealthMonitor(HealthMonitorOptions o) : o_(o), assessor_(std::move(o)) {}
  ~HealthMonitor() override;
  std::string name() const override { return "HealthMonitor"; }
  void run_event(core::Event event, core::State& state, core::Logger& logger) override;

 private:
  void handle(core::Event event, core::State& s, core::Logger& logger);
  void exchange(core::State& s, core::Logger& logger);

  HealthMonitorOptions o_;
  HealthAssessor assessor_;
  RankHealth mine_;
  double data_started_ = 0, step_started_ = 0, wait_at_start_ = 0;
  double own_seconds_ = 0;  // spent in this callback since the last exchange (health/overhead_ms)
  std::optional<double> previous_loss_;
  double net_bytes_ = -1, net_at_ = 0;  // the last /proc/net/dev reading and its time
  int64_t first_batch_ = 0;             // the first batch of the current interval
  std::unique_ptr<util::Nvml> nvml_;    // on a CUDA rank with an NVIDIA driver
  std::string gpu_bus_id_;              // this rank's GPU
  int64_t ecc_seen_ = -1;               // its uncorrected ECC count at the previous read
};

// The total bytes received and sent over every interface in /proc/net/dev, or nullopt when it cannot be read.
std::optional<double> network_bytes();

}  // namespace tessera::callbacks
