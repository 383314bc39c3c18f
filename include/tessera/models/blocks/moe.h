// Mixture-of-experts feed-forward layers: a learned top-k router and a set of expert MLPs, computed as MegaBlocks'
// dMoE and LLM Foundry's torch_dmoe compute them (llmfoundry/models/layers/dmoe.py, megablocks/layers/{router,moe,
// dmoe}.py), with MegaBlocks' load-balancing loss and router z-loss. The parameter names are theirs:
// router.layer.weight (E, d), experts.mlp.w1 / v1 / w2 (E * F, d), experts.bias (d; MegaBlocks with biases only).
//
// Tokens are grouped by expert (a stable sort of the token-expert pairs) and every expert's GEMM runs as one grouped
// GEMM per projection (at::_grouped_mm) where the shapes allow it, else as one GEMM per expert over its contiguous
// rows: no loop over tokens.
//
// Expert parallelism (ExpertParallelLayer below): the sharding engine keeps only this rank's experts in the layer's
// weights (rows [rank * E / P, (rank + 1) * E / P) of experts, P ranks in the expert-parallel group) and installs an
// ExpertExchange. The layer then routes its own tokens as before, sends each row to the rank that holds its expert
// (all-to-all), computes its experts over the rows it received from every rank of the group, and sends the results
// back (all-to-all); both exchanges are differentiable (backward is the reverse exchange).
//
// Auxiliary losses reach the gradient through the layer's own output (MoEAuxLoss below), so that they flow through
// whatever runs the layer (the sharding engine's units, activation checkpointing) like the main loss does.
// Modules are not thread-safe.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/models/blocks/layers.h"
#include "tessera/models/blocks/moe_options.h"

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

// transformers' load_balancing_loss_func over a whole forward: E * sum over experts of (the share of the (layer,
// token) top-k slots routed to the expert) * (its mean router probability), over the router logits of every sparse
// layer, padding excluded. It couples the layers (both shares are means over all of them), so each layer attaches its
// probability sums and the model fills in their common gradient factor once every layer has run.
struct HfRouterLoss {
  double coef = 0;            // router_aux_loss_coef (0: none)
  int64_t sparse_layers = 0;  // layers with experts
  at::Tensor token_mask;      // (B S,) bool, true = a real token; undefined: every token
  double real_tokens = 0;     // tokens counted per layer
  // This forward's factor, (E,) float: d(coef * aux) / d(a layer's summed probabilities), filled by finish().
  at::Tensor grad_factor;
  std::vector<at::Tensor> counts;     // per layer (E,) float: the top-k slots of real tokens
  std::vector<at::Tensor> prob_sums;  // per layer (E,) float: summed router probabilities of real tokens (detached)
  // Starts a training forward of `tokens` tokens (B S): a new factor tensor (graphs of earlier forwards keep theirs).
  void start(int64_t experts, const at::Tensor& mask, int64_t tokens, const at::Device& device);
  // A layer's part: records its routed slots (`chosen`, (T, k)) and summed probabilities (`probs`, (T, E) float32)
  // over real tokens, and returns `out` with their gradient attached (in grad mode).
  at::Tensor attach(const at::Tensor& out, const at::Tensor& chosen, const at::Tensor& probs,
                    const std::shared_ptr<AuxLossScale>& scale);
  // After every layer: the factor, and coef * aux (detached), or an undefined tensor when nothing was routed.
  at::Tensor finish();
};

// What a transformers-style mixture-of-experts model keeps between its forwards for MixtureOfExpertsModel
// (capabilities.h): transformers' load-balancing loss over every sparse layer, the factor its gradient is scaled by,
// and the last training forward's loss. Mixtral and Qwen-MoE (the Llama family), gpt-oss and Qwen3.5-MoE hold one.
class HfMoeRouting {
 public:
  std::shared_ptr<HfRouterLoss> loss = std::make_shared<HfRouterLoss>();
  std::shared_ptr<AuxLossScale> scale = std::make_shared<AuxLossScale>();
  // Before a forward of `ids` (`key_mask` (B, S) true for real tokens, undefined: none padded) through layers of
  // `experts` experts each; a training forward starts the loss.
  void begin(bool training, int64_t experts, const at::Tensor& ids, const at::Tensor& key_mask);
  void end();  // after it: a training forward's loss
  // {"aux_loss": coef * the loss} after a training forward that computed one, else nothing.
  std::map<std::string, at::Tensor> auxiliary_losses() const;

 private:
  at::Tensor aux_;
  bool training_ = false;
};

