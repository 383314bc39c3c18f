// The optional parts of the model protocol (causal_lm.h). A family implements a capability beside CausalLM when it
// has it; code outside models/ asks for it with capability<C>(model), which is null for a model without it, so the
// core protocol stays what every model must answer. Tensor parallelism's capability is TensorParallelModel
// (parallel_plan.h); a mixture-of-experts layer's is ExpertParallelLayer (blocks/moe.h).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessera/models/causal_lm.h"

namespace tessera::models {

// `model` through capability C, or nullptr when its family does not implement it.
template <class C>
C* capability(CausalLM& model) {
  return dynamic_cast<C*>(&model);
}
template <class C>
const C* capability(const CausalLM& model) {
  return dynamic_cast<const C*>(&model);
}

// A model that may route its tokens through mixtures of experts (MPT's dMoE, DBRX, Mixtral, Qwen-MoE; a dense
// configuration of such a family answers with nothing routed).
class MixtureOfExpertsModel {
 public:
  virtual ~MixtureOfExpertsModel() = default;
  // After a training forward: each auxiliary loss that forward added to the objective, by name ("lbl": the
  // load-balancing loss, "z_loss": the router z-loss), weighted, summed over the layers and detached. Their gradients
  // are not taken from these values: they join the main loss's through the forward's own graph, scaled by the factor
  // last set with set_auxiliary_loss_scale() (d objective / d auxiliary loss; 1 until set), so that they pass through
  // the sharding engine's units and activation checkpointing as the main loss does.
  virtual std::map<std::string, at::Tensor> auxiliary_losses() const = 0;
  virtual void set_auxiliary_loss_scale(double scale) = 0;
  // After a training forward: per router ("layer_3"), the top-k slots it routed to each expert (int64, experts).
  virtual std::vector<std::pair<std::string, at::Tensor>> expert_token_counts() const = 0;
  // The parameters one token uses: its routers and top-k experts only (as LLM Foundry's n_active_params counts).
  virtual int64_t num_active_params() const = 0;
};

// The parameters one token of `model` uses: MixtureOfExpertsModel::num_active_params(), else num_params().
int64_t active_params(const CausalLM& model);

// Composer's ALiBi surgery: a rebuilt model with ALiBi attention (learned positions dropped), `alibi_bias_max`, up to
// `max_seq_len` tokens, initialised from `seed`.
class AlibiSurgery {
 public:
  virtual ~AlibiSurgery() = default;
  virtual std::shared_ptr<CausalLM> with_alibi(double alibi_bias_max, int64_t max_seq_len, uint64_t seed) const = 0;
};

// A family whose options name its norms' precision, so that rebuild() keeps low-precision norms (MPT's norm_type).
class LowPrecisionNormsModel {
 public:
  virtual ~LowPrecisionNormsModel() = default;
  // Called by use_low_precision_norms() after it switched the norms.
  virtual void record_low_precision_norms() = 0;
};

// LLM Foundry's low-precision norms: every LayerNorm / RMSNorm of `model` runs in the autocast dtype (and a
// LowPrecisionNormsModel records it in its options).
void use_low_precision_norms(CausalLM& model);

}  // namespace tessera::models
