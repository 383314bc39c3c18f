// The callback registry: option schemas and builders.
#include "tessera/callbacks/options.h"

#include "tessera/callbacks/callbacks.h"
#include "tessera/callbacks/health_monitor.h"
#include "tessera/callbacks/oom_observer.h"
#include "tessera/storage/probe.h"
#include "tessera/util/file_io.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::callbacks {
namespace {

bool contains_any(std::string name, std::initializer_list<const char*> parts) {
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return std::any_of(parts.begin(), parts.end(), [&](const char* p) { return name.find(p) != std::string::npos; });
}

// monitor, dataloader_label and comp, checked against the metrics the trainer produces.
// `known`: every key of the stopper, so that a misspelt key is reported as such before a required one is missed.
MonitoredMetric parse_monitored(config::Section& s, const std::vector<std::string_view>& known) {
  s.reject_unknown(known);
  MonitoredMetric m;
  m.dataloader_label = s.require_string("dataloader_label");
  s.check(m.dataloader_label == "eval" || m.dataloader_label == "train", "dataloader_label",
          fmt::format("\"{}\": expected eval or train", m.dataloader_label));
  m.monitor = s.require_string("monitor");
  if (m.dataloader_label == "train") {
    s.check(m.monitor == "loss/train/total", "monitor",
            fmt::format("\"{}\": with dataloader_label train the monitored metric is loss/train/total", m.monitor));
  } else {
    s.check(m.monitor == "LanguageCrossEntropy" || m.monitor == "LanguagePerplexity", "monitor",
            fmt::format("\"{}\": the eval metrics are LanguageCrossEntropy and LanguagePerplexity", m.monitor));
  }
  m.less = contains_any(m.monitor, {"loss", "error", "crossentropy", "perplexity"});
  if (s.has("comp")) {
    const std::string comp = s.get_choice("comp", "", {"less", "lt", "greater", "gt"});
    m.less = comp == "less" || comp == "lt";
  }
  return m;
}

}  // namespace