// MixtureOfExpertsModel::expert_token_counts() of `layers` decoder layers: ("layer_{i}", the first record) for each
// layer whose `records(i)` (its block's records, nullptr for a dense layer) holds one.
std::vector<std::pair<std::string, at::Tensor>> expert_counts_by_layer(
    int64_t layers, const std::function<const std::vector<at::Tensor>*(int64_t)>& records);

// Expert parallelism's token routing, which the sharding engine installs on a layer (distributed/expert_parallel.cpp):
// the layer's rank holds experts [rank * E / P, (rank + 1) * E / P) of the E, P = size() ranks in its group. Every rank
// of the group makes the same calls in the same order.
class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // This rank's experts over rows grouped by local expert: (rows, rows per local expert (E / P,) int64, their
  // cumulative offsets int) -> each row's output, in the same order.
  using RunExperts = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>;
  // `xs` (this rank's rows grouped by expert, `counts` (E,) per expert) sent to the ranks that hold their experts,
  // computed there by `run_experts` and sent back: each row's output in xs's order. Differentiable: backward sends
  // the gradients back the way the rows came.
  virtual at::Tensor route(const at::Tensor& xs, const at::Tensor& counts, int64_t num_experts,
                           const RunExperts& run_experts) = 0;
};

// The capability expert parallelism needs of a mixture-of-experts layer (the sharding engine's
// distributed/expert_parallel.cpp and the planner find layers by it, whatever family they belong to): experts
// stacked in weights whose rows split evenly over an expert-parallel group, and a token exchange to install.
// x: (N, in) rows grouped by expert, `counts[e]` rows for expert e (`offsets` their cumulative ends, int); w: (E, in,
// out) -> (N, out): one grouped GEMM where at::_grouped_mm runs, else one GEMM per expert.
at::Tensor expert_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& counts, const at::Tensor& offsets);

class ExpertParallelLayer {
 public:
  virtual ~ExpertParallelLayer() = default;
  virtual int64_t num_experts() const = 0;
  virtual int64_t experts_per_token() const = 0;  // top-k
  virtual int64_t token_width() const = 0;        // the width of the rows exchanged (the model's hidden size)
  // The degree the layer's own options ask for (LLM Foundry's moe_world_size); 1: none.
  virtual int64_t requested_expert_parallel_degree() const { return 1; }
  // The weights (names relative to the layer) that hold every expert's rows in expert order, E equal blocks: a rank
  // keeps the blocks of its experts. Empty for a layer that holds each expert as a module of its own.
  virtual std::vector<std::string> expert_weight_names() const = 0;
  // Per expert in order, the names (relative to the layer) of the weights of an expert held as a module of its own
  // (transformers' Mixtral and Qwen-MoE blocks: experts.{e}.…): a rank keeps the whole weights of its experts and none
  // of the others'. Empty for stacked experts (expert_weight_names()).
  virtual std::vector<std::vector<std::string>> expert_module_weights() const { return {}; }
  // After the engine left this rank's experts in those weights: route through `exchange`.
  virtual void set_expert_exchange(std::shared_ptr<ExpertExchange> exchange) = 0;
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

class MoEImpl : public torch::nn::Module, public ExpertParallelLayer {
 public:
  // `hf_loss`: the model's transformers-style loss, for transformers_loss layers (DBRX).
  MoEImpl(const MoEOptions& o, const at::TensorOptions& t, std::shared_ptr<AuxLossScale> scale,
          std::shared_ptr<HfRouterLoss> hf_loss = nullptr);
  // x: (B, S, d) -> (B, S, d). In training, records a MoERecord and attaches the auxiliary losses to the output.
  at::Tensor forward(const at::Tensor& x);
  const MoEOptions& options() const { return o_; }
  // Expert parallelism.
  int64_t num_experts() const override { return o_.num_experts; }
  int64_t experts_per_token() const override { return o_.top_k; }
  int64_t token_width() const override { return o_.hidden_size; }
  int64_t requested_expert_parallel_degree() const override { return o_.world_size; }
  std::vector<std::string> expert_weight_names() const override;  // experts.mlp.w1, (v1,) w2
  void set_expert_exchange(std::shared_ptr<ExpertExchange> exchange) override { exchange_ = std::move(exchange); }

  MoERouter router{nullptr};
  MoEExperts experts{nullptr};
  // The records of the training forwards since the last clear (activation checkpointing's recomputation adds more;
  // models clear them at the start of every forward).
  std::vector<MoERecord> records;

