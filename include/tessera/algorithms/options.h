// Options of the training algorithms a recipe can list under `algorithms:`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/config/component.h"
#include "tessera/config/time.h"
#include "tessera/core/callback.h"

namespace tessera::algorithms {

struct GradientClippingOptions {
  std::string clipping_type = "norm";  // norm (global L2 norm) | value | adaptive (AGC)
  double clipping_threshold = 1.0;
};

// Composer's Alibi: switch MPT to ALiBi attention (learned positions dropped) at INIT; train on sequences truncated
// to train_sequence_length_scaling of their length; evaluate up to max_sequence_length.
struct AlibiOptions {
  double alibi_bias_max = 8.0;
  std::optional<int64_t> max_sequence_length;  // default: the model's max_seq_len
  double train_sequence_length_scaling = 0.25;
};

// LoRA adapters on the Linear modules whose name ends with one of target_modules; base weights frozen.
struct LoraOptions {
  int64_t r = 8;
  double lora_alpha = 16;
  double lora_dropout = 0.05;
  std::vector<std::string> target_modules = {"Wqkv"};
  std::optional<std::string> save_path;  // at FIT_END: adapters only, PEFT's layout
};

// Composer's EMA of the weights, swapped in for evaluation.
struct EmaOptions {
  config::Time half_life{1000, config::TimeUnit::kBatch};
  std::optional<double> smoothing;  // default 2^(-update_interval / half_life)
  config::Time ema_start{0, config::TimeUnit::kDuration};
  std::optional<config::Time> update_interval;  // default: 1 in half_life's unit
};

// Composer's LowPrecisionLayerNorm: norms run in the autocast dtype (apply_at: init).
struct LowPrecisionLayerNormOptions {};

// Composer's SeqLengthWarmup (truncating variant).
struct SeqLengthWarmupOptions {
  double duration = 0.3;
  int64_t min_seq_length = 8;
  int64_t max_seq_length = 1024;
  int64_t step_size = 8;
};

// Loss-spike and NaN detection: a loss above outlier_multiplier x the mean of the last window_size normal losses (once
// min_history are known), `patience` batches in a row, or any non-finite loss, triggers `response`.
struct LossSpikeOptions {
  int64_t window_size = 100;
  double outlier_multiplier = 2.0;
  int64_t min_history = 10;
  int64_t patience = 1;
  std::string response = "skip";  // skip (no optimizer step) | rollback (to the newest checkpoint) | stop
};

// Registered: gradient_clipping, alibi, lora, ema, low_precision_layernorm, seq_length_warmup, loss_spike_detection.
// Composer's and LLM Foundry's other names are known and reported as not supported yet.
core::AlgorithmRegistry& algorithm_registry();

}  // namespace tessera::algorithms
