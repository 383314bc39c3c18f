// The Qwen3.5 family: options (recipe and config.json), the Gated DeltaNet linear attention with its chunked and
// recurrent gated delta rule, the gated full attention, the hybrid decoder and its initialisation.
#include "models/qwen3_5/qwen3_5.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "tessera/config/value.h"
#include "tessera/models/family_support.h"
#include "tessera/util/error.h"

namespace tessera::models {

// ---- Options --------------------------------------------------------------------------------------------------------

const FamilyKeys<Qwen35Options>& qwen3_5_keys() {
  using O = Qwen35Options;
  const FamilyKeys<O>::Types dense = {"qwen3_5_text"}, moe = {"qwen3_5_moe_text"};
  static const FamilyKeys<O> keys =
      FamilyKeys<O>({"qwen3_5_text", "qwen3_5_moe_text"},
                    [](const std::string& type) {
                      return type == "qwen3_5_text" ? "Qwen3_5ForCausalLM" : "Qwen3_5MoeForCausalLM";
                    })
          .defaults([](const std::string& type, O& o) {
            o.model_type = type;
            if (type == "qwen3_5_moe_text") {  // Qwen3_5MoeTextConfig's defaults (Qwen3.5-35B-A3B style)
              o.hidden_size = 2048;
              o.num_hidden_layers = 40;
              o.num_key_value_heads = 2;
              o.num_experts = 256;
              o.num_experts_per_tok = 8;
              o.moe_intermediate_size = 512;
              o.shared_expert_intermediate_size = 512;
            }
          })
          .field("vocab_size", &O::vocab_size, positive())
          .field("hidden_size", &O::hidden_size, positive())
          .field("intermediate_size", &O::intermediate_size, positive(), dense)
          .field("num_hidden_layers", &O::num_hidden_layers, positive())
          .field("num_attention_heads", &O::num_attention_heads, positive())
          .field("num_key_value_heads", &O::num_key_value_heads, positive())
          .divides("num_key_value_heads", &O::num_key_value_heads, "num_attention_heads", &O::num_attention_heads)
          .field("hidden_act", &O::hidden_act, hf_activation_check())
          .field("max_position_embeddings", &O::max_position_embeddings, positive())
          .field("initializer_range", &O::initializer_range)
          .field("rms_norm_eps", &O::rms_norm_eps, positive_real())
          .field("tie_word_embeddings", &O::tie_word_embeddings)
          .field("rope_theta", &O::rope_theta, positive_real())
          .field("attention_bias", &O::attention_bias)
          .field("attention_dropout", &O::attention_dropout, probability())
          .field("head_dim", &O::head_dim, positive())
          .partial_rotary_factor(&O::partial_rotary_factor, [](const O& o) { return o.head_dim; })
          // Published configs name the two output gates: the full attention's (sigmoid, always there) and the linear
          // attention's gated norm (norm(o) silu(z), "swish"); the recurrent state is float32 here as there.
          .fixed("attn_output_gate", true, "Qwen3.5's full attention always gates its output")
          .fixed("output_gate_type", std::string("swish"), "the linear attention's gate is silu (swish)")
          .fixed("mamba_ssm_dtype", std::string("float32"), "the recurrent state is kept in float32")
          .field("linear_conv_kernel_dim", &O::linear_conv_kernel_dim, positive())
          .field("linear_key_head_dim", &O::linear_key_head_dim, positive())
          .field("linear_value_head_dim", &O::linear_value_head_dim, positive())
          .field("linear_num_key_heads", &O::linear_num_key_heads, positive())
          .field("linear_num_value_heads", &O::linear_num_value_heads, positive())
          .divides("linear_num_key_heads", &O::linear_num_key_heads, "linear_num_value_heads",
                   &O::linear_num_value_heads)
          .field("full_attention_interval", &O::full_attention_interval, positive())
          .field("layer_types", &O::layer_types)
          .custom(
              "layer_types",
              [](config::Section& s, O& o) {
                if (o.layer_types.empty()) {  // transformers: full attention every full_attention_interval-th layer
                  for (int64_t i = 0; i < o.num_hidden_layers; ++i) {
                    o.layer_types.emplace_back((i + 1) % o.full_attention_interval != 0 ? "linear_attention"
                                                                                        : "full_attention");
                  }
                }
                s.check(static_cast<int64_t>(o.layer_types.size()) == o.num_hidden_layers, "layer_types",
                        fmt::format("has {} entries for {} layers", o.layer_types.size(), o.num_hidden_layers));
                for (const std::string& t : o.layer_types) {
                  s.check(t == "linear_attention" || t == "full_attention", "layer_types",
                          fmt::format("each entry is linear_attention or full_attention, got \"{}\"", t));
                }
              },
              nullptr)
          .field("num_experts", &O::num_experts, positive(), moe)
          .field("num_experts_per_tok", &O::num_experts_per_tok, positive(), moe)
          .field("moe_intermediate_size", &O::moe_intermediate_size, positive(), moe)
          .field("shared_expert_intermediate_size", &O::shared_expert_intermediate_size, positive(), moe)
          .field("output_router_logits", &O::output_router_logits, {}, moe)
          .field("router_aux_loss_coef", &O::router_aux_loss_coef, {}, moe)
          .token_ids()
          .pad_token_below_vocab()
          .finally([](config::Section& s, O& o) {
            if (!o.moe()) return;
            s.check(o.num_experts_per_tok <= o.num_experts, "num_experts_per_tok",
                    fmt::format("must not exceed num_experts ({})", o.num_experts));
            o.intermediate_size = o.moe_intermediate_size;  // what describe() and the planner show as the MLP's width
          })
          // The multi-token-prediction heads of published folders are not part of the causal LM (family.cpp).
          .hf_accepts({"mtp_num_hidden_layers", "mtp_use_dedicated_embeddings"});
  return keys;
}

SparseMoeOptions Qwen35Options::sparse_moe() const {
  return SparseMoeOptions{.num_experts = num_experts,
                          .top_k = num_experts_per_tok,
                          .hidden_size = hidden_size,
                          .ffn_hidden = moe_intermediate_size,
                          .shared_ffn_hidden = shared_expert_intermediate_size,
                          .qwen_names = true,
                          .norm_topk_prob = true};
}

Qwen35Inputs context_parallel_inputs(const Qwen35Inputs& in, std::shared_ptr<const ContextShard> shard,
                                     at::ScalarType dtype) {
  (void)in, (void)shard, (void)dtype;
  throw Error("model", "qwen3_5_text: linear attention runs along the whole sequence; it has no context-parallel form");
}

// ---- The gated delta rule -------------------------------------------------------------------------------------------

namespace {

at::Tensor l2norm(const at::Tensor& x) {
  return x * at::rsqrt((x * x).sum(-1, true) + 1e-6);
}

// (B, s, H, d) -> (B, H, s, d) float32, the key heads repeated for their value heads.
at::Tensor heads_first(const at::Tensor& x, int64_t repeat) {
  const at::Tensor r = repeat > 1 ? x.repeat_interleave(repeat, 2) : x;
  return r.transpose(1, 2).to(at::kFloat).contiguous();
}

}  // namespace

at::Tensor chunk_gated_delta_rule(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                  const at::Tensor& g_in, const at::Tensor& beta_in, at::Tensor& state, int64_t chunk) {
  const int64_t b = k_in.size(0), s = k_in.size(1), dk = k_in.size(3);
  const int64_t hv = v_in.size(2), dv = v_in.size(3), repeat = hv / k_in.size(2);
  at::Tensor q = l2norm(heads_first(q_in, repeat)), k = l2norm(heads_first(k_in, repeat));
  at::Tensor v = heads_first(v_in, 1);
  at::Tensor beta = beta_in.transpose(1, 2).to(at::kFloat), decay = g_in.transpose(1, 2).to(at::kFloat);
  q = q * std::pow(static_cast<double>(dk), -0.5);
  const int64_t pad = (chunk - s % chunk) % chunk, n = (s + pad) / chunk;
  q = at::constant_pad_nd(q, {0, 0, 0, pad});
  k = at::constant_pad_nd(k, {0, 0, 0, pad});
  v = at::constant_pad_nd(v, {0, 0, 0, pad});
  beta = at::constant_pad_nd(beta, {0, pad});
  decay = at::constant_pad_nd(decay, {0, pad});
  const at::Tensor v_beta = (v * beta.unsqueeze(-1)).reshape({b, hv, n, chunk, dv});
  const at::Tensor k_beta = (k * beta.unsqueeze(-1)).reshape({b, hv, n, chunk, dk});
  q = q.reshape({b, hv, n, chunk, dk});
  k = k.reshape({b, hv, n, chunk, dk});
  const at::Tensor cum = decay.reshape({b, hv, n, chunk}).cumsum(3);
  const at::Tensor upper = at::ones({chunk, chunk}, q.options().dtype(at::kBool)).triu(1);
  const at::Tensor pairwise = (cum.unsqueeze(4) - cum.unsqueeze(3)).masked_fill(upper, -INFINITY).exp();
  const at::Tensor system = at::matmul(k_beta, k.transpose(-1, -2)) * pairwise;
  const at::Tensor intra = at::matmul(q, k.transpose(-1, -2)) * pairwise;
  const at::Tensor decayed_k_beta = k_beta * cum.exp().unsqueeze(-1);
  // The unit lower-triangular system (I + strictly lower part of `system`), as torch.linalg.solve_triangular.
  const at::Tensor new_values = at::linalg_solve_triangular(system, v_beta, /*upper=*/false, true, true);
  const at::Tensor k_cumdecay = at::linalg_solve_triangular(system, decayed_k_beta, false, true, true);
  at::Tensor last = state.defined() ? state.to(at::kFloat) : at::zeros({b, hv, dk, dv}, q.options());
  at::Tensor out = at::zeros_like(new_values);
  const at::Tensor qd = q * cum.exp().unsqueeze(-1);
  const at::Tensor kd = k * (cum.narrow(3, chunk - 1, 1) - cum).exp().unsqueeze(-1);
  const at::Tensor chunk_decay = cum.select(3, chunk - 1).exp().unsqueeze(-1).unsqueeze(-1);
  for (int64_t i = 0; i < n; ++i) {
    const at::Tensor v_new = new_values.select(2, i) - at::matmul(k_cumdecay.select(2, i), last);
    out.select(2, i).copy_(at::matmul(qd.select(2, i), last) + at::matmul(intra.select(2, i), v_new));
    last = last * chunk_decay.select(2, i) + at::matmul(kd.select(2, i).transpose(-1, -2), v_new);
  }
  state = last;
  return out.reshape({b, hv, -1, dv}).narrow(2, 0, s).transpose(1, 2).to(v_in.scalar_type()).contiguous();
}

at::Tensor recurrent_gated_delta_rule(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                      const at::Tensor& g_in, const at::Tensor& beta_in, at::Tensor& state) {
  const int64_t b = k_in.size(0), s = k_in.size(1), dk = k_in.size(3);
  const int64_t hv = v_in.size(2), dv = v_in.size(3), repeat = hv / k_in.size(2);
  const at::Tensor q = l2norm(heads_first(q_in, repeat)) / std::sqrt(static_cast<double>(dk));
  const at::Tensor k = l2norm(heads_first(k_in, repeat)), v = heads_first(v_in, 1);
  const at::Tensor beta = beta_in.transpose(1, 2).to(at::kFloat), decay = g_in.transpose(1, 2).to(at::kFloat);
  at::Tensor last = state.defined() ? state.to(at::kFloat) : at::zeros({b, hv, dk, dv}, q.options());
  at::Tensor out = at::zeros_like(v);
  for (int64_t t = 0; t < s; ++t) {
    const at::Tensor k_t = k.select(2, t), q_t = q.select(2, t);
    last = last * decay.select(2, t).exp().unsqueeze(-1).unsqueeze(-1);
    const at::Tensor memory = (last * k_t.unsqueeze(-1)).sum(-2);
    const at::Tensor delta = (v.select(2, t) - memory) * beta.select(2, t).unsqueeze(-1);
    last = last + k_t.unsqueeze(-1) * delta.unsqueeze(-2);
    out.select(2, t).copy_((last * q_t.unsqueeze(-1)).sum(-2));
  }
  state = last;
  return out.transpose(1, 2).contiguous().to(v_in.scalar_type());
}

// ---- Modules --------------------------------------------------------------------------------------------------------

DepthwiseConv1dImpl::DepthwiseConv1dImpl(int64_t channels, int64_t kernel, const at::TensorOptions& t) {
  weight = register_parameter("weight", at::empty({channels, 1, kernel}, t));
}

Qwen35GatedDeltaNetImpl::Qwen35GatedDeltaNetImpl(const Qwen35Options& o, const at::TensorOptions& t) : o_(o) {
  const int64_t key_dim = o.linear_num_key_heads * o.linear_key_head_dim;
  const int64_t value_dim = o.linear_num_value_heads * o.linear_value_head_dim;
  // transformers' registration order: Qwen3NextGatedDeltaNet's, then Qwen3.5's four input projections.
  conv1d = register_module("conv1d", DepthwiseConv1d(2 * key_dim + value_dim, o.linear_conv_kernel_dim, t));
  dt_bias = register_parameter("dt_bias", at::ones({o.linear_num_value_heads}, t));
  A_log = register_parameter("A_log", at::zeros({o.linear_num_value_heads}, t));
  norm = register_module("norm", Norm(o.linear_value_head_dim, NormType::kRMSNorm, o.rms_norm_eps, false, t));
  out_proj = register_module("out_proj", Linear(value_dim, o.hidden_size, false, t));
  in_proj_qkv = register_module("in_proj_qkv", Linear(o.hidden_size, 2 * key_dim + value_dim, false, t));
  in_proj_z = register_module("in_proj_z", Linear(o.hidden_size, value_dim, false, t));
  in_proj_b = register_module("in_proj_b", Linear(o.hidden_size, o.linear_num_value_heads, false, t));
  in_proj_a = register_module("in_proj_a", Linear(o.hidden_size, o.linear_num_value_heads, false, t));
}

at::Tensor Qwen35GatedDeltaNetImpl::forward(const at::Tensor& x_in, const at::Tensor& padding, LayerCache* cache) {
  const at::Tensor x = padding.defined() ? x_in * padding.unsqueeze(-1).to(x_in.scalar_type()) : x_in;
  const int64_t b = x.size(0), s = x.size(1), kernel = o_.linear_conv_kernel_dim;
  const int64_t key_dim = o_.linear_num_key_heads * o_.linear_key_head_dim;
  // The causal depthwise convolution over [the window before | these positions]: zeros before the sequence.
  const at::Tensor mixed = in_proj_qkv(x).transpose(1, 2);  // (B, channels, s)
  const at::Tensor window = cache && cache->conv_state.defined()
                                ? cache->conv_state.to(mixed.scalar_type())
                                : at::zeros({b, mixed.size(1), kernel - 1}, mixed.options());
  const at::Tensor full = at::cat({window, mixed}, 2);
  if (cache) cache->conv_state = full.narrow(2, full.size(2) - (kernel - 1), kernel - 1).detach();
  const at::Tensor conv = hf_activation(
      o_.hidden_act, at::conv1d(full, conv1d->weight.to(full.scalar_type()), at::Tensor(), at::IntArrayRef{1},
                                at::IntArrayRef{0}, at::IntArrayRef{1}, full.size(1)));
  const at::Tensor qkv = conv.transpose(1, 2);  // (B, s, channels)
  const at::Tensor q = qkv.narrow(2, 0, key_dim).reshape({b, s, -1, o_.linear_key_head_dim});
  const at::Tensor k = qkv.narrow(2, key_dim, key_dim).reshape({b, s, -1, o_.linear_key_head_dim});
  const at::Tensor v =
      qkv.narrow(2, 2 * key_dim, qkv.size(2) - 2 * key_dim).reshape({b, s, -1, o_.linear_value_head_dim});
  const at::Tensor beta = at::sigmoid(in_proj_b(x));
  // float32 as transformers: in fp16, exp(A_log) could overflow.
  const at::Tensor g = -A_log.to(at::kFloat).exp() * at::softplus(in_proj_a(x).to(at::kFloat) + dt_bias);
  at::Tensor state = cache ? cache->recurrent_state : at::Tensor();
  const at::Tensor core = state.defined() && s == 1 ? recurrent_gated_delta_rule(q, k, v, g, beta, state)
                                                    : chunk_gated_delta_rule(q, k, v, g, beta, state);
  if (cache) cache->recurrent_state = state.detach();
  // The gated RMSNorm: norm(o) (its weight) in o's dtype, times silu(z) computed in float32.
  const at::Tensor z = in_proj_z(x).reshape({-1, o_.linear_value_head_dim});
  const at::Tensor normed = norm(core.reshape({-1, o_.linear_value_head_dim})).to(core.scalar_type());
  const at::Tensor gated = (normed * at::silu(z.to(at::kFloat))).to(core.scalar_type());
  return out_proj(gated.reshape({b, s, -1}));
}

Qwen35DecoderLayerImpl::Qwen35DecoderLayerImpl(const Qwen35Options& o, int64_t layer, const at::TensorOptions& t,
                                               std::shared_ptr<HfRouterLoss> router_loss,
                                               std::shared_ptr<AuxLossScale> aux_scale) {
  if (o.linear(layer)) {
    linear_attn = register_module("linear_attn", Qwen35GatedDeltaNet(o, t));
  } else {
    self_attn =
        register_module("self_attn", SelfAttention(SelfAttentionOptions{.hidden_size = o.hidden_size,
                                                                        .heads = o.num_attention_heads,
                                                                        .kv_heads = o.num_key_value_heads,
                                                                        .head_dim = o.head_dim,
                                                                        .qkv_bias = o.attention_bias,
                                                                        .out_bias = o.attention_bias,
                                                                        .qk_norm = QKNorm::kPerHead,
                                                                        .qk_norm_type = NormType::kOffsetRMSNorm,
                                                                        .qk_norm_eps = o.rms_norm_eps,
                                                                        .dropout = o.attention_dropout,
                                                                        .output_gate = true},
                                                   t));
  }
  if (o.moe()) {
    moe = register_module("mlp", SparseMoeBlock(o.sparse_moe(), t, std::move(router_loss),
                                                aux_scale ? std::move(aux_scale) : std::make_shared<AuxLossScale>()));
  } else {
    mlp = register_module("mlp", GatedMLP(o.hidden_size, o.intermediate_size, o.hidden_act, false, t));
  }
  auto make_norm = [&] { return Norm(o.hidden_size, NormType::kOffsetRMSNorm, o.rms_norm_eps, false, t); };
  input_layernorm = register_module("input_layernorm", make_norm());
  post_attention_layernorm = register_module("post_attention_layernorm", make_norm());
}

at::Tensor Qwen35DecoderLayerImpl::forward(const at::Tensor& x, const Qwen35Inputs& in, LayerCache* cache) {
  const at::Tensor normed = input_layernorm(x);
  const at::Tensor mixed =
      linear_attn ? linear_attn(normed, in.padding, cache) : self_attn(normed, in.attention, cache);
  const at::Tensor h = x + mixed;
  const at::Tensor normed_h = post_attention_layernorm(h);
  return h + (moe ? moe(normed_h) : mlp(normed_h));
}

Qwen35ForCausalLMImpl::Qwen35ForCausalLMImpl(const Qwen35Options& o) : HfDecoderLM(o, qwen3_5_keys()) {
  const at::TensorOptions t = tensor_options();
  routing_.loss->coef = o.output_router_logits ? o.router_aux_loss_coef : 0.0;
  routing_.loss->sparse_layers = o.moe() ? o.num_hidden_layers : 0;
  build_backbone([&](int64_t i) { return Qwen35DecoderLayer(o, i, t, routing_.loss, routing_.scale); },
                 Norm(o.hidden_size, NormType::kOffsetRMSNorm, o.rms_norm_eps, false, t));
  inv_freq_ = rotary_inv_freq(o.rotary_dims(), o.rope_theta);
}

Qwen35Inputs Qwen35ForCausalLMImpl::attention_inputs(const DecoderCall& call) {
  if (call.fo.sequence_id) {
    throw Error("model",
                "qwen3_5_text: packed documents (sequence_id) are not supported: the linear attention's "
                "convolution and recurrent state would run across documents");
  }
  Qwen35Inputs in{rotary_causal_inputs(call, inv_freq_)};
  // transformers' create_recurrent_attention_mask: the new positions' padding, none for a one-token step.
  if (call.key_mask.defined() && call.s > 1) in.padding = call.key_mask.narrow(1, call.past, call.s);
  return in;
}

void Qwen35ForCausalLMImpl::init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select) {
  HfDecoderLM::init_weights(seed, select);
  // Qwen3_5PreTrainedModel._init_weights: the convolution normal(0, initializer_range) (as every Conv1d), dt_bias 1,
  // A_log log U(0.01, 16); each from its module's own generator.
  at::NoGradGuard no_grad;
  for (const auto& item : named_modules()) {
    if (select && !select(item.key())) continue;
    auto* net = item.value()->as<Qwen35GatedDeltaNetImpl>();
    if (net == nullptr) continue;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(module_seed(seed, item.key()));
    normal_from(net->conv1d->weight, 0.0, o_.initializer_range, gen);
    net->dt_bias.fill_(1.0);
    uniform_from(net->A_log, 0.01, 16.0, gen);
    net->A_log.log_();
  }
}

