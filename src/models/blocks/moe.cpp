// Mixture-of-experts layers: router, grouped expert GEMMs, MegaBlocks' load-balancing loss and router z-loss.
#include "tessera/models/blocks/moe.h"

#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <torch/autograd.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "tessera/models/blocks/layers.h"

namespace tessera::models {
namespace {

// y unchanged; in backward, `aux` receives factor * scale, so that aux's gradient joins the main loss's through y's
// graph.
struct AuxLossFunction : public torch::autograd::Function<AuxLossFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& y, const at::Tensor& aux,
                            const at::Tensor& factor, const at::Tensor& scale) {
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["factor"] = factor;
    ctx->saved_data["aux"] = aux.detach();
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor aux = ctx->saved_data["aux"].toTensor();
    const double scale = ctx->saved_data["scale"].toTensor().item<double>();
    const at::Tensor factor = ctx->saved_data["factor"].toTensor();
    return {grads[0], (factor * scale).to(aux.scalar_type()).expand_as(aux).contiguous(), at::Tensor(), at::Tensor()};
  }
};

// Whether at::_grouped_mm runs for these operands here (it needs 16-byte aligned strides and, on CUDA, a dtype and
// GPU it supports); learnt once per device type and dtype by trying it.
std::map<std::pair<int, int>, bool>& grouped_mm_support() {
  static thread_local std::map<std::pair<int, int>, bool> support;
  return support;
}

bool aligned_for_grouped_mm(const at::Tensor& x, const at::Tensor& w) {
  const int64_t elt = static_cast<int64_t>(x.element_size());
  return (x.size(1) * elt) % 16 == 0 && (w.size(2) * elt) % 16 == 0 && (w.size(1) * elt) % 16 == 0;
}

}  // namespace

at::Tensor expert_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& counts, const at::Tensor& offsets) {
  const auto key = std::make_pair(static_cast<int>(x.device().type()), static_cast<int>(x.scalar_type()));
  auto& support = grouped_mm_support();
  const auto known = support.find(key);
  if (x.size(0) > 0 && aligned_for_grouped_mm(x, w) && (known == support.end() || known->second)) {
    try {
      at::Tensor y = at::_grouped_mm(x, w, offsets);
      support[key] = true;
      return y;
    } catch (const c10::Error&) {
      support[key] = false;
    }
  }
  // One GEMM per expert over its contiguous rows (the counts come to the host once per call).
  const at::Tensor host = counts.to(at::kCPU);
  const int64_t* n = host.data_ptr<int64_t>();
  std::vector<at::Tensor> parts;
  int64_t start = 0;
  for (int64_t e = 0; e < w.size(0); ++e) {
    if (n[e] == 0) continue;
    parts.push_back(at::mm(x.narrow(0, start, n[e]), w[e]));
    start += n[e];
  }
  // No rows (a rank of an expert-parallel group that received none): an empty product, still in the graph.
  if (parts.empty()) return at::mm(x, w[0]);
  return parts.size() == 1 ? parts[0] : at::cat(parts);
}

namespace {

at::ScalarType compute_type(const at::Tensor& x) {
  const at::DeviceType dev = x.device().type();
  if ((dev == at::kCPU || dev == at::kCUDA) && at::autocast::is_autocast_enabled(dev)) {
    return at::autocast::get_autocast_dtype(dev);
  }
  return x.scalar_type();
}

}  // namespace

at::Tensor attach_aux_loss(const at::Tensor& y, const at::Tensor& aux, const std::shared_ptr<AuxLossScale>& scale) {
  if (!at::GradMode::is_enabled() || !aux.requires_grad()) return y;
  return AuxLossFunction::apply(y, aux, at::ones({}, aux.options().dtype(at::kFloat)), scale->value);
}

int64_t moe_params(const MoEOptions& o) {
  const int64_t per_expert = (o.glu ? 3 : 2) * o.ffn_hidden * o.hidden_size;
  return o.hidden_size * o.num_experts + o.num_experts * per_expert + (o.output_bias ? o.hidden_size : 0);
}

