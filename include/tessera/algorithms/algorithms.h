// Built-in algorithms (registered by name for `algorithms:` in recipes; options in options.h).
#pragma once

#include <memory>

#include "tessera/algorithms/options.h"
#include "tessera/config/component.h"
#include "tessera/trainer/callback.h"
#include "tessera/trainer/train_config.h"

namespace tessera::algorithms {

// gradient_clipping, at AFTER_TRAIN_BATCH (gradients complete and unscaled):
//   norm:     scale all gradients by min(1, threshold / (global L2 norm + 1e-6)), the norm taken over every
//             parameter together (PyTorch's clip_grad_norm_);
//   value:    clamp every gradient element to [-threshold, threshold];
//   adaptive: AGC: per unit (row of a matrix, whole vector for biases and norms), scale the gradient by
//             min(1, threshold * ||w_unit|| / ||g_unit||).
class GradientClipping : public trainer::Algorithm {
 public:
  explicit GradientClipping(GradientClippingOptions o) : o_(std::move(o)) {}
  std::string name() const override { return "GradientClipping"; }
  bool match(trainer::Event event, const trainer::State& state) const override;
  void apply(trainer::Event event, trainer::State& state, trainer::Logger& logger) override;
  // The global L2 norm of the gradients before clipping, as of the last apply().
  double last_norm() const { return last_norm_; }

 private:
  GradientClippingOptions o_;
  double last_norm_ = 0;
};

// Builds a registered algorithm from its parsed options.
std::shared_ptr<trainer::Algorithm> make_algorithm(const config::ComponentOptions& c, const trainer::TrainConfig& cfg);

}  // namespace tessera::algorithms
