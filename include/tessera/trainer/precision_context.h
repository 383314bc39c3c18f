// What the training loop does for its precision: autocast around forward and loss, and amp_fp16's dynamic loss
// scaling. Neither is thread-safe.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "tessera/core/precision.h"
#include "tessera/distributed/communicator.h"

namespace tessera::trainer {

// Autocast of the forward and the loss in `precision` on `device` for the guard's lifetime (backward runs outside,
// as in Composer's get_precision_context); nothing for fp32. Restores the previous autocast state.
class AutocastGuard {
 public:
  AutocastGuard(core::Precision precision, at::DeviceType device);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  at::DeviceType device_;
  bool active_ = false;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kFloat;
};

// amp_fp16's dynamic loss scaling, with PyTorch GradScaler's defaults: the loss is multiplied by the scale (65536 at
// first) before backward; the gradients are divided by it before AFTER_TRAIN_BATCH; a step whose gradients hold an
// inf or nan on any rank is skipped and halves the scale; 2000 steps in a row without one double it. Disabled (every
// other precision), it changes nothing.
class LossScaler {
 public:
  explicit LossScaler(bool enabled) : enabled_(enabled) {}
  bool enabled() const { return enabled_; }
  // loss * scale (the loss itself when disabled).
  at::Tensor scale(const at::Tensor& loss) const { return enabled_ ? loss * scale_ : loss; }
  // Divides the gradients of `params` by the scale and returns whether any rank's hold an inf or nan (one collective
  // over `comm`: every rank calls it). False when disabled.
  bool unscale(const std::vector<at::Tensor>& params, dist::Communicator& comm, const at::Device& device);
  // After the step: halves the scale after an overflow, doubles it after 2000 clean steps.
  void update(bool overflow);

  double loss_scale() const { return scale_; }
  int64_t good_steps() const { return good_steps_; }
  // Restores the state a checkpoint kept.
  void restore(double loss_scale, int64_t good_steps) {
    scale_ = loss_scale;
    good_steps_ = good_steps;
  }

 private:
  bool enabled_;
  double scale_ = 65536.0;
  int64_t good_steps_ = 0;  // steps since the scale last changed
};

}  // namespace tessera::trainer
