// Built-in callbacks (registered by name for `callbacks:` in recipes; options in options.h). Metric names follow
// Composer's, so dashboards and scripts written for LLM Foundry read them unchanged.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>

#include "tessera/callbacks/options.h"
#include "tessera/config/component.h"
#include "tessera/core/callback.h"

namespace tessera::callbacks {

// speed_monitor, at BATCH_END once `window_size` batches have been seen: throughput/{batches,samples,tokens}_per_sec
// over the window and their throughput/device/* values (divided by the world size), throughput/flops_per_sec from
// LLM Foundry's MPT FLOP count ((2 N + 4 L d T) x 3 per token), throughput/device/mfu and /hfu against
// `gpu_flops_available` (per device; default: a GEMM probe measured once at FIT_START in the run's precision, CPU or
// GPU), and time/train, time/val, time/total in `time_unit`.
class SpeedMonitor : public core::Callback {
 public:
  explicit SpeedMonitor(SpeedMonitorOptions o) : o_(std::move(o)) {}
  std::string name() const override { return "SpeedMonitor"; }
  void run_event(core::Event event, core::State& state, core::Logger& logger) override;
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
class LRMonitor : public core::Callback {
 public:
  std::string name() const override { return "LRMonitor"; }
  void run_event(core::Event event, core::State& state, core::Logger& logger) override;
};

// memory_monitor, at AFTER_TRAIN_BATCH: memory/rss_gb and memory/peak_rss_gb of the process; on GPU also the CUDA
// caching allocator's memory/{current,peak}_{allocated,reserved}_mem (GB) and memory/alloc_retries.
class MemoryMonitor : public core::Callback {
 public:
  std::string name() const override { return "MemoryMonitor"; }
  void run_event(core::Event event, core::State& state, core::Logger& logger) override;
};

// runtime_estimator, at BATCH_END after `skip_batches`: time/remaining_estimate in `time_unit`, extrapolated from
// the training rate since then (evaluation time excluded).
class RuntimeEstimator : public core::Callback {
 public:
  explicit RuntimeEstimator(RuntimeEstimatorOptions o) : o_(std::move(o)) {}
  std::string name() const override { return "RuntimeEstimator"; }
  void run_event(core::Event event, core::State& state, core::Logger& logger) override;

 private:
  RuntimeEstimatorOptions o_;
  std::optional<double> start_wct_;
  double start_fraction_ = 0;
};

// optimizer_monitor (Composer's OptimizerMonitor), at BATCH_END when the batch count is a multiple of
// batch_log_interval: l2_norm/grad/<name> for every parameter with a gradient and l2_norm/grad/global (the root sum of
// their squares). The gradients are those the optimizer just used (after gradient clipping, which runs at
// AFTER_TRAIN_BATCH; they are cleared only at the next BEFORE_TRAIN_BATCH). With log_optimizer_metrics, also
// l2_norm/param/<name> (the updated weights), l2_norm/moment/<name> (exp_avg, or SGD's momentum_buffer) and, for
// the Adam family, l2_norm/second_moment_sqrt/<name> (sqrt of the norm of exp_avg_sq). <name> is the parameter's
// name under LLM Foundry's wrapper: "model." + the MPT name (model.transformer.blocks.0.attn.Wqkv.weight).
// With several ranks (sharded parameters) each rank sums squares over its part of each parameter and the sums are
// added over the shard group (every rank must run it; rank 0 logs): the same values as one process.
class OptimizerMonitor : public core::Callback {
 public:
  explicit OptimizerMonitor(OptimizerMonitorOptions o) : o_(o) {}
  std::string name() const override { return "OptimizerMonitor"; }
  void run_event(core::Event event, core::State& state, core::Logger& logger) override;

