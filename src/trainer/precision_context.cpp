// Autocast and dynamic loss scaling for the training loop.
#include "tessera/trainer/precision_context.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>

namespace tessera::trainer {

AutocastGuard::AutocastGuard(core::Precision precision, at::DeviceType device) : device_(device) {
  if (precision == core::Precision::kFp32) return;
  prev_enabled_ = at::autocast::is_autocast_enabled(device);
  prev_dtype_ = at::autocast::get_autocast_dtype(device);
  at::autocast::set_autocast_enabled(device, true);
  at::autocast::set_autocast_dtype(device, core::autocast_dtype(precision));
  at::autocast::increment_nesting();
  active_ = true;
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_, prev_enabled_);
  at::autocast::set_autocast_dtype(device_, prev_dtype_);
}

bool LossScaler::unscale(const std::vector<at::Tensor>& params, dist::Communicator& comm, const at::Device& device) {
  if (!enabled_) return false;
  bool overflow = false;
  {
    at::NoGradGuard no_grad;
    for (const at::Tensor& p : params) {
      if (!p.grad().defined()) continue;
      const at::Tensor& g = p.grad();
      g.div_(scale_);
      if (!at::isfinite(g).all().item<bool>()) overflow = true;
    }
  }
  // Every rank skips the step, or none.
  at::Tensor t = at::full({1}, overflow ? 1.0 : 0.0, at::TensorOptions().device(device));
  comm.all_reduce(t, dist::ReduceOp::kMax).wait();
  return t.item<double>() > 0;
}

void LossScaler::update(bool overflow) {
  if (!enabled_) return;
  if (overflow) {
    scale_ *= 0.5;
    good_steps_ = 0;
  } else if (++good_steps_ == 2000) {
    scale_ *= 2.0;
    good_steps_ = 0;
  }
}

}  // namespace tessera::trainer