int64_t moe_active_params(const MoEOptions& o) {
  const int64_t per_expert = (o.glu ? 3 : 2) * o.ffn_hidden * o.hidden_size;
  return o.hidden_size * o.num_experts + o.top_k * per_expert + (o.output_bias ? o.hidden_size : 0);
}

MoERouterImpl::MoERouterImpl(const MoEOptions& o, const at::TensorOptions& t) {
  layer = register_module("layer", Linear(o.hidden_size, o.num_experts, /*bias=*/false, t));
}

MoEExpertWeightsImpl::MoEExpertWeightsImpl(const MoEOptions& o, const at::TensorOptions& t) {
  const std::vector<int64_t> shape = {o.num_experts * o.ffn_hidden, o.hidden_size};
  w1 = register_parameter("w1", at::empty(shape, t));
  if (o.glu) v1 = register_parameter("v1", at::empty(shape, t));
  w2 = register_parameter("w2", at::empty(shape, t));
}

MoEExpertsImpl::MoEExpertsImpl(const MoEOptions& o, const at::TensorOptions& t) {
  mlp = register_module("mlp", MoEExpertWeights(o, t));
  if (o.output_bias) bias = register_parameter("bias", at::zeros({o.hidden_size}, t));
}

MoEImpl::MoEImpl(const MoEOptions& o, const at::TensorOptions& t, std::shared_ptr<AuxLossScale> scale,
                 std::shared_ptr<HfRouterLoss> hf_loss)
    : o_(o), scale_(std::move(scale)), hf_loss_(std::move(hf_loss)) {
  TORCH_CHECK(o.num_experts >= 1 && o.top_k >= 1 && o.top_k <= o.num_experts, "moe: need 1 <= top_k <= num_experts");
  router = register_module("router", MoERouter(o, t));
  experts = register_module("experts", MoEExperts(o, t));
}

std::vector<std::string> MoEImpl::expert_weight_names() const {
  if (o_.glu) return {"experts.mlp.w1", "experts.mlp.v1", "experts.mlp.w2"};
  return {"experts.mlp.w1", "experts.mlp.w2"};
}

