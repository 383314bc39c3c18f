// A benchmark plug-in for health_monitor_overhead.py (issue 65 item 4): the callback `health_monitor_gated` runs the
// real callbacks::HealthMonitor in alternate blocks of `block` batches and not in the others, and times every step
// (one BATCH_END to the next, the monitor's work included), so that one run measures the steps with the monitor and
// the steps without it side by side. Two separate runs cannot resolve a 1% overhead on a small host: one run's step
// time differs from the next one's by up to 12% either way on 2 cores, while adjacent blocks of one run share
// whatever made that run fast or slow.
//
// Blocks start at batch 0: blocks 0, 2, 4... run without the monitor, blocks 1, 3, 5... with it. The gate decides at
// BEFORE_DATALOADER (a step's first event) from the batch index, so every rank decides alike (the monitor's exchange
// is a collective). At a block's end rank 0 logs gate/block, gate/monitored, gate/steps, gate/ms_per_step and
// gate/own_ms_per_step (the time spent inside the monitor's event handlers). Load it with
// `train --plugin build/benchmarks/libbench_health_monitor_gate.so`.
#include <chrono>

#include "tessera/callbacks/health_monitor.h"
#include "tessera/callbacks/options.h"
#include "tessera/config/reader.h"
#include "tessera/core/callback.h"
#include "tessera/core/state.h"

using namespace tessera;

namespace {

struct GateOptions {
  callbacks::HealthMonitorOptions monitor;
  int64_t block = 20;  // batches per block
};

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class HealthMonitorGate : public core::Callback {
 public:
  explicit HealthMonitorGate(GateOptions o) : o_(o), monitor_(o.monitor) {}
  std::string name() const override { return "HealthMonitorGate"; }

  void run_event(core::Event e, core::State& s, core::Logger& logger) override {
    if (e == core::Event::kFitStart) {
      monitor_.run_event(e, s, logger);
      return;
    }
    if (e == core::Event::kBeforeDataloader) on_ = (s.timestamp.batch / o_.block) % 2 == 1;
    if (on_) {
      const double entered = now_seconds();
      monitor_.run_event(e, s, logger);
      own_ += now_seconds() - entered;
    }
    if (e != core::Event::kBatchEnd) return;
    const double t = now_seconds();
    if (last_end_ > 0) {
      seconds_ += t - last_end_;
      steps_ += 1;
    }
    last_end_ = t;
    if (s.timestamp.batch % o_.block == 0 && steps_ > 0) {  // the step that ends a block
      if (s.rank == 0) {
        logger.log_metrics({{"gate/block", static_cast<double>(s.timestamp.batch / o_.block - 1)},
                            {"gate/monitored", on_ ? 1.0 : 0.0},
                            {"gate/steps", static_cast<double>(steps_)},
                            {"gate/ms_per_step", 1e3 * seconds_ / static_cast<double>(steps_)},
                            {"gate/own_ms_per_step", 1e3 * own_ / static_cast<double>(steps_)}});
      }
      seconds_ = own_ = 0;
      steps_ = 0;
    }
  }

 private:
  GateOptions o_;
  callbacks::HealthMonitor monitor_;
  bool on_ = false;
  double last_end_ = 0, seconds_ = 0, own_ = 0;
  int64_t steps_ = 0;
};

[[maybe_unused]] const bool kRegistered = (callbacks::callback_registry().add(
                                               "health_monitor_gated",
                                               [](config::Section& s) -> std::any {
                                                 GateOptions o;
                                                 o.monitor.interval = s.get_int("interval", o.monitor.interval);
                                                 s.check(o.monitor.interval > 0, "interval", "must be positive");
                                                 o.block = s.get_int("block", o.block);
                                                 s.check(o.block > 0, "block", "must be positive");
                                                 s.finish();
                                                 return o;
                                               },
                                               core::construct<core::Callback, HealthMonitorGate, GateOptions>()),
                                           true);

}  // namespace
