// Options of the callbacks a recipe can list under `callbacks:`.
#pragma once

#include <optional>
#include <string>

#include "tessera/config/component.h"

namespace tessera::callbacks {

struct SpeedMonitorOptions {
  int64_t window_size = 100;                  // batches in the rolling throughput window
  std::optional<double> gpu_flops_available;  // peak FLOP/s per device for MFU; default: detected
  std::string time_unit = "hours";
};

struct RuntimeEstimatorOptions {
  int64_t skip_batches = 1;
  std::string time_unit = "hours";
};

struct LRMonitorOptions {};
struct MemoryMonitorOptions {};

// Registered: speed_monitor, lr_monitor, memory_monitor, runtime_estimator.
config::ComponentRegistry& callback_registry();

}  // namespace tessera::callbacks