at::Tensor MoEImpl::forward(const at::Tensor& x) {
  const int64_t d = o_.hidden_size, e_count = o_.num_experts, k = o_.top_k, f = o_.ffn_hidden;
  at::Tensor flat = x.reshape({-1, d});
  const int64_t tokens = flat.size(0);

  // Router (MegaBlocks' LearnedRouter): softmax scores, the top k, optionally p-normalised.
  at::Tensor router_in = flat;
  if (is_training() && o_.jitter_eps) {
    const double eps = *o_.jitter_eps;
    router_in = flat * ((1.0 - eps) + at::rand(flat.sizes(), flat.options()) * (2.0 * eps));
    if (o_.jitter_experts) flat = router_in;  // DBRX scales its input in place: the experts see it too
  }
  const at::Tensor logits = router->layer(router_in);  // (T, E)
  const at::Tensor scores = o_.router_fp32 ? at::softmax(logits, -1, at::kFloat) : logits.softmax(-1);
  at::Tensor weights, chosen;
  if (k == 1) {
    std::tie(weights, chosen) = scores.max(-1, /*keepdim=*/true);
  } else {
    std::tie(weights, chosen) = scores.topk(k, -1);
  }
  if (o_.normalize_expert_weights) {
    weights = weights / at::norm(weights, at::Scalar(*o_.normalize_expert_weights), {-1}, /*keepdim=*/true);
  }
  if (o_.uniform_expert_assignment) {
    chosen = at::arange(tokens * k, chosen.options()).remainder(e_count).view({tokens, k});
  }
  weights = weights.to(x.scalar_type());
  const at::Tensor routed = chosen;  // before any capacity drop

  // Capacity-factor routing: the slots past an expert's capacity (in token order, per top-k slot) are dropped.
  if (o_.capacity_factor) {
    const auto capacity =
        static_cast<int64_t>(*o_.capacity_factor * static_cast<double>(tokens) / static_cast<double>(e_count));
    if (capacity > 0) {  // 0: as many as the busiest expert got (MegaBlocks), so none are dropped
      const at::Tensor rank = at::one_hot(chosen, e_count).cumsum(0).gather(2, chosen.unsqueeze(2)).squeeze(2) - 1;
      weights = weights * rank.lt(capacity).to(weights.scalar_type());
    }
  }

  // Group the (token, slot) pairs by expert, in token order within each expert.
  const at::Tensor flat_choice = chosen.reshape({-1});
  const at::Tensor order = at::argsort(flat_choice, /*stable=*/true, /*dim=*/0);
  const at::Tensor token = at::floor_divide(order, k);
  const at::Tensor counts = at::bincount(flat_choice, {}, e_count);
  const at::Tensor offsets = counts.cumsum(0).to(at::kInt);

  const at::ScalarType ct = compute_type(flat);
  const at::Tensor xs = flat.index_select(0, token).to(ct);
  // The experts this rank holds (all of them without expert parallelism) over rows grouped by expert.
  const auto& mlp = experts->mlp;
  auto run_experts = [&](const at::Tensor& rows, const at::Tensor& n, const at::Tensor& off) {
    const int64_t local = mlp->w1.size(0) / f;
    const at::Tensor w1 = mlp->w1.to(ct).view({local, f, d}).transpose(1, 2);  // (E, d, F)
    at::Tensor h = hf_activation(o_.activation, expert_mm(rows, w1, n, off));
    if (o_.glu) h = h * expert_mm(rows, mlp->v1.to(ct).view({local, f, d}).transpose(1, 2), n, off);
    return expert_mm(h, mlp->w2.to(ct).view({local, f, d}), n, off);  // (rows, d)
  };
  at::Tensor y =
      exchange_ ? exchange_->route(xs, counts, e_count, run_experts) : run_experts(xs, counts, offsets);  // (T k, d)
  y = y * weights.reshape({-1}).index_select(0, order).unsqueeze(1).to(y.scalar_type());
  at::Tensor out = at::zeros({tokens, d}, y.options()).index_add(0, token, y);
  if (experts->bias.defined()) out = out + experts->bias.to(out.scalar_type());
  out = out.view(x.sizes());

  if (!is_training()) return out;
  if (o_.transformers_loss) {
    records.push_back({counts.detach(), at::Tensor(), at::Tensor()});
    if (!hf_loss_ || hf_loss_->coef == 0) return out;
    // transformers' load_balancing_loss_func of DBRX over the routers' softmax probabilities.
    return hf_loss_->attach(out, routed, scores.to(at::kFloat), scale_);
  }
  // MegaBlocks' load-balancing loss, this layer's share of its sum over layers: loss_weight * E / (layers * T * k) *
  // dot(tokens per expert, mean score per expert); and its router z-loss: weight * mean over tokens of logsumexp^2.
  MoERecord record;
  record.tokens_per_expert = counts.detach();
  at::Tensor aux;
  if (o_.loss_weight != 0) {
    const at::Tensor s = o_.lbl_in_fp32 ? scores.to(at::kFloat) : scores;
    const double scale = o_.loss_weight * static_cast<double>(e_count) /
                         (static_cast<double>(o_.num_layers) * static_cast<double>(tokens) * static_cast<double>(k));
    aux = at::dot(counts.to(s.scalar_type()), s.mean(0)) * scale;
    record.lbl = aux.detach();
  }
  if (o_.zloss_weight != 0) {
    const at::Tensor l = o_.zloss_in_fp32 ? logits.to(at::kFloat) : logits;
    const at::Tensor z = at::logsumexp(l, {1}).square().mean() * o_.zloss_weight;
    record.zloss = z.detach();
    aux = aux.defined() ? aux + z.to(aux.scalar_type()) : z;
  }
  records.push_back(std::move(record));
  return aux.defined() ? attach_aux_loss(out, aux, scale_) : out;
}

// ---- Hugging Face's sparse MoE blocks -----------------------------------------------------------------------------

