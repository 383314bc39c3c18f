// The algorithm registry: option schemas and builders.
#include "tessera/algorithms/options.h"

#include "tessera/algorithms/algorithms.h"

namespace tessera::algorithms {

core::AlgorithmRegistry& algorithm_registry() {
  static core::AlgorithmRegistry* registry = [] {
    auto* r = new core::AlgorithmRegistry("algorithm");
    r->add(
        "gradient_clipping",
        [](config::Section& s) -> std::any {
          GradientClippingOptions o;
          o.clipping_type = s.get_choice("clipping_type", o.clipping_type, {"norm", "value", "adaptive"});
          o.clipping_threshold = s.require_double("clipping_threshold");
          s.check(o.clipping_threshold > 0, "clipping_threshold", "must be positive");
          s.finish();
          return o;
        },
        core::construct<core::Algorithm, GradientClipping, GradientClippingOptions>());
    r->add(
        "alibi",
        [](config::Section& s) -> std::any {
          AlibiOptions o;
          o.alibi_bias_max = s.get_double("alibi_bias_max", o.alibi_bias_max);
          s.check(o.alibi_bias_max > 0, "alibi_bias_max", "must be positive");
          o.max_sequence_length = s.get_optional_int("max_sequence_length");
          s.check(!o.max_sequence_length || *o.max_sequence_length > 0, "max_sequence_length", "must be positive");
          o.train_sequence_length_scaling =
              s.get_double("train_sequence_length_scaling", o.train_sequence_length_scaling);
          s.check(o.train_sequence_length_scaling > 0 && o.train_sequence_length_scaling <= 1,
                  "train_sequence_length_scaling", "must lie in (0, 1]");
          s.finish();
          return o;
        },
        core::construct<core::Algorithm, Alibi, AlibiOptions>());
    r->add(
        "lora",
        [](config::Section& s) -> std::any {
          LoraOptions o;
          o.r = s.get_int("r", o.r);
          s.check(o.r > 0, "r", "must be positive");
          o.lora_alpha = s.get_double("lora_alpha", o.lora_alpha);
          o.lora_dropout = s.get_double("lora_dropout", o.lora_dropout);
          s.check(o.lora_dropout >= 0 && o.lora_dropout < 1, "lora_dropout", "must lie in [0, 1)");
          o.target_modules = s.get_strings("target_modules", o.target_modules);
          s.check(!o.target_modules.empty(), "target_modules", "must name at least one module");
          o.save_path = s.get_optional_string("save_path");
          s.finish();
          return o;
        },
        core::construct<core::Algorithm, Lora, LoraOptions>());
    r->add(
        "ema",
        [](config::Section& s) -> std::any {
          EmaOptions o;
          o.half_life = s.get_time("half_life", o.half_life, config::TimeUnit::kBatch);
          o.smoothing = s.get_optional_double("smoothing");
          s.check(!o.smoothing || (*o.smoothing >= 0 && *o.smoothing <= 1), "smoothing", "must lie in [0, 1]");
          o.ema_start = s.get_time("ema_start", o.ema_start, config::TimeUnit::kBatch);
          if (s.has("update_interval")) o.update_interval = s.require_time("update_interval", config::TimeUnit::kBatch);
          const config::TimeUnit unit = o.update_interval ? o.update_interval->unit() : o.half_life.unit();
          s.check(unit == config::TimeUnit::kBatch || unit == config::TimeUnit::kEpoch, "update_interval",
                  "must be in ba or ep");
          s.check(o.half_life.unit() == unit, "half_life", "must be in the unit of update_interval (ba or ep)");
          s.check(o.smoothing || !o.half_life.is_zero(), "half_life", "must be positive");
          s.finish();
          return o;
        },
        core::construct<core::Algorithm, Ema, EmaOptions>());
    r->add(
        "low_precision_layernorm",
        [](config::Section& s) -> std::any {
          s.get_choice("apply_at", "init", {"init"});  // Composer also allows before_load and after_load
          s.finish();
          return LowPrecisionLayerNormOptions{};
        },
        core::construct<core::Algorithm, LowPrecisionLayerNorm>());
    r->add(
        "seq_length_warmup",
        [](config::Section& s) -> std::any {
          SeqLengthWarmupOptions o;
          o.duration = s.get_double("duration", o.duration);
          s.check(o.duration >= 0 && o.duration <= 1, "duration", "must lie in [0, 1]");
          o.min_seq_length = s.get_int("min_seq_length", o.min_seq_length);
          o.max_seq_length = s.get_int("max_seq_length", o.max_seq_length);
          o.step_size = s.get_int("step_size", o.step_size);
          s.check(o.min_seq_length > 0, "min_seq_length", "must be positive");
          s.check(o.max_seq_length >= o.min_seq_length, "max_seq_length", "must be at least min_seq_length");
          s.check(o.step_size > 0, "step_size", "must be positive");
          if (!s.get_bool("truncate", true)) s.not_supported("truncate", "false");
          if (s.get_bool("preserve_end_of_sequence", false)) s.not_supported("preserve_end_of_sequence", "true");
          s.finish();
          return o;
        },
        core::construct<core::Algorithm, SeqLengthWarmup, SeqLengthWarmupOptions>());
    r->add(
        "loss_spike_detection",
        [](config::Section& s) -> std::any {
          LossSpikeOptions o;
          o.window_size = s.get_int("window_size", o.window_size);
          o.outlier_multiplier = s.get_double("outlier_multiplier", o.outlier_multiplier);
          o.min_history = s.get_int("min_history", o.min_history);
          o.patience = s.get_int("patience", o.patience);
          o.response = s.get_choice("response", o.response, {"skip", "rollback", "stop"});
          s.check(o.window_size > 0, "window_size", "must be positive");
          s.check(o.outlier_multiplier > 1, "outlier_multiplier", "must be above 1");
          s.check(o.min_history > 0 && o.min_history <= o.window_size, "min_history", "must lie in [1, window_size]");
          s.check(o.patience > 0, "patience", "must be positive");
          s.finish();
          return o;
        },
        core::construct<core::Algorithm, LossSpikeDetection, LossSpikeOptions>());
    r->add_foundry_names({"gated_linear_units", "layer_freezing", "sam", "swa", "selective_backprop", "label_smoothing",
                          "factorize", "stochastic_depth", "low_precision_groupnorm", "gyro_dropout",
                          "fused_layernorm"});
    return r;
  }();
  return *registry;
}

}  // namespace tessera::algorithms
