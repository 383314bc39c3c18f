// DecoupledAdamW, AdamW, DecoupledLionW and DecoupledSGDW: the update rules of Composer
// (composer/optim/decoupled_weight_decay.py), LLM Foundry (llmfoundry/optim/lion.py) and PyTorch (torch.optim.AdamW),
// with the same operation order so that results agree to rounding.
#include "tessera/optim/optimizer.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/_foreach_lerp.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_sign.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/full.h>
#include <fmt/format.h>

#include <cmath>
#include <map>
#include <optional>

#include "tessera/util/error.h"

namespace tessera::optim {
namespace {

// The indices of the parameters with a gradient, when all of them are dense fp32 (what the multi-tensor kernels
// update in place); nullopt otherwise (then update() runs per parameter).
std::optional<std::vector<size_t>> dense_fp32_with_grads(const std::vector<at::Tensor>& params) {
  std::vector<size_t> out;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    if (!p.grad().defined()) continue;
    if (p.scalar_type() != at::kFloat || p.grad().scalar_type() != at::kFloat || p.is_sparse()) return std::nullopt;
    out.push_back(i);
  }
  return out;
}

class Adam : public Optimizer {
 public:
  Adam(OptimizerOptions o, std::vector<at::Tensor> p, bool decoupled)
      : Optimizer(std::move(o), std::move(p)), decoupled_(decoupled) {}

 protected:
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }

  // All fp32 parameters in one call of ATen's fused AdamW kernel (PyTorch's `fused=True` path): one pass over each
  // tensor instead of five allocating ops. The math is update()'s; decoupled decay is applied first, as there.
  bool update_all(double lr) override {
    const auto index = dense_fp32_with_grads(params_);
    if (!index) return false;
    if (index->empty()) return true;
    std::vector<at::Tensor> params, grads, ms, vs;
    for (const size_t i : *index) {
      const at::Tensor& p = params_[i];
      params.push_back(p);
      grads.push_back(p.grad());
      ms.push_back(slot(i, 0));
      vs.push_back(slot(i, 1));
    }
    // The kernel only reads the step count: one tensor serves every parameter (one fill, not one each).
    const at::Tensor step = at::full({}, static_cast<double>(step_), params.front().options().dtype(at::kFloat));
    const std::vector<at::Tensor> steps(params.size(), step);
    double weight_decay = 0;
    if (o_.weight_decay != 0) {
      if (decoupled_) {
        at::_foreach_mul_(params, 1.0 - (o_.lr != 0 ? lr / o_.lr : 1.0) * o_.weight_decay);
      } else {
        weight_decay = o_.weight_decay;  // the kernel multiplies by 1 - lr * weight_decay, as torch.optim.AdamW
      }
    }
    at::_fused_adamw_(params, grads, ms, vs, {}, steps, lr, o_.betas.at(0), o_.betas.at(1), weight_decay, o_.eps,
                      /*amsgrad=*/false, /*maximize=*/false);
    return true;
  }

  void update(size_t i, at::Tensor& param, const at::Tensor& grad, double lr) override {
    const double beta1 = o_.betas.at(0);
    const double beta2 = o_.betas.at(1);
    if (o_.weight_decay != 0) {
      const double factor = decoupled_ ? (o_.lr != 0 ? lr / o_.lr : 1.0) * o_.weight_decay : lr * o_.weight_decay;
      param.mul_(1.0 - factor);
    }
    at::Tensor& m = slot(i, 0);
    at::Tensor& v = slot(i, 1);
    m.lerp_(grad, 1.0 - beta1);
    v.mul_(beta2).addcmul_(grad, grad, 1.0 - beta2);
    const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step_));
    const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step_));
    at::Tensor denom = (v.sqrt() / std::sqrt(bc2)).add_(o_.eps);
    param.addcdiv_(m, denom, -lr / bc1);
  }

 private:
  bool decoupled_;
};

class Lion : public Optimizer {
 public:
  using Optimizer::Optimizer;

 protected:
  std::vector<std::string> state_names() const override { return {"exp_avg"}; }
  // update()'s four steps, each one multi-tensor call over every parameter.
  bool update_all(double lr) override {
    const auto index = dense_fp32_with_grads(params_);
    if (!index) return false;
    if (index->empty()) return true;
    std::vector<at::Tensor> params, grads, ms;
    for (const size_t i : *index) {
      params.push_back(params_[i]);
      grads.push_back(params_[i].grad());
      ms.push_back(slot(i, 0));
    }
    if (o_.weight_decay != 0) at::_foreach_mul_(params, 1.0 - (o_.lr != 0 ? lr / o_.lr : 1.0) * o_.weight_decay);
    std::vector<at::Tensor> direction = at::_foreach_lerp(ms, grads, 1.0 - o_.betas.at(0));
    at::_foreach_sign_(direction);
    at::_foreach_add_(params, direction, -lr);
    at::_foreach_lerp_(ms, grads, 1.0 - o_.betas.at(1));
    return true;
  }
  void update(size_t i, at::Tensor& param, const at::Tensor& grad, double lr) override {
    if (o_.weight_decay != 0) param.mul_(1.0 - (o_.lr != 0 ? lr / o_.lr : 1.0) * o_.weight_decay);
    at::Tensor& m = slot(i, 0);
    param.add_(m.lerp(grad, 1.0 - o_.betas.at(0)).sign_(), -lr);
    m.lerp_(grad, 1.0 - o_.betas.at(1));
  }
};

class SGDW : public Optimizer {
 public:
  using Optimizer::Optimizer;