void HfRouterLoss::start(int64_t experts, const at::Tensor& mask, int64_t tokens, const at::Device& device) {
  token_mask = mask;
  real_tokens = mask.defined() ? mask.sum().item<double>() : static_cast<double>(tokens);
  grad_factor = at::zeros({experts}, at::TensorOptions().dtype(at::kFloat).device(device));
  counts.clear();
  prob_sums.clear();
}

at::Tensor HfRouterLoss::finish() {
  if (counts.empty() || coef == 0) return {};
  // The first `sparse_layers` entries: activation checkpointing's recomputation appends more.
  const size_t layers = std::min(counts.size(), static_cast<size_t>(sparse_layers));
  at::Tensor count = counts[0], probs = prob_sums[0];
  for (size_t l = 1; l < layers; ++l) {
    count = count + counts[l];
    probs = probs + prob_sums[l];
  }
  const double denom = static_cast<double>(layers) * real_tokens;
  if (denom <= 0) return {};
  const double experts = static_cast<double>(count.numel());
  const at::Tensor share = count / denom;  // each expert's share of the routed slots
  grad_factor.copy_(share * (coef * experts / denom));
  return (share * probs).sum() * (coef * experts / denom);
}

void HfMoeRouting::begin(bool training, int64_t experts, const at::Tensor& ids, const at::Tensor& key_mask) {
  training_ = training;
  aux_ = at::Tensor();
  if (training) {
    loss->start(experts, key_mask.defined() ? key_mask.reshape({-1}) : at::Tensor(), ids.numel(), ids.device());
  }
}

void HfMoeRouting::end() {
  if (training_) aux_ = loss->finish();
}

std::map<std::string, at::Tensor> HfMoeRouting::auxiliary_losses() const {
  if (!aux_.defined()) return {};
  return {{"aux_loss", aux_}};
}

std::vector<std::pair<std::string, at::Tensor>> expert_counts_by_layer(
    int64_t layers, const std::function<const std::vector<at::Tensor>*(int64_t)>& records) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (int64_t i = 0; i < layers; ++i) {
    const std::vector<at::Tensor>* r = records(i);
    if (r != nullptr && !r->empty()) out.emplace_back(fmt::format("layer_{}", i), r->front());
  }
  return out;
}

at::Tensor HfRouterLoss::attach(const at::Tensor& out, const at::Tensor& chosen, const at::Tensor& probs,
                                const std::shared_ptr<AuxLossScale>& scale) {
  // This layer's routed slots and summed probabilities over real tokens.
  const int64_t tokens = probs.size(0), experts = probs.size(1);
  const at::Tensor valid =
      token_mask.defined() ? token_mask.reshape({-1}).to(probs.options()) : at::ones({tokens}, probs.options());
  const at::Tensor slots =
      (at::one_hot(chosen, experts).to(at::kFloat) * valid.view({-1, 1, 1})).sum(at::IntArrayRef{0, 1});
  const at::Tensor prob_sum = (probs * valid.view({-1, 1})).sum(0);
  counts.push_back(slots.detach());
  prob_sums.push_back(prob_sum.detach());
  if (!at::GradMode::is_enabled()) return out;
  return AuxLossFunction::apply(out, prob_sum, grad_factor, scale->value);
}

SparseExpertImpl::SparseExpertImpl(int64_t hidden, int64_t ffn, bool qwen_names, const at::TensorOptions& t) {
  gate = register_module(qwen_names ? "gate_proj" : "w1", Linear(hidden, ffn, false, t));
  up = register_module(qwen_names ? "up_proj" : "w3", Linear(hidden, ffn, false, t));
  down = register_module(qwen_names ? "down_proj" : "w2", Linear(ffn, hidden, false, t));
}

