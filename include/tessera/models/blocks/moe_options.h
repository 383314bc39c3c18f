// A mixture-of-experts layer's options (models/moe.h builds it), apart from ATen so that configuration code and
// the planner can hold them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tessera::models {

struct MoEOptions {
  int64_t num_experts = 1;                         // moe_num_experts
  int64_t top_k = 1;                               // moe_top_k
  int64_t hidden_size = 0;                         // d_model
  int64_t ffn_hidden = 0;                          // per expert
  bool glu = false;                                // mlp_type: glu (act(x w1^T) * (x v1^T)) w2, or mlp: act(x w1^T) w2
  std::string activation;                          // by its transformers ACT2FN name (models/layers.h)
  std::optional<double> jitter_eps;                // moe_jitter_eps: the router's input times U(1 - eps, 1 + eps)
  std::optional<double> normalize_expert_weights;  // moe_normalize_expert_weights: the top-k weights' p-norm
  bool uniform_expert_assignment = false;          // experts assigned round-robin (benchmarking)
  // Capacity-factor routing (MegaBlocks' MoE, mb_moe): each expert takes at most int(capacity_factor * tokens /
  // num_experts) tokens per top-k slot, in token order, and drops the rest; nullopt: dropless (dMoE).
  std::optional<double> capacity_factor;
  bool output_bias = false;  // experts.bias, added to the output (MegaBlocks' layers with biases)
  double loss_weight = 0;    // moe_loss_weight: the load-balancing loss's weight
  bool lbl_in_fp32 = false;  // moe_lbl_in_fp32
  double zloss_weight = 0;   // moe_zloss_weight: the router z-loss's weight
  bool zloss_in_fp32 = false;
  // moe_world_size: the expert-parallel degree. Above 1, the sharding engine (distributed/fsdp.h) splits the experts
  // over groups of this many ranks and installs the token exchange (ExpertExchange, models/moe.h) on the layer.
  int64_t world_size = 1;
  int64_t num_layers = 1;  // MoE layers in the model: the load-balancing loss is averaged over them
  // DBRX (transformers' DbrxRouter): the softmax in float32, the jitter applied to the layer's input (router and
  // experts alike), and transformers' load-balancing loss (HfRouterLoss, over the routers' softmax probabilities)
  // instead of MegaBlocks'.
  bool router_fp32 = false;
  bool jitter_experts = false;
  bool transformers_loss = false;
};

// Parameters of one MoE layer, and those one token uses (the router, top_k experts and the bias).
int64_t moe_params(const MoEOptions& o);
int64_t moe_active_params(const MoEOptions& o);

}  // namespace tessera::models