 protected:
  std::vector<std::string> state_names() const override {
    return o_.momentum != 0 ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{};
  }
  // update() as multi-tensor calls: buffers that start copy their first gradient, the others decay and accumulate.
  bool update_all(double lr) override {
    const auto index = dense_fp32_with_grads(params_);
    if (!index) return false;
    if (index->empty()) return true;
    std::vector<at::Tensor> params, grads, bufs, new_bufs, new_grads, old_bufs, old_grads;
    for (const size_t i : *index) {
      params.push_back(params_[i]);
      grads.push_back(params_[i].grad());
      if (o_.momentum == 0) continue;
      const bool first = slots_[i].empty();
      bufs.push_back(slot(i, 0));
      (first ? new_bufs : old_bufs).push_back(bufs.back());
      (first ? new_grads : old_grads).push_back(grads.back());
    }
    std::vector<at::Tensor> direction = grads;
    if (o_.momentum != 0) {
      if (!new_bufs.empty()) at::_foreach_copy_(new_bufs, new_grads);
      if (!old_bufs.empty()) {
        at::_foreach_mul_(old_bufs, o_.momentum);
        at::_foreach_add_(old_bufs, old_grads, 1.0 - o_.dampening);
      }
      direction = o_.nesterov ? at::_foreach_add(grads, bufs, o_.momentum) : bufs;
    }
    if (o_.weight_decay != 0) at::_foreach_mul_(params, 1.0 - (o_.lr != 0 ? lr / o_.lr : 1.0) * o_.weight_decay);
    at::_foreach_add_(params, direction, -lr);
    return true;
  }
  void update(size_t i, at::Tensor& param, const at::Tensor& grad, double lr) override {
    at::Tensor d = grad;
    if (o_.momentum != 0) {
      const bool first = slots_[i].empty();
      at::Tensor& buf = slot(i, 0);
      if (first) {
        buf.copy_(grad);  // PyTorch starts the buffer at the first gradient
      } else {
        buf.mul_(o_.momentum).add_(grad, 1.0 - o_.dampening);
      }
      d = o_.nesterov ? grad.add(buf, o_.momentum) : buf;
    }
    if (o_.weight_decay != 0) param.mul_(1.0 - (o_.lr != 0 ? lr / o_.lr : 1.0) * o_.weight_decay);
    param.add_(d, -lr);
  }
};

}  // namespace

Optimizer::Optimizer(OptimizerOptions options, std::vector<at::Tensor> params)
    : o_(std::move(options)), params_(std::move(params)), slots_(params_.size()), last_lr_(o_.lr) {}

at::Tensor& Optimizer::slot(size_t i, size_t k) {
  auto& s = slots_[i];
  if (s.empty()) {
    for (size_t j = 0; j < state_names().size(); ++j) {
      s.push_back(at::zeros_like(params_[i], params_[i].options().dtype(at::kFloat)));
    }
  }
  return s.at(k);
}

void Optimizer::step(double lr) {
  at::NoGradGuard no_grad;
  ++step_;
  last_lr_ = lr;
  if (update_all(lr)) return;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i];
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    if (p.scalar_type() == at::kFloat) {
      update(i, p, g, lr);
    } else {
      // Low-precision parameters: update an fp32 copy and round back (state stays fp32).
      at::Tensor master = p.to(at::kFloat);
      update(i, master, g.to(at::kFloat), lr);
      p.copy_(master);
    }
  }
}

void Optimizer::zero_grad() {
  for (at::Tensor& p : params_) {
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
  }
}

std::vector<std::pair<std::string, at::Tensor>> Optimizer::state() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.emplace_back("step", at::scalar_tensor(step_, at::kLong));
  const auto names = state_names();
  for (size_t i = 0; i < slots_.size(); ++i) {
    for (size_t k = 0; k < slots_[i].size(); ++k) out.emplace_back(fmt::format("{}.{}", i, names[k]), slots_[i][k]);
  }
  return out;
}

void Optimizer::load_state(const std::vector<std::pair<std::string, at::Tensor>>& state) {
  std::map<std::string, at::Tensor> by_name(state.begin(), state.end());
  auto take = [&](const std::string& key) -> const at::Tensor& {
    auto it = by_name.find(key);
    if (it == by_name.end()) throw Error("optimizer state", fmt::format("missing entry `{}`", key));
    return it->second;
  };
  at::NoGradGuard no_grad;
  const int64_t step = take("step").item<int64_t>();
  const auto names = state_names();
  for (size_t i = 0; i < params_.size() && step > 0; ++i) {
    for (size_t k = 0; k < names.size(); ++k) {
      const std::string key = fmt::format("{}.{}", i, names[k]);
      const at::Tensor& t = take(key);
      if (t.sizes() != params_[i].sizes()) {
        throw Error("optimizer state", fmt::format("`{}` has shape {} but the parameter has {}", key,
                                                   fmt::join(t.sizes(), "x"), fmt::join(params_[i].sizes(), "x")));
      }
      slot(i, k).copy_(t);
    }
  }
  step_ = step;
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options, const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> trainable;
  for (const at::Tensor& p : params) {
    if (p.requires_grad()) trainable.push_back(p);
  }
  return optimizer_registry().build(options.name, options, std::move(trainable));
}

namespace detail {

std::unique_ptr<Optimizer> make_adam(const OptimizerOptions& options, std::vector<at::Tensor> params, bool decoupled) {
  return std::make_unique<Adam>(options, std::move(params), decoupled);
}
std::unique_ptr<Optimizer> make_lion(const OptimizerOptions& options, std::vector<at::Tensor> params) {
  return std::make_unique<Lion>(options, std::move(params));
}
std::unique_ptr<Optimizer> make_sgdw(const OptimizerOptions& options, std::vector<at::Tensor> params) {
  return std::make_unique<SGDW>(options, std::move(params));
}

}  // namespace detail

}  // namespace tessera::optim
