// Built-in algorithms.
#include "tessera/algorithms/algorithms.h"

#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <cmath>
#include <numeric>

#include "tessera/trainer/state.h"
#include "tessera/util/error.h"

namespace tessera::algorithms {
namespace {

// L2 norm per unit: the whole tensor for 0-d/1-d, else per row over the remaining dimensions (keepdim).
at::Tensor unitwise_norm(const at::Tensor& t) {
  if (t.dim() <= 1) return at::linalg_vector_norm(t.to(at::kFloat), 2);
  std::vector<int64_t> dims(static_cast<size_t>(t.dim() - 1));
  std::iota(dims.begin(), dims.end(), 1);
  return at::linalg_vector_norm(t.to(at::kFloat), 2, dims, /*keepdim=*/true);
}

}  // namespace

bool GradientClipping::match(trainer::Event event, const trainer::State& /*state*/) const {
  return event == trainer::Event::kAfterTrainBatch;
}

void GradientClipping::apply(trainer::Event /*event*/, trainer::State& state, trainer::Logger& /*logger*/) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> params;
  for (const at::Tensor& p : state.trainable_parameters()) {
    if (p.grad().defined()) params.push_back(p);
  }
  if (params.empty()) return;
  const double thr = o_.clipping_threshold;
  if (o_.clipping_type == "norm") {
    std::vector<at::Tensor> norms;
    norms.reserve(params.size());
    for (const at::Tensor& p : params) norms.push_back(at::linalg_vector_norm(p.grad().to(at::kFloat), 2));
    const at::Tensor total = at::linalg_vector_norm(at::stack(norms), 2);
    last_norm_ = total.item<double>();
    const at::Tensor coef = at::clamp_max(thr / (total + 1e-6), 1.0);
    for (at::Tensor& p : params) p.mutable_grad().mul_(coef.to(p.grad().scalar_type()));
  } else if (o_.clipping_type == "value") {
    for (at::Tensor& p : params) p.mutable_grad().clamp_(-thr, thr);
  } else {  // adaptive
    for (at::Tensor& p : params) {
      const at::Tensor g_norm = unitwise_norm(p.grad());
      const at::Tensor max_norm = unitwise_norm(p) * thr;
      const at::Tensor coef = at::clamp_max(at::nan_to_num(max_norm / g_norm, 1.0), 1.0);
      p.mutable_grad().mul_(coef.to(p.grad().scalar_type()));
    }
  }
}

std::shared_ptr<trainer::Algorithm> make_algorithm(const config::ComponentOptions& c,
                                                   const trainer::TrainConfig& /*cfg*/) {
  if (c.name == "gradient_clipping") {
    return std::make_shared<GradientClipping>(std::any_cast<GradientClippingOptions>(c.options));
  }
  throw ConfigError("algorithms", fmt::format("algorithm `{}` has no implementation", c.name));
}

}  // namespace tessera::algorithms
