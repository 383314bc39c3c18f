// Built-in callbacks (registered by name for `callbacks:` in recipes; options in options.h). Metric names follow
// Composer's, so dashboards and scripts written for LLM Foundry read them unchanged.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>

#include "tessera/callbacks/options.h"
#include "tessera/config/component.h"
#include "tessera/trainer/callback.h"
#include "tessera/trainer/train_config.h"

namespace tessera::callbacks {

// speed_monitor, at BATCH_END once `window_size` batches have been seen: throughput/{batches,samples,tokens}_per_sec
// over the window and their throughput/device/* values (divided by the world size), throughput/flops_per_sec from
// LLM Foundry's MPT FLOP count ((2 N + 4 L d T) x 3 per token), throughput/device/mfu and /hfu against
// `gpu_flops_available` (per device; default: a GEMM probe measured once at FIT_START in the run's precision, CPU or
// GPU), and time/train, time/val, time/total in `time_unit`.
class SpeedMonitor : public trainer::Callback {
 public:
  explicit SpeedMonitor(SpeedMonitorOptions o) : o_(std::move(o)) {}
  std::string name() const override { return "SpeedMonitor"; }
  void run_event(trainer::Event event, trainer::State& state, trainer::Logger& logger) override;
  double peak_flops() const { return peak_; }

 private:
  struct Point {
    int64_t batch, sample, token;
    double wct, flops;
  };
  SpeedMonitorOptions o_;
  std::deque<Point> history_;
  double total_flops_ = 0;
  double peak_ = 0;
  double eval_seconds_ = 0;
  double eval_started_ = 0;
};

// lr_monitor, at BATCH_END: lr-{Optimizer}/group0, the rate of the next step.
class LRMonitor : public trainer::Callback {
 public:
  std::string name() const override { return "LRMonitor"; }
  void run_event(trainer::Event event, trainer::State& state, trainer::Logger& logger) override;
};

// memory_monitor, at AFTER_TRAIN_BATCH: memory/rss_gb and memory/peak_rss_gb of the process; on GPU also the CUDA
// caching allocator's memory/{current,peak}_{allocated,reserved}_mem (GB) and memory/alloc_retries.
class MemoryMonitor : public trainer::Callback {
 public:
  std::string name() const override { return "MemoryMonitor"; }
  void run_event(trainer::Event event, trainer::State& state, trainer::Logger& logger) override;
};

// runtime_estimator, at BATCH_END after `skip_batches`: time/remaining_estimate in `time_unit`, extrapolated from
// the training rate since then (evaluation time excluded).
class RuntimeEstimator : public trainer::Callback {
 public:
  explicit RuntimeEstimator(RuntimeEstimatorOptions o) : o_(std::move(o)) {}
  std::string name() const override { return "RuntimeEstimator"; }
  void run_event(trainer::Event event, trainer::State& state, trainer::Logger& logger) override;

 private:
  RuntimeEstimatorOptions o_;
  std::optional<double> start_wct_;
  double start_fraction_ = 0;
};

// Fraction of max_duration elapsed (epochs counted fractionally through the dataloader length).
double elapsed_fraction(const trainer::State& state);
// Seconds expressed in seconds | minutes | hours | days.
double in_time_unit(double seconds, const std::string& unit);

std::shared_ptr<trainer::Callback> make_callback(const config::ComponentOptions& c, const trainer::TrainConfig& cfg);

}  // namespace tessera::callbacks
