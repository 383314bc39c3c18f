// Options of the callbacks a recipe can list under `callbacks:`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "tessera/config/component.h"
#include "tessera/config/time.h"
#include "tessera/core/callback.h"

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

// hf_checkpointer (LLM Foundry's HuggingFaceCheckpointer): Hugging Face folders of the model.
struct HfCheckpointerOptions {
  std::string save_folder;                               // required; {run_name} is replaced
  config::Time save_interval = config::Time::epochs(1);  // `ba` or `ep`; a bare integer is epochs
  std::string huggingface_folder_name = "ba{batch}";     // {batch}, {epoch} and {run_name} are replaced
  std::string precision = "float32";                     // float32 | bfloat16 | float16
  bool overwrite = true;                                 // false: an existing folder is an error
  // The final folder also goes to the MLflow logger's run as a model registered under this name (empty: not).
  std::string mlflow_registered_model_name;
  std::string mlflow_logging_config = "{}";  // JSON: {"task": ..., "metadata": {...}} (LLM Foundry's keys)
  // The transformers major version config.json is written for (checkpoint::save_hf_model): 5, or 4 (whose form
  // transformers 5 reads too; transformers 4 does not read 5's rope_parameters).
  int transformers_version = 5;
};

struct LRMonitorOptions {};
struct MemoryMonitorOptions {};

struct OptimizerMonitorOptions {
  bool log_optimizer_metrics = true;  // also the optimizer state's norms (l2_norm/moment/..., l2_norm/param/...)
  int64_t batch_log_interval = 10;    // batches between logs
};

// Where a stopper reads its metric: `eval` (state.eval_metrics["eval"][monitor]: LanguageCrossEntropy,
// LanguagePerplexity) or `train` (the latest batch's loss; monitor `loss/train/total`).
struct MonitoredMetric {
  std::string monitor;
  std::string dataloader_label;
  // Whether smaller is better (comp `less`/`lt`); default: true when the name has "loss", "error", "crossentropy"
  // or "perplexity" in it (any case), else false (`greater`/`gt`).
  bool less = true;
};

struct EarlyStopperOptions {
  MonitoredMetric metric;
  double min_delta = 0.0;                           // an improvement must exceed |min_delta|
  config::Time patience = config::Time::epochs(1);  // `ep` or `ba`; a bare integer is epochs (Composer)
};

struct ThresholdStopperOptions {
  MonitoredMetric metric;
  double threshold = 0.0;      // required
  bool stop_on_batch = false;  // also check at every batch end (else at evaluation and epoch ends)
};

// run_timeout (LLM Foundry's RunTimeoutCallback): the process must exit within `timeout` seconds of FIT_END.
struct RunTimeoutOptions {
  double timeout = 1800;
};

// Registered: speed_monitor, lr_monitor, memory_monitor, runtime_estimator, health_monitor, optimizer_monitor,
// early_stopper, threshold_stopper, hf_checkpointer, run_timeout; scheduled_gc is accepted and does nothing.
core::CallbackRegistry& callback_registry();

}  // namespace tessera::callbacks