void Qwen35ForCausalLMImpl::begin_forward(const DecoderCall& call) {
  if (!o_.moe()) return;
  for (const auto& layer : *model->layers) layer->as<Qwen35DecoderLayerImpl>()->moe->records.clear();
  routing_.begin(is_training(), o_.num_experts, call.ids, call.key_mask);
}

void Qwen35ForCausalLMImpl::end_forward() {
  if (o_.moe()) routing_.end();
}

std::vector<std::pair<std::string, at::Tensor>> Qwen35ForCausalLMImpl::expert_token_counts() const {
  return expert_counts_by_layer(o_.num_hidden_layers, [this](int64_t i) -> const std::vector<at::Tensor>* {
    const auto& moe = model->layers->ptr(i)->as<Qwen35DecoderLayerImpl>()->moe;
    return moe ? &moe->records : nullptr;
  });
}

int64_t Qwen35ForCausalLMImpl::num_active_params() const {
  if (!o_.moe()) return num_params();
  const SparseMoeOptions m = o_.sparse_moe();
  return num_params() - o_.num_hidden_layers * (sparse_moe_params(m) - sparse_moe_active_params(m));
}

void Qwen35ForCausalLMImpl::check_tensor_parallel(int64_t degree) const {
  refuse_tensor_parallel(degree, "Qwen3.5's linear-attention layers have no tensor-parallel split yet");
}

std::string Qwen35ForCausalLMImpl::describe_more() const {
  const auto linear = std::count(o_.layer_types.begin(), o_.layer_types.end(), "linear_attention");
  return fmt::format(
      ", {} linear-attention layers ({} key / {} value heads of {} / {}), rope theta {} on {} dims{}", linear,
      o_.linear_num_key_heads, o_.linear_num_value_heads, o_.linear_key_head_dim, o_.linear_value_head_dim,
      o_.rope_theta, o_.rotary_dims(),
      o_.moe() ? fmt::format(", {} experts of {} (top {}) and a shared expert of {} in every layer", o_.num_experts,
                             o_.moe_intermediate_size, o_.num_experts_per_tok, o_.shared_expert_intermediate_size)
               : "");
}

}  // namespace tessera::models