SparseMoeBlockImpl::SparseMoeBlockImpl(const SparseMoeOptions& o, const at::TensorOptions& t,
                                       std::shared_ptr<HfRouterLoss> loss, std::shared_ptr<AuxLossScale> scale)
    : o_(o), loss_(std::move(loss)), scale_(std::move(scale)) {
  TORCH_CHECK(o.num_experts >= 1 && o.top_k >= 1 && o.top_k <= o.num_experts, "moe: need 1 <= top_k <= num_experts");
  gate = register_module("gate", Linear(o.hidden_size, o.num_experts, false, t));
  experts = register_module("experts", torch::nn::ModuleList());
  for (int64_t e = 0; e < o.num_experts; ++e) {
    experts->push_back(SparseExpert(o.hidden_size, o.ffn_hidden, o.qwen_names, t));
  }
  if (o.deepseek_router) {
    TORCH_CHECK(o.n_group >= 1 && o.num_experts % o.n_group == 0 && o.num_experts / o.n_group >= 2 &&
                    o.topk_group >= 1 && o.topk_group <= o.n_group,
                "moe: the experts must split into n_group groups of at least 2, topk_group of them chosen");
    e_score_correction_bias =
        gate->register_parameter("e_score_correction_bias", at::zeros({o.num_experts}, t), /*requires_grad=*/false);
  }
  if (o.shared_ffn_hidden > 0) {
    shared_expert = register_module(o.deepseek_router ? "shared_experts" : "shared_expert",
                                    SparseExpert(o.hidden_size, o.shared_ffn_hidden, true, t));
    if (!o.deepseek_router)
      shared_expert_gate = register_module("shared_expert_gate", Linear(o.hidden_size, 1, false, t));
  }
}

namespace {

// DeepseekV3TopkRouter.forward: (weights (T, k) float32, chosen (T, k) int64) from float32 sigmoid scores.
std::pair<at::Tensor, at::Tensor> deepseek_route(const at::Tensor& scores, const at::Tensor& bias,
                                                 const SparseMoeOptions& o) {
  const int64_t e = o.num_experts, per = e / o.n_group;
  at::Tensor chosen;
  {
    at::NoGradGuard no_grad;  // get_topk_indices runs without gradient
    at::Tensor choice = scores.detach() + bias.to(at::kFloat).unsqueeze(0);
    const at::Tensor group_scores = std::get<0>(choice.view({-1, o.n_group, per}).topk(2, -1)).sum(-1);
    const at::Tensor groups = std::get<1>(group_scores.topk(o.topk_group, -1, true, /*sorted=*/false));
    const at::Tensor group_mask = at::zeros_like(group_scores).scatter_(1, groups, 1.0);
    const at::Tensor score_mask = group_mask.unsqueeze(-1).expand({-1, o.n_group, per}).reshape({-1, e});
    choice = choice.masked_fill(score_mask.logical_not(), 0.0);
    chosen = std::get<1>(choice.topk(o.top_k, -1, true, /*sorted=*/false));
  }
  at::Tensor weights = scores.gather(1, chosen);
  if (o.norm_topk_prob) weights = weights / (weights.sum(-1, /*keepdim=*/true) + 1e-20);
  return {weights * o.routed_scaling_factor, chosen};
}

}  // namespace

