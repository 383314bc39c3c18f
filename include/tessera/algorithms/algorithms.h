// Built-in algorithms (registered by name for `algorithms:` in recipes; options in options.h).
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "tessera/algorithms/options.h"
#include "tessera/config/component.h"
#include "tessera/core/callback.h"
#include "tessera/models/causal_lm.h"

namespace tessera::algorithms {

// gradient_clipping, at AFTER_TRAIN_BATCH (gradients complete and unscaled):
//   norm:     scale all gradients by min(1, threshold / (global L2 norm + 1e-6)), the norm taken over every
//             parameter together (PyTorch's clip_grad_norm_);
//   value:    clamp every gradient element to [-threshold, threshold];
//   adaptive: AGC: per unit (row of a matrix, whole vector for biases and norms), scale the gradient by
//             min(1, threshold * ||w_unit|| / ||g_unit||).
class GradientClipping : public core::Algorithm {
 public:
  explicit GradientClipping(GradientClippingOptions o) : o_(std::move(o)) {}
  std::string name() const override { return "GradientClipping"; }
  bool match(core::Event event, const core::State& state) const override;
  void apply(core::Event event, core::State& state, core::Logger& logger) override;
  // The global L2 norm of the gradients before clipping, as of the last apply() (read from the device only when
  // asked: apply() itself does not wait for the GPU).
  double last_norm() const { return last_norm_.defined() ? last_norm_.item<double>() : 0.0; }

 private:
  GradientClippingOptions o_;
  at::Tensor last_norm_;
};

// alibi: at INIT, rebuilds the model with ALiBi attention (learned positions dropped, alibi_bias_max, max_seq_len =
// max_sequence_length) from the run's seed; at AFTER_DATALOADER, truncates training batches to
// int(T * train_sequence_length_scaling) tokens (Composer's default 0.25: train short, evaluate long).
class Alibi : public core::Algorithm {
 public:
  explicit Alibi(AlibiOptions o) : o_(std::move(o)) {}
  std::string name() const override { return "Alibi"; }
  bool match(core::Event event, const core::State& state) const override;
  void apply(core::Event event, core::State& state, core::Logger& logger) override;

 private:
  AlibiOptions o_;
};

// lora: at INIT, attaches adapters (A: r x in, uniform(+-1/sqrt(in)) as PEFT's kaiming init; B: out x r, zeros;
// scale lora_alpha / r; dropout on the adapter's input) to every Linear whose module name ends with one of
// target_modules, and freezes every other parameter (the optimizer, created after INIT, sees only the adapters; the
// sharding engine keeps the frozen weights whole on every rank, outside its flat shards). At FIT_END with save_path,
// rank 0 writes the adapters in PEFT's layout (adapter_model.safetensors, adapter_config.json). Needs the model built
// on a device (not init_device: meta under FSDP).
class Lora : public core::Algorithm {
 public:
  explicit Lora(LoraOptions o) : o_(std::move(o)) {}
  std::string name() const override { return "Lora"; }
  bool match(core::Event event, const core::State& state) const override;
  void apply(core::Event event, core::State& state, core::Logger& logger) override;

