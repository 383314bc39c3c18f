// The gpt-oss family: options (recipe and config.json, YaRN rope_scaling, layer_types), the stacked clamped-SwiGLU
// experts and their router, attention with sinks, initialisation.
#include "models/gpt_oss/gpt_oss.h"

#include <fmt/format.h>

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>

#include "tessera/config/value.h"
#include "tessera/models/family_keys.h"
#include "tessera/models/family_support.h"

namespace tessera::models {

// GptOssConfig's keys.
const FamilyKeys<GptOssOptions>& gpt_oss_keys() {
  using O = GptOssOptions;
  static const FamilyKeys<O> keys =
      FamilyKeys<O>({"gpt_oss"}, [](const std::string&) { return "GptOssForCausalLM"; })
          .field("num_hidden_layers", &O::num_hidden_layers, positive())
          .field("num_local_experts", &O::num_local_experts, positive())
          .field("vocab_size", &O::vocab_size, positive())
          .field("hidden_size", &O::hidden_size, positive())
          .field("intermediate_size", &O::intermediate_size, positive())
          .field("head_dim", &O::head_dim, KeyCheck<int64_t>([](const int64_t& v) {
                   return v > 0 && v % 2 == 0 ? "" : std::string("must be even and positive (rotary halves)");
                 }))
          .field("num_attention_heads", &O::num_attention_heads, positive())
          .resolved("num_key_value_heads", &O::num_key_value_heads, [](const O& o) { return o.num_attention_heads; })
          .divides("num_key_value_heads", &O::num_key_value_heads, "num_attention_heads", &O::num_attention_heads)
          .field("sliding_window", &O::sliding_window, positive())
          .field("rope_theta", &O::rope_theta, positive_real())
          .field("tie_word_embeddings", &O::tie_word_embeddings)
          .field("hidden_act", &O::hidden_act)
          .field("initializer_range", &O::initializer_range)
          .field("max_position_embeddings", &O::max_position_embeddings, positive())
          .field("rms_norm_eps", &O::rms_norm_eps, positive_real())
          .yarn_rope_scaling(&O::yarn)
          .field("attention_dropout", &O::attention_dropout, probability())
          .field("num_experts_per_tok", &O::num_experts_per_tok, positive())
          .field("router_aux_loss_coef", &O::router_aux_loss_coef)
          .field("output_router_logits", &O::output_router_logits)
          .field("layer_types", &O::layer_types)
          .field("attention_bias", &O::attention_bias)
          .field("swiglu_limit", &O::swiglu_limit, positive_real())
          .field("swiglu_alpha", &O::swiglu_alpha, positive_real())
          .token_ids()
          .pad_token_below_vocab()
          // The published configs' experts_per_token and initial_context_length: copies of num_experts_per_tok and
          // rope_scaling's original context that no transformers class reads.
          .hf_accepts({"experts_per_token", "initial_context_length"})
          .finally([](config::Section& s, O& o) {
            if (o.layer_types.empty()) {
              for (int64_t i = 0; i < o.num_hidden_layers; ++i)
                o.layer_types.emplace_back((i + 1) % 2 != 0 ? "sliding_attention" : "full_attention");
            }
            check_layer_types(s, o.layer_types, o.num_hidden_layers);
            s.check(o.num_experts_per_tok <= o.num_local_experts, "num_experts_per_tok",
                    fmt::format("must lie in [1, {}] (the number of experts)", o.num_local_experts));
          });
  return keys;
}

// ---- Modules --------------------------------------------------------------------------------------------------------

GptOssExpertsImpl::GptOssExpertsImpl(const GptOssOptions& o, const at::TensorOptions& t)
    : limit_(o.swiglu_limit), alpha_(o.swiglu_alpha) {
  const int64_t e = o.num_local_experts, d = o.hidden_size, f = o.intermediate_size;
  gate_up_proj = register_parameter("gate_up_proj", at::zeros({e, d, 2 * f}, t));
  gate_up_proj_bias = register_parameter("gate_up_proj_bias", at::zeros({e, 2 * f}, t));
  down_proj = register_parameter("down_proj", at::zeros({e, f, d}, t));
  down_proj_bias = register_parameter("down_proj_bias", at::zeros({e, d}, t));
}

at::Tensor GptOssExpertsImpl::forward(const at::Tensor& rows, const at::Tensor& n, const at::Tensor& offsets) {
  const at::Tensor expert = at::repeat_interleave(at::arange(n.size(0), n.options()), n);  // each row's local expert
  const at::Tensor gate_up =
      expert_mm(rows, gate_up_proj.to(rows.scalar_type()), n, offsets) + gate_up_proj_bias.index_select(0, expert);
  // The columns interleave: gate at the even ones, up at the odd ones.
  const at::Tensor gate = gate_up.slice(-1, 0, c10::nullopt, 2).clamp_max(limit_);
  const at::Tensor up = gate_up.slice(-1, 1, c10::nullopt, 2).clamp(-limit_, limit_);
  const at::Tensor h = (up + 1) * (gate * at::sigmoid(gate * alpha_));
  return expert_mm(h, down_proj.to(h.scalar_type()), n, offsets) + down_proj_bias.index_select(0, expert);
}

GptOssMLPImpl::GptOssMLPImpl(const GptOssOptions& o, const at::TensorOptions& t, std::shared_ptr<HfRouterLoss> loss,
                             std::shared_ptr<AuxLossScale> scale)
    : experts_(o.num_local_experts),
      top_k_(o.num_experts_per_tok),
      hidden_(o.hidden_size),
      loss_(std::move(loss)),
      scale_(std::move(scale)) {
  router = register_module("router", Linear(o.hidden_size, o.num_local_experts, true, t));
  experts = register_module("experts", GptOssExperts(o, t));
}

at::Tensor GptOssMLPImpl::forward(const at::Tensor& x) {
  const at::Tensor flat = x.reshape({-1, hidden_});
  const int64_t tokens = flat.size(0);
  // GptOssTopKRouter: the top-k logits, softmaxed among themselves; the scores (T, E) zero elsewhere.
  const at::Tensor logits = router(flat);
  auto [top, chosen] = logits.topk(top_k_, -1);
  const at::Tensor weights = at::softmax(top, 1);

  // Rows sorted by expert (token order within each), the experts over them, summed back per token in expert order as
  // transformers' loop over the experts does.
  const at::Tensor flat_choice = chosen.reshape({-1});
  const at::Tensor order = at::argsort(flat_choice, /*stable=*/true, /*dim=*/0);
  const at::Tensor token = at::floor_divide(order, top_k_);
  const at::Tensor counts = at::bincount(flat_choice, {}, experts_);
  const at::Tensor xs = flat.index_select(0, token);
  auto run = [&](const at::Tensor& rows, const at::Tensor& n, const at::Tensor& offsets) {
    return experts(rows, n, offsets);
  };
  const at::Tensor y =
      exchange_ ? exchange_->route(xs, counts, experts_, run) : run(xs, counts, counts.cumsum(0).to(at::kInt));
  const at::Tensor weighted = y * weights.reshape({-1}).index_select(0, order).unsqueeze(1).to(y.scalar_type());
  at::Tensor out = at::zeros({tokens, hidden_}, flat.options()).index_add(0, token, weighted.to(flat.scalar_type()));
  out = out.view(x.sizes());
  if (!is_training()) return out;
  records.push_back(counts.detach());
  if (!loss_ || loss_->coef == 0) return out;
  // transformers' load_balancing_loss_func reads the router's scores as its logits: the softmax of the scores.
  const at::Tensor scores = at::zeros_like(logits).scatter(1, chosen, weights);
  return loss_->attach(out, chosen, at::softmax(scores, 1, at::kFloat), scale_);
}

GptOssDecoderLayerImpl::GptOssDecoderLayerImpl(const GptOssOptions& o, const at::TensorOptions& t, int64_t index,
                                               std::shared_ptr<HfRouterLoss> loss, std::shared_ptr<AuxLossScale> scale)
    : sliding_(o.sliding(index)) {
  self_attn = register_module("self_attn", SelfAttention(SelfAttentionOptions{.hidden_size = o.hidden_size,
                                                                              .heads = o.num_attention_heads,
                                                                              .kv_heads = o.num_key_value_heads,
                                                                              .head_dim = o.head_dim,
                                                                              .qkv_bias = o.attention_bias,
                                                                              .out_bias = o.attention_bias,
                                                                              .dropout = o.attention_dropout,
                                                                              .sinks = true},
                                                         t));
  mlp = register_module("mlp", GptOssMLP(o, t, std::move(loss), std::move(scale)));
  input_layernorm =
      register_module("input_layernorm", Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t));
  post_attention_layernorm =
      register_module("post_attention_layernorm", Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t));
}