at::Tensor SparseMoeBlockImpl::forward(const at::Tensor& x) {
  const int64_t d = o_.hidden_size, k = o_.top_k, e_count = o_.num_experts;
  at::Tensor h = x;
  if (is_training() && o_.jitter_noise > 0) {
    const double j = o_.jitter_noise;
    h = h * ((1.0 - j) + at::rand(h.sizes(), h.options()) * (2.0 * j));
  }
  const at::Tensor flat = h.reshape({-1, d});
  const int64_t tokens = flat.size(0);
  at::Tensor probs, weights, chosen;
  if (o_.deepseek_router) {
    probs = at::sigmoid(at::linear(flat.to(at::kFloat), gate->weight.to(at::kFloat)));
    std::tie(weights, chosen) = deepseek_route(probs, e_score_correction_bias, o_);
  } else {
    probs = at::softmax(gate(flat), 1, at::kFloat);  // transformers: softmax(dtype=torch.float)
    std::tie(weights, chosen) = probs.topk(k, -1);
    if (o_.norm_topk_prob) weights = weights / weights.sum(-1, /*keepdim=*/true);
    weights = weights.to(flat.scalar_type());
  }

  // Sorted by expert (in token order within each), one GEMM per projection and expert over its rows, summed back per
  // token in expert order as transformers' loop over experts does.
  const at::Tensor flat_choice = chosen.reshape({-1});
  const at::Tensor order = at::argsort(flat_choice, /*stable=*/true, /*dim=*/0);
  const at::Tensor token = at::floor_divide(order, k);
  const at::Tensor counts = at::bincount(flat_choice, {}, e_count);
  const at::Tensor xs = flat.index_select(0, token);
  // The experts from `first` on (all of them, or this rank's under expert parallelism) over rows grouped by expert,
  // `per_expert` rows each.
  auto run_experts = [&](const at::Tensor& rows, int64_t first, const at::Tensor& per_expert) {
    const at::Tensor host = per_expert.to(at::kCPU);
    const int64_t* n = host.data_ptr<int64_t>();
    std::vector<at::Tensor> parts;
    int64_t start = 0;
    for (int64_t e = 0; e < host.numel(); ++e) {
      if (n[e] == 0) continue;
      auto* expert = experts[static_cast<size_t>(first + e)]->as<SparseExpertImpl>();
      const at::Tensor in = rows.narrow(0, start, n[e]);
      parts.push_back(expert->down(at::silu(expert->gate(in)) * expert->up(in)));
      start += n[e];
    }
    // No row came to these experts: an empty result still on the rows' graph, so that backward runs the exchange's
    // reverse on this rank as on the others.
    if (parts.empty()) return rows * 0;
    return parts.size() == 1 ? parts[0] : at::cat(parts);
  };
  at::Tensor y;
  if (exchange_) {
    const int64_t first = exchange_->rank() * (e_count / exchange_->size());
    y = exchange_->route(xs, counts, e_count, [&](const at::Tensor& rows, const at::Tensor& n, const at::Tensor&) {
      return run_experts(rows, first, n);
    });
  } else {
    y = run_experts(xs, 0, counts);
  }
  // DeepSeek-V3 sums the weighted rows in float32 (its weights' dtype), then casts to the input's.
  const at::ScalarType out_dtype = o_.deepseek_router ? flat.scalar_type() : y.scalar_type();
  const at::ScalarType sum_dtype = o_.deepseek_router ? at::kFloat : y.scalar_type();
  y = y.to(sum_dtype) * weights.reshape({-1}).index_select(0, order).unsqueeze(1).to(sum_dtype);
  at::Tensor out = at::zeros({tokens, d}, y.options()).index_add(0, token, y).to(out_dtype);
  if (shared_expert) {
    const at::Tensor shared = shared_expert->down(at::silu(shared_expert->gate(flat)) * shared_expert->up(flat));
    out = out + (shared_expert_gate ? at::sigmoid(shared_expert_gate(flat)) * shared : shared);
  }
  out = out.view(x.sizes());
  if (!is_training()) return out;
  records.push_back(counts.detach());
  if (!loss_ || loss_->coef == 0) return out;
  return loss_->attach(out, chosen, probs, scale_);
}

std::vector<std::vector<std::string>> SparseMoeBlockImpl::expert_module_weights() const {
  std::vector<std::vector<std::string>> out;
  for (size_t e = 0; e < experts->size(); ++e) {
    std::vector<std::string> names;
    for (const auto& p : experts->ptr(e)->named_parameters()) names.push_back(fmt::format("experts.{}.{}", e, p.key()));
    out.push_back(std::move(names));
  }
  return out;
}

int64_t sparse_moe_params(const SparseMoeOptions& o) {
  const int64_t d = o.hidden_size;
  int64_t n = d * o.num_experts + o.num_experts * 3 * d * o.ffn_hidden;
  if (o.shared_ffn_hidden > 0) n += 3 * d * o.shared_ffn_hidden + (o.deepseek_router ? 0 : d);
  if (o.deepseek_router) n += o.num_experts;  // e_score_correction_bias
  return n;
}

int64_t sparse_moe_active_params(const SparseMoeOptions& o) {
  return sparse_moe_params(o) - (o.num_experts - o.top_k) * 3 * o.hidden_size * o.ffn_hidden;
}

}  // namespace tessera::models