 private:
  MoEOptions o_;
  std::shared_ptr<AuxLossScale> scale_;
  std::shared_ptr<HfRouterLoss> hf_loss_;
  std::shared_ptr<ExpertExchange> exchange_;
};
TORCH_MODULE(MoE);

// ---- Hugging Face's sparse MoE blocks: Mixtral's block_sparse_moe and Qwen2-MoE's mlp -------------------------------

struct SparseMoeOptions {
  int64_t num_experts = 8;
  int64_t top_k = 2;
  int64_t hidden_size = 0;
  int64_t ffn_hidden = 0;         // each expert's intermediate size
  int64_t shared_ffn_hidden = 0;  // Qwen2-MoE's shared expert (0: none)
  bool qwen_names = false;        // experts' gate_proj / up_proj / down_proj (Qwen2-MoE) or w1 / w3 / w2 (Mixtral)
  bool norm_topk_prob = true;     // the top-k probabilities divided by their sum
  double jitter_noise = 0;        // Mixtral's router_jitter_noise: the block's input times U(1 - j, 1 + j) in training
  // DeepSeek-V3's router (DeepseekV3TopkRouter): sigmoid scores of a float32 gate; the top_k chosen among the experts
  // of the topk_group best of n_group groups (a group scored by the sum of its two best experts), each score plus the
  // gate's e_score_correction_bias (a frozen parameter: balanced outside the gradient) for the choice only; the chosen
  // scores normalised (norm_topk_prob) and times routed_scaling_factor, summed in float32. Its shared experts
  // (shared_experts, shared_ffn_hidden wide) are added without a gate.
  bool deepseek_router = false;
  int64_t n_group = 1, topk_group = 1;
  double routed_scaling_factor = 1.0;
};

// One expert (or Qwen2-MoE's shared expert): down(silu(gate(x)) * up(x)) under either family's names.
class SparseExpertImpl : public torch::nn::Module {
 public:
  SparseExpertImpl(int64_t hidden, int64_t ffn, bool qwen_names, const at::TensorOptions& t);
  Linear gate{nullptr}, up{nullptr}, down{nullptr};  // w1, w3, w2 (Mixtral)
};
TORCH_MODULE(SparseExpert);

// Expert parallelism through the capability: a rank keeps its experts' modules whole (the sharding engine leaves the
// others out) and routes through the exchange.
class SparseMoeBlockImpl : public torch::nn::Module, public ExpertParallelLayer {
 public:
  SparseMoeBlockImpl(const SparseMoeOptions& o, const at::TensorOptions& t, std::shared_ptr<HfRouterLoss> loss,
                     std::shared_ptr<AuxLossScale> scale);
  // x: (B, S, d) -> (B, S, d). In training, adds this layer's routing to the model's HfRouterLoss and attaches its
  // share of the loss's gradient to the output; records the tokens per expert.
  at::Tensor forward(const at::Tensor& x);
  int64_t num_experts() const override { return o_.num_experts; }
  int64_t experts_per_token() const override { return o_.top_k; }
  int64_t token_width() const override { return o_.hidden_size; }
  std::vector<std::string> expert_weight_names() const override { return {}; }
  std::vector<std::vector<std::string>> expert_module_weights() const override;  // experts.{e}.{gate,up,down}
  void set_expert_exchange(std::shared_ptr<ExpertExchange> exchange) override { exchange_ = std::move(exchange); }

  Linear gate{nullptr};
  torch::nn::ModuleList experts{nullptr};
  SparseExpert shared_expert{nullptr};  // Qwen2-MoE ("shared_expert"), DeepSeek-V3 ("shared_experts")
  Linear shared_expert_gate{nullptr};   // Qwen2-MoE: sigmoid(shared_expert_gate(x)) * shared_expert(x)
  at::Tensor e_score_correction_bias;   // DeepSeek-V3: gate.e_score_correction_bias (E,), frozen
  std::vector<at::Tensor> records;      // tokens per expert (E,) int64 of each training forward since the last clear

 private:
  SparseMoeOptions o_;
  std::shared_ptr<HfRouterLoss> loss_;
  std::shared_ptr<AuxLossScale> scale_;
  std::shared_ptr<ExpertExchange> exchange_;
};
TORCH_MODULE(SparseMoeBlock);

int64_t sparse_moe_params(const SparseMoeOptions& o);
int64_t sparse_moe_active_params(const SparseMoeOptions& o);

// y, with `aux` (a scalar) attached: the same values, and in backward d(aux) = scale.value, so that aux's gradient
// joins the main loss's through y's graph.
at::Tensor attach_aux_loss(const at::Tensor& y, const at::Tensor& aux, const std::shared_ptr<AuxLossScale>& scale);

}  // namespace tessera::models