at::Tensor GptOssDecoderLayerImpl::forward(const at::Tensor& x, const GlobalLocalInputs& in, LayerCache* cache) {
  const at::Tensor h = x + self_attn(input_layernorm(x), sliding_ ? in.local : in.global, cache);
  return h + mlp(post_attention_layernorm(h));
}

GptOssForCausalLMImpl::GptOssForCausalLMImpl(const GptOssOptions& o) : HfDecoderLM(o, gpt_oss_keys()) {
  const at::TensorOptions t = tensor_options();
  routing_.loss->coef = o.output_router_logits ? o.router_aux_loss_coef : 0.0;
  routing_.loss->sparse_layers = o.num_hidden_layers;
  build_backbone([&](int64_t i) { return GptOssDecoderLayer(o, t, i, routing_.loss, routing_.scale); },
                 Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t));
  inv_freq_ = o.yarn ? yarn_inv_freq(o.head_dim, o.rope_theta, *o.yarn) : rotary_inv_freq(o.head_dim, o.rope_theta);
  rope_scale_ = o.yarn ? yarn_attention_factor(*o.yarn) : 1.0;
  window_ = o.sliding_window;
}

void GptOssForCausalLMImpl::init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select) {
  HfDecoderLM::init_weights(seed, select);
  // GptOssPreTrainedModel._init_weights: the sinks, the stacked experts' weights and the routers' biases normal(0,
  // std) (the experts' biases 0), each module from its own generator.
  const double std = o_.initializer_range;
  at::NoGradGuard no_grad;
  for (const auto& item : named_modules()) {
    if (select && !select(item.key())) continue;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(module_seed(seed, item.key()));
    if (auto* attn = item.value()->as<SelfAttentionImpl>(); attn && attn->sinks.defined()) {
      normal_from(attn->sinks, 0.0, std, gen);
    } else if (auto* e = item.value()->as<GptOssExpertsImpl>()) {
      normal_from(e->gate_up_proj, 0.0, std, gen);
      normal_from(e->down_proj, 0.0, std, gen);
      e->gate_up_proj_bias.zero_();
      e->down_proj_bias.zero_();
    } else if (item.key().ends_with(".mlp.router")) {  // the module's seed drew its weight: the bias its own seed
      at::Generator bias_gen = at::make_generator<at::CPUGeneratorImpl>(module_seed(seed, item.key() + ".bias"));
      normal_from(item.value()->as<LinearImpl>()->bias, 0.0, std, bias_gen);
    }
  }
}

