// The optimizers' multi-tensor steps (one _fused_adamw_ / _foreach_* call over every fp32 parameter) against their
// update rules written out per tensor in double precision: Composer's DecoupledAdamW, torch.optim.AdamW, LLM Foundry's
// DecoupledLionW and Composer's DecoupledSGDW (tests/compat/test_training_pytorch.py compares whole training runs
// with the peers' own optimizers). For Lion and SGD a parameter without a gradient at a step stays as it is and its
// state starts with its first gradient, as in the peers.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "tessera/optim/optimizer.h"
#include "tessera/optim/options.h"

namespace optimizer_test {

using namespace tessera;

struct Reference {
  optim::OptimizerOptions o;
  std::vector<at::Tensor> m, v;  // per parameter, double; undefined until its first gradient

  void step(std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads, double lr, int64_t t) {
    const double b1 = o.betas.empty() ? 0 : o.betas[0], b2 = o.betas.empty() ? 0 : o.betas[1];
    const double decay_scale = o.lr != 0 ? lr / o.lr : 1.0;
    for (size_t i = 0; i < params.size(); ++i) {
      if (!grads[i].defined()) continue;
      at::Tensor& p = params[i];
      const at::Tensor& g = grads[i];
      const bool first = !m[i].defined();
      if (first) m[i] = at::zeros_like(p), v[i] = at::zeros_like(p);
      if (o.name == "decoupled_adamw" || o.name == "adamw") {
        p = p * (1.0 - (o.name == "adamw" ? lr : decay_scale) * o.weight_decay);
        m[i] = b1 * m[i] + (1 - b1) * g;
        v[i] = b2 * v[i] + (1 - b2) * g * g;
        const double bc1 = 1 - std::pow(b1, static_cast<double>(t)), bc2 = 1 - std::pow(b2, static_cast<double>(t));
        p = p - lr / bc1 * m[i] / (at::sqrt(v[i]) / std::sqrt(bc2) + o.eps);
      } else if (o.name == "decoupled_lionw") {
        p = p * (1.0 - decay_scale * o.weight_decay);
        p = p - lr * at::sign(b1 * m[i] + (1 - b1) * g);
        m[i] = b2 * m[i] + (1 - b2) * g;
      } else {  // decoupled_sgdw
        m[i] = first ? g.clone() : o.momentum * m[i] + (1 - o.dampening) * g;
        const at::Tensor d = o.nesterov ? g + o.momentum * m[i] : m[i];
        p = p * (1.0 - decay_scale * o.weight_decay);
        p = p - lr * d;
      }
    }
  }
};

optim::OptimizerOptions options(const std::string& name) {
  optim::OptimizerOptions o;
  o.name = name;
  o.lr = 1e-2;
  o.weight_decay = name == "adamw" ? 0.05 : 1e-3;
  if (name == "decoupled_adamw" || name == "adamw") o.betas = {0.9, 0.95};
  if (name == "decoupled_lionw") o.betas = {0.9, 0.99};
  if (name == "decoupled_sgdw") o.momentum = 0.9, o.nesterov = true;
  return o;
}

TEST(Optimizers, MultiTensorStepsFollowTheirUpdateRules) {
  std::vector<optim::OptimizerOptions> cases;
  for (const char* name : {"decoupled_adamw", "adamw", "decoupled_lionw", "decoupled_sgdw"})
    cases.push_back(options(name));
  optim::OptimizerOptions damped = options("decoupled_sgdw");
  damped.nesterov = false, damped.dampening = 0.1;
  cases.push_back(damped);
  for (const auto& o : cases) {
    SCOPED_TRACE(::testing::Message() << o.name << (o.dampening != 0 ? " with dampening" : ""));
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(21);
    std::vector<at::Tensor> params;
    for (const auto& shape : std::vector<std::vector<int64_t>>{{5, 7}, {11}, {3, 2, 2}}) {
      params.push_back(at::empty(shape).normal_(0, 1, gen).requires_grad_(true));
    }
    std::vector<at::Tensor> ref;
    for (const at::Tensor& p : params) ref.push_back(p.detach().to(at::kDouble));
    Reference r{o, std::vector<at::Tensor>(3), std::vector<at::Tensor>(3)};
    std::unique_ptr<optim::Optimizer> opt = optim::make_optimizer(o, params);
    for (int64_t t = 1; t <= 5; ++t) {
      opt->zero_grad();
      std::vector<at::Tensor> grads(3);
      for (size_t i = 0; i < params.size(); ++i) {
        // Lion's and SGD's state has no step count: the last parameter gets no gradient at the first two steps.
        const bool stateless_steps = o.name == "decoupled_lionw" || o.name == "decoupled_sgdw";
        if (i == 2 && t <= 2 && stateless_steps) continue;
        grads[i] = at::empty(params[i].sizes()).normal_(0, 0.1, gen);
        params[i].mutable_grad() = grads[i].clone();
        grads[i] = grads[i].to(at::kDouble);
      }
      const double lr = o.lr * (1.0 - 0.1 * static_cast<double>(t));  // a decaying schedule
      opt->step(lr);
      r.step(ref, grads, lr, t);
      for (size_t i = 0; i < params.size(); ++i) {
        const double err = (params[i].detach().to(at::kDouble) - ref[i]).abs().max().item<double>();
        EXPECT_LE(err, 1e-6) << "parameter " << i << " after step " << t;
      }
    }
  }
}

}  // namespace optimizer_test