core::CallbackRegistry& callback_registry() {
  static core::CallbackRegistry* registry = [] {
    auto* r = new core::CallbackRegistry("callback");
    r->add(
        "speed_monitor",
        [](config::Section& s) -> std::any {
          SpeedMonitorOptions o;
          o.window_size = s.get_int("window_size", o.window_size);
          s.check(o.window_size > 0, "window_size", "must be positive");
          o.gpu_flops_available = s.get_optional_double("gpu_flops_available");
          s.check(!o.gpu_flops_available || *o.gpu_flops_available > 0, "gpu_flops_available", "must be positive");
          o.time_unit = s.get_choice("time_unit", o.time_unit, {"seconds", "minutes", "hours", "days"});
          s.finish();
          return o;
        },
        core::construct<core::Callback, SpeedMonitor, SpeedMonitorOptions>());
    r->add(
        "health_monitor",
        [](config::Section& s) -> std::any {
          HealthMonitorOptions o;
          o.interval = s.get_int("interval", o.interval);
          s.check(o.interval > 0, "interval", "must be positive");
          o.straggler_threshold = s.get_double("straggler_threshold", o.straggler_threshold);
          s.check(o.straggler_threshold > 0, "straggler_threshold", "must be positive");
          o.straggler_windows = s.get_int("straggler_windows", o.straggler_windows);
          s.check(o.straggler_windows > 0, "straggler_windows", "must be positive");
          o.flat_loss_windows = s.get_int("flat_loss_windows", o.flat_loss_windows);
          s.check(o.flat_loss_windows > 0, "flat_loss_windows", "must be positive");
          o.net_collapse_fraction = s.get_double("net_collapse_fraction", o.net_collapse_fraction);
          s.check(o.net_collapse_fraction > 0 && o.net_collapse_fraction < 1, "net_collapse_fraction",
                  "must be in (0, 1)");
          o.response = s.get_choice("response", o.response, {"log", "stop", "exclude_node"});
          s.finish();
          return o;
        },
        core::construct<core::Callback, HealthMonitor, HealthMonitorOptions>());
    r->add(
        "runtime_estimator",
        [](config::Section& s) -> std::any {
          RuntimeEstimatorOptions o;
          o.skip_batches = s.get_int("skip_batches", o.skip_batches);
          s.check(o.skip_batches >= 0, "skip_batches", "must be non-negative");
          o.time_unit = s.get_choice("time_unit", o.time_unit, {"seconds", "minutes", "hours", "days"});
          s.finish();
          return o;
        },
        core::construct<core::Callback, RuntimeEstimator, RuntimeEstimatorOptions>());
    r->add(
        "lr_monitor",
        [](config::Section& s) -> std::any {
          s.finish();
          return LRMonitorOptions{};
        },
        core::construct<core::Callback, LRMonitor>());
    r->add(
        "oom_observer", [](config::Section& s) -> std::any { return parse_oom_observer_options(s); },
        [](const std::any& o, const core::RunContext& run) -> std::shared_ptr<core::Callback> {
          return std::make_shared<OomObserver>(std::any_cast<const OomObserverOptions&>(o), run);
        });
    r->add(
        "memory_monitor",
        [](config::Section& s) -> std::any {
          s.finish({"memory_keys", "dist_aggregate_batch_interval"});
          return MemoryMonitorOptions{};
        },
        core::construct<core::Callback, MemoryMonitor>());
    r->add(
        "optimizer_monitor",
        [](config::Section& s) -> std::any {
          OptimizerMonitorOptions o;
          o.log_optimizer_metrics = s.get_bool("log_optimizer_metrics", o.log_optimizer_metrics);
          o.batch_log_interval = s.get_int("batch_log_interval", o.batch_log_interval);
          s.check(o.batch_log_interval > 0, "batch_log_interval", "must be a positive number of batches");
          s.finish();
          return o;
        },
        core::construct<core::Callback, OptimizerMonitor, OptimizerMonitorOptions>());
    r->add(
        "early_stopper",
        [](config::Section& s) -> std::any {
          EarlyStopperOptions o;
          o.metric = parse_monitored(s, {"monitor", "dataloader_label", "comp", "min_delta", "patience"});
          o.min_delta = s.get_double("min_delta", o.min_delta);
          o.patience = s.get_time("patience", o.patience, config::TimeUnit::kEpoch);
          s.check(o.patience.unit() == config::TimeUnit::kEpoch || o.patience.unit() == config::TimeUnit::kBatch,
                  "patience", fmt::format("\"{}\": must be in ep or ba", o.patience.str()));
          s.finish();
          return o;
        },
        core::construct<core::Callback, EarlyStopper, EarlyStopperOptions>());
    r->add(
        "threshold_stopper",
        [](config::Section& s) -> std::any {
          ThresholdStopperOptions o;
          o.metric = parse_monitored(s, {"monitor", "dataloader_label", "comp", "threshold", "stop_on_batch"});
          o.threshold = s.require_double("threshold");
          o.stop_on_batch = s.get_bool("stop_on_batch", o.stop_on_batch);
          s.finish();
          return o;
        },
        core::construct<core::Callback, ThresholdStopper, ThresholdStopperOptions>());
    r->add(
        "hf_checkpointer",
        [](config::Section& s) -> std::any {
          HfCheckpointerOptions o;
          o.save_folder = s.require_string("save_folder");
          o.save_interval = s.get_time("save_interval", o.save_interval, config::TimeUnit::kEpoch);
          s.check(o.save_interval.unit() == config::TimeUnit::kBatch ||
                      o.save_interval.unit() == config::TimeUnit::kEpoch ||
                      o.save_interval.unit() == config::TimeUnit::kDuration,
                  "save_interval", "must be in `ba`, `ep` or `dur`");
          s.check(!o.save_interval.is_zero(), "save_interval", "must be positive");
          o.huggingface_folder_name = s.get_string("huggingface_folder_name", o.huggingface_folder_name);
          o.precision = s.get_choice("precision", o.precision, {"float32", "bfloat16", "float16"});
          o.overwrite = s.get_bool("overwrite", o.overwrite);
          o.transformers_version = s.get_int("transformers_version", o.transformers_version);
          s.check(o.transformers_version == 4 || o.transformers_version == 5, "transformers_version",
                  "must be 4 or 5 (the transformers major version that loads the folder)");
          o.mlflow_registered_model_name = s.get_string("mlflow_registered_model_name", "");
          if (const config::Value* v = s.raw("mlflow_logging_config"); v != nullptr && !v->is_null()) {
            s.check(v->is_map(), "mlflow_logging_config", "expected a mapping (task, metadata)");
            o.mlflow_logging_config = v->to_json().dump();
          }
          s.finish({"flatten_imports", "final_register_only", "register_wait_seconds"});
          return o;
        },
        core::construct<core::Callback, HfCheckpointer, HfCheckpointerOptions>());
    // Pre-flight: the export folder can be written (rank 0 writes it).
    r->set_check("hf_checkpointer", [](const std::any& options, const config::CheckContext& c) -> config::Problems {
      const auto& o = std::any_cast<const HfCheckpointerOptions&>(options);
      if (c.rank != 0) return {};
      const std::string root = util::fill_path_pattern(o.save_folder, c.run_name, c.rank);
      if (auto why = storage::unwritable(root, c.probe_writes)) return {{"save_folder", *why}};
      return {};
    });
    r->add(
        "run_timeout",
        [](config::Section& s) -> std::any {
          RunTimeoutOptions o;
          o.timeout = s.get_double("timeout", o.timeout);
          s.check(o.timeout > 0, "timeout", "must be a positive number of seconds");
          s.finish();
          return o;
        },
        core::construct<core::Callback, RunTimeout, RunTimeoutOptions>());
    r->add(
        "scheduled_gc",
        [](config::Section& s) -> std::any {
          for (const std::string& key : s.keys()) s.raw(key);
          spdlog::warn(
              "callbacks.scheduled_gc: it schedules Python's garbage collector, which a C++ run does not "
              "have; Tessera does not use it");
          return {};
        },
        [](const std::any& /*options*/, const core::RunContext& /*run*/) -> std::shared_ptr<core::Callback> {
          return nullptr;
        });
    r->add_foundry_names({"checkpoint_saver",
                          "mono_checkpoint_saver",
                          "eval_gauntlet",
                          "curriculum_learning",
                          "kill_loss_spike",
                          "generate_callback",
                          "activation_monitor",
                          "nan_monitor",
                          "system_metrics_monitor",
                          "memory_snapshot",
                          "free_outputs",
                          "inactivity",
                          "async_eval",
                          "log_model_info",
                          "loss_perp_v_len",
                          "env_logging",
                          "load_checkpoint",
                          "fdiff",
                          "mlperf",
                          "image_visualizer",
                          "export_for_inference"});
    return r;
  }();
  return *registry;
}

}  // namespace tessera::callbacks