int64_t GptOssForCausalLMImpl::num_active_params() const {
  const int64_t d = o_.hidden_size, f = o_.intermediate_size;
  const int64_t per_expert = d * 2 * f + 2 * f + f * d + d;
  return num_params() - o_.num_hidden_layers * (o_.num_local_experts - o_.num_experts_per_tok) * per_expert;
}

void GptOssForCausalLMImpl::begin_forward(const DecoderCall& call) {
  for (const auto& layer : *model->layers) layer->as<GptOssDecoderLayerImpl>()->mlp->records.clear();
  routing_.begin(is_training(), o_.num_local_experts, call.ids, call.key_mask);
}

std::vector<std::pair<std::string, at::Tensor>> GptOssForCausalLMImpl::expert_token_counts() const {
  return expert_counts_by_layer(o_.num_hidden_layers, [this](int64_t i) {
    return &model->layers->ptr(i)->as<GptOssDecoderLayerImpl>()->mlp->records;
  });
}

void GptOssForCausalLMImpl::check_tensor_parallel(int64_t degree) const {
  refuse_tensor_parallel(degree, "gpt-oss's experts do not split over a tensor-parallel group; use expert parallelism");
}

std::string GptOssForCausalLMImpl::describe_more() const {
  const auto sliding = std::count(o_.layer_types.begin(), o_.layer_types.end(), "sliding_attention");
  return fmt::format(", {} of {} experts in every layer, {} sliding layers (window {}), attention sinks{}",
                     o_.num_experts_per_tok, o_.num_local_experts, sliding, o_.sliding_window,
                     o_.yarn ? fmt::format(", yarn x{}", o_.yarn->factor) : "");
}

}  // namespace tessera::models