 private:
  LoraOptions o_;
};

// Attaches LoRA adapters (see Lora); returns the names of the adapted modules. Throws when none matches.
std::vector<std::string> attach_lora(models::CausalLM& model, const LoraOptions& o, uint64_t seed);
// Folds every adapter into its base weight (W += scale * B A) and removes it: the model then computes exactly what
// the adapted model computed (up to rounding) and exports as the plain model.
void merge_lora(models::CausalLM& model);
// Writes the adapters among `weights` (named like the model's parameters) only: dir/adapter_model.safetensors
// ("base_model.model.<module>.lora_{A,B}.weight") and dir/adapter_config.json (peft_type LORA, r, lora_alpha,
// lora_dropout, target_modules).
void save_lora_adapters(const std::vector<std::pair<std::string, at::Tensor>>& weights, const LoraOptions& o,
                        const std::string& dir);

// ema: an exponential moving average of the weights, ema = s * ema + (1 - s) * w, updated every update_interval
// (ba: at BATCH_END; ep: at EPOCH_END) from ema_start on, with s = smoothing or 2^(-update_interval / half_life). The
// averaged weights replace the model's during evaluation (swapped at EVAL_START, back at EVAL_END).
class Ema : public core::Algorithm {
 public:
  explicit Ema(EmaOptions o);
  std::string name() const override { return "EMA"; }
  bool match(core::Event event, const core::State& state) const override;
  void apply(core::Event event, core::State& state, core::Logger& logger) override;
  double smoothing() const { return smoothing_; }
  // The averaged weights, in model.parameters() order; empty before ema_start.
  const std::vector<at::Tensor>& weights() const { return ema_; }
  // Checkpoints keep the averaged weights (sharded like the parameters).
  std::optional<core::ComponentState> state_dict(const core::State& state) const override;
  void load_state_dict(const core::ComponentState& saved, core::State& state) override;

 private:
  void swap(core::State& state);
  EmaOptions o_;
  double smoothing_;
  std::vector<at::Tensor> ema_;
  bool swapped_ = false;
};

// low_precision_layernorm: at INIT, every LayerNorm / RMSNorm of the model becomes its low-precision variant (runs in
// the autocast dtype with autocast disabled, as LLM Foundry's LPLayerNorm); without autocast nothing changes.
class LowPrecisionLayerNorm : public core::Algorithm {
 public:
  std::string name() const override { return "LowPrecisionLayerNorm"; }
  bool match(core::Event event, const core::State& state) const override;
  void apply(core::Event event, core::State& state, core::Logger& logger) override;
};

// seq_length_warmup: at AFTER_DATALOADER during the first `duration` of training (in batches), truncates the batch to
// min_seq_length + step_size * (batch / update_every), update_every = warmup batches / ((max - min) / step_size),
// capped at max_seq_length, as Composer's SeqLengthWarmup (truncate=True) does.
class SeqLengthWarmup : public core::Algorithm {
 public:
  explicit SeqLengthWarmup(SeqLengthWarmupOptions o) : o_(std::move(o)) {}
  std::string name() const override { return "SeqLengthWarmup"; }
  bool match(core::Event event, const core::State& state) const override;
  void apply(core::Event event, core::State& state, core::Logger& logger) override;
  // The sequence length for the batch at `batch` of a run of `total_batches`.
  int64_t length_at(int64_t batch, int64_t total_batches) const;

 private:
  SeqLengthWarmupOptions o_;
};

// loss_spike_detection, at AFTER_TRAIN_BATCH (the step's loss known, the optimizer step not taken yet): a non-finite
// loss, or `patience` consecutive losses above outlier_multiplier x the mean of the recent normal ones, triggers the
// response: skip (this batch's optimizer step is not taken), rollback (the step is not taken and the model and
// optimizer are restored from the newest checkpoint; time and data go on, so the batches since that checkpoint are
// not replayed) or stop (the step is not taken and training stops). Each detection is logged as a warning and as
// the metric loss_spike/detected. Spikes do not enter the window. The window is checkpointed.
class LossSpikeDetection : public core::Algorithm {
 public:
  explicit LossSpikeDetection(LossSpikeOptions o) : o_(std::move(o)) {}
  std::string name() const override { return "LossSpikeDetection"; }
  bool match(core::Event event, const core::State& state) const override;
  void apply(core::Event event, core::State& state, core::Logger& logger) override;
  std::optional<core::ComponentState> state_dict(const core::State& state) const override;
  void load_state_dict(const core::ComponentState& saved, core::State& state) override;

 private:
  LossSpikeOptions o_;
  std::deque<double> window_;
  int64_t consecutive_ = 0;
};

}  // namespace tessera::algorithms