 private:
  OptimizerMonitorOptions o_;
};

// early_stopper (Composer's EarlyStopper): keeps the best value of the monitored metric (an improvement must beat it
// by more than |min_delta| in the direction of `comp`) and calls stop_training() once more than `patience` (epochs or
// batches) has passed since the best. Checked at EVAL_END for dataloader_label eval; for train, at EPOCH_END and,
// when patience is in batches, at every BATCH_END.
class EarlyStopper : public core::Callback {
 public:
  explicit EarlyStopper(EarlyStopperOptions o) : o_(std::move(o)) {}
  std::string name() const override { return "EarlyStopper"; }
  void run_event(core::Event event, core::State& state, core::Logger& logger) override;
  std::optional<double> best() const { return best_; }

 private:
  void update(core::State& state);
  EarlyStopperOptions o_;
  std::optional<double> best_;
  config::Timestamp best_at_;
};

// threshold_stopper (Composer's ThresholdStopper): calls stop_training() as soon as the monitored metric is below
// (comp less) or above (greater) `threshold`. Checked at EVAL_END for eval; for train at EPOCH_END, and at every
// BATCH_END with stop_on_batch.
class ThresholdStopper : public core::Callback {
 public:
  explicit ThresholdStopper(ThresholdStopperOptions o) : o_(std::move(o)) {}
  std::string name() const override { return "ThresholdStopper"; }
  void run_event(core::Event event, core::State& state, core::Logger& logger) override;

 private:
  ThresholdStopperOptions o_;
};

// run_timeout (LLM Foundry's RunTimeoutCallback): a guard against a run that hangs on its way out (a stuck collective
// in teardown, a thread that never joins). At FIT_END a timer starts; if the process is still alive `timeout` seconds
// later, it logs an error and interrupts itself with SIGINT (default action: the process ends as interrupted, as the
// Python callback's KeyboardInterrupt does). close() cancels the timer, so a run that exits in time is untouched.
class RunTimeout : public core::Callback {
 public:
  explicit RunTimeout(RunTimeoutOptions o);
  ~RunTimeout() override;
  RunTimeout(const RunTimeout&) = delete;
  RunTimeout& operator=(const RunTimeout&) = delete;
  std::string name() const override { return "RunTimeoutCallback"; }
  void run_event(core::Event event, core::State& state, core::Logger& logger) override;
  void close(core::State& state, core::Logger& logger) override;

 private:
  void cancel();
  struct Timer;
  RunTimeoutOptions o_;
  std::unique_ptr<Timer> timer_;
};

// hf_checkpointer (LLM Foundry's HuggingFaceCheckpointer): writes the model as a Hugging Face MPT folder
// (config.json + safetensors) to save_folder/huggingface/<huggingface_folder_name> every save_interval and at the end
// of training. With several ranks every rank takes part in gathering the weights and rank 0 writes; the folder
// appears complete or not at all (written under a temporary name, then renamed). With mlflow_registered_model_name,
// the final folder also goes to the MLflow logger (core::ModelRegistry) as a registered model.
class HfCheckpointer : public core::Callback {
 public:
  explicit HfCheckpointer(HfCheckpointerOptions o) : o_(std::move(o)) {}
  std::string name() const override { return "HuggingFaceCheckpointer"; }
  void run_event(core::Event event, core::State& state, core::Logger& logger) override;
  // The folder (or object-store prefix) of the newest export; empty before one.
  const std::string& last_export() const { return last_export_; }

 private:
  void save(core::State& state, core::Logger& logger, bool final);
  HfCheckpointerOptions o_;
  int64_t last_saved_batch_ = -1;
  std::string last_export_;
};

// The value a stopper monitors now: eval -> state.eval_metrics["eval"][monitor] (Error when no evaluation has run);
// train -> state.train_loss.
double monitored_value(const MonitoredMetric& metric, const core::State& state);

// Fraction of max_duration elapsed (epochs counted fractionally through the dataloader length).
double elapsed_fraction(const core::State& state);
// Seconds expressed in seconds | minutes | hours | days.
double in_time_unit(double seconds, const std::string& unit);

}  // namespace tessera::callbacks
