// Callback option schemas.
#include "tessera/callbacks/options.h"

namespace tessera::callbacks {

config::ComponentRegistry& callback_registry() {
  static config::ComponentRegistry* registry = [] {
    auto* r = new config::ComponentRegistry("callback");
    r->add("speed_monitor", [](config::Section& s) -> std::any {
      SpeedMonitorOptions o;
      o.window_size = s.get_int("window_size", o.window_size);
      s.check(o.window_size > 0, "window_size", "must be positive");
      o.gpu_flops_available = s.get_optional_double("gpu_flops_available");
      s.check(!o.gpu_flops_available || *o.gpu_flops_available > 0, "gpu_flops_available", "must be positive");
      o.time_unit = s.get_choice("time_unit", o.time_unit, {"seconds", "minutes", "hours", "days"});
      s.finish();
      return o;
    });
    r->add("runtime_estimator", [](config::Section& s) -> std::any {
      RuntimeEstimatorOptions o;
      o.skip_batches = s.get_int("skip_batches", o.skip_batches);
      s.check(o.skip_batches >= 0, "skip_batches", "must be non-negative");
      o.time_unit = s.get_choice("time_unit", o.time_unit, {"seconds", "minutes", "hours", "days"});
      s.finish();
      return o;
    });
    r->add("lr_monitor", [](config::Section& s) -> std::any {
      s.finish();
      return LRMonitorOptions{};
    });
    r->add("memory_monitor", [](config::Section& s) -> std::any {
      s.finish({"memory_keys", "dist_aggregate_batch_interval"});
      return MemoryMonitorOptions{};
    });
    r->add_foundry_names({"optimizer_monitor",
                          "early_stopper",
                          "threshold_stopper",
                          "checkpoint_saver",
                          "hf_checkpointer",
                          "mono_checkpoint_saver",
                          "eval_gauntlet",
                          "curriculum_learning",
                          "scheduled_gc",
                          "kill_loss_spike",
                          "generate_callback",
                          "activation_monitor",
                          "nan_monitor",
                          "system_metrics_monitor",
                          "oom_observer",
                          "memory_snapshot",
                          "free_outputs",
                          "inactivity",
                          "run_timeout",
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
