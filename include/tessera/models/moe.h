// Mixture-of-experts feed-forward layers: a learned top-k router and a set of expert MLPs, computed as MegaBlocks'
// dMoE and LLM Foundry's torch_dmoe compute them (llmfoundry/models/layers/dmoe.py, megablocks/layers/{router,moe,
// dmoe}.py), with MegaBlocks' load-balancing loss and router z-loss. The parameter names are theirs:
// router.layer.weight (E, d), experts.mlp.w1 / v1 / w2 (E * F, d), experts.bias (d; MegaBlocks with biases only).
//
// Tokens are grouped by expert (a stable sort of the token-expert pairs) and every expert's GEMM runs as one grouped
// GEMM per projection (at::_grouped_mm) where the shapes allow it, else as one GEMM per expert over its contiguous
// rows: no loop over tokens.
//
// Auxiliary losses reach the gradient through the layer's own output (MoEAuxLoss below), so that they flow through
// whatever runs the layer (the sharding engine's units, activation checkpointing) like the main loss does.
// Modules are not thread-safe.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/models/layers.h"
#include "tessera/models/moe_options.h"

namespace tessera::models {

// What one training forward of a layer recorded (detached), for the trainer's logs.
struct MoERecord {
  at::Tensor tokens_per_expert;  // (E,) int64: the top-k slots routed to each expert, before any capacity drop
  at::Tensor lbl;                // this layer's weighted share of the load-balancing loss (undefined: weight 0)
  at::Tensor zloss;              // this layer's weighted router z-loss (undefined: weight 0)
};

// The d(objective)/d(auxiliary loss) factor the trainer sets before each backward (the microbatch's share of the
// step, times the loss scale), shared by every layer of a model. 1 by default: backward of the plain sum. A tensor,
// so that graphs recorded before the model is destroyed keep it alive.
struct AuxLossScale {
  at::Tensor value = at::ones({}, at::kDouble);
  void set(double v) { value.fill_(v); }
};

// router.layer: a Linear (d -> E) without bias, initialised as the model's other Linears.
class MoERouterImpl : public torch::nn::Module {
 public:
  MoERouterImpl(const MoEOptions& o, const at::TensorOptions& t);
  Linear layer{nullptr};
};
TORCH_MODULE(MoERouter);

// The experts' stacked weights: w1, (v1,) w2, each (E * F, d).
class MoEExpertWeightsImpl : public torch::nn::Module {
 public:
  MoEExpertWeightsImpl(const MoEOptions& o, const at::TensorOptions& t);
  at::Tensor w1, v1, w2;
};
TORCH_MODULE(MoEExpertWeights);

class MoEExpertsImpl : public torch::nn::Module {
 public:
  MoEExpertsImpl(const MoEOptions& o, const at::TensorOptions& t);
  MoEExpertWeights mlp{nullptr};
  at::Tensor bias;  // (d,), output_bias only
};
TORCH_MODULE(MoEExperts);

class MoEImpl : public torch::nn::Module {
 public:
  MoEImpl(const MoEOptions& o, const at::TensorOptions& t, std::shared_ptr<AuxLossScale> scale);
  // x: (B, S, d) -> (B, S, d). In training, records a MoERecord and attaches the auxiliary losses to the output.
  at::Tensor forward(const at::Tensor& x);
  const MoEOptions& options() const { return o_; }

  MoERouter router{nullptr};
  MoEExperts experts{nullptr};
  // The records of the training forwards since the last clear (activation checkpointing's recomputation adds more;
  // models clear them at the start of every forward).
  std::vector<MoERecord> records;

 private:
  MoEOptions o_;
  std::shared_ptr<AuxLossScale> scale_;
};
TORCH_MODULE(MoE);

// y, with `aux` (a scalar) attached: the same values, and in backward d(aux) = scale.value, so that aux's gradient
// joins the main loss's through y's graph.
at::Tensor attach_aux_loss(const at::Tensor& y, const at::Tensor& aux, const std::shared_ptr<AuxLossScale>& scale);

}  // namespace tessera::models
