// The shared q/k/v/o attention module and gated MLP.
#include "tessera/models/blocks/self_attention.h"

#include <cmath>

namespace tessera::models {

SelfAttentionImpl::SelfAttentionImpl(const SelfAttentionOptions& o, const at::TensorOptions& t) : o_(o) {
  const int64_t d = o.hidden_size, hd = o.hd(), q_width = o.heads * hd, kv_width = o.kv() * hd;
  auto projection = [&](const char* name, int64_t width) {
    return register_module(name, Linear(d, width, o.qkv_bias, t));
  };
  const int64_t q_out = o.output_gate ? 2 * q_width : q_width;
  if (o.kv_first) {
    k_proj = projection("k_proj", kv_width);
    v_proj = projection("v_proj", kv_width);
    q_proj = projection("q_proj", q_out);
  } else {
    q_proj = projection("q_proj", q_out);
    k_proj = projection("k_proj", kv_width);
    v_proj = projection("v_proj", kv_width);
  }
  o_proj = register_module(o.out_name, Linear(q_width, d, o.out_bias, t));
  if (o.sinks) sinks = register_parameter("sinks", at::zeros({o.heads}, t));
  if (o.qk_norm != QKNorm::kNone) {
    const bool whole = o.qk_norm == QKNorm::kWhole;
    q_norm = register_module("q_norm", Norm(whole ? q_width : hd, o.qk_norm_type, o.qk_norm_eps, false, t));
    k_norm = register_module("k_norm", Norm(whole ? kv_width : hd, o.qk_norm_type, o.qk_norm_eps, false, t));
  }
}

at::Tensor SelfAttentionImpl::forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache) {
  const int64_t hd = o_.hd();
  at::Tensor q = q_proj(x), k = k_proj(x), gate;
  const int64_t b = q.size(0), s = q.size(1);
  if (o_.output_gate) {  // per head [query | gate]
    const auto halves = q.reshape({b, s, -1, 2 * hd}).chunk(2, -1);
    q = halves[0];
    gate = halves[1].reshape({b, s, -1});
  }
  // The norms keep the projection's dtype (an fp32 weight would promote a bf16 projection).
  auto norm = [](Norm& n, const at::Tensor& t) { return n(t).to(t.scalar_type()); };
  if (o_.qk_norm == QKNorm::kWhole) {
    q = norm(q_norm, q);
    k = norm(k_norm, k);
  }
  q = q.reshape({b, s, -1, hd});
  k = k.reshape({b, s, -1, hd});
  if (o_.qk_norm == QKNorm::kPerHead) {
    q = norm(q_norm, q);
    k = norm(k_norm, k);
  }
  if (in.rope_cos.defined()) {
    const auto rotate = o_.interleaved_rotary ? &apply_rotary_interleaved : &apply_rotary;
    q = rotate(q, in.rope_cos, in.rope_sin);
    k = rotate(k, in.rope_cos, in.rope_sin);
  }
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  at::Tensor v = v_proj(x).reshape({b, s, -1, hd}).transpose(1, 2);
  append_to_cache(cache, k, v);
  const double scale = o_.scale > 0 ? o_.scale : 1.0 / std::sqrt(static_cast<double>(hd));
  const at::Tensor context = attend(q, k, v, in, scale, is_training() ? o_.dropout : 0.0, is_training(), sinks);
  const at::Tensor out = context.transpose(1, 2).reshape({b, s, -1});
  return o_proj(gate.defined() ? out * at::sigmoid(gate) : out);
}

GatedMLPImpl::GatedMLPImpl(int64_t hidden_size, int64_t intermediate_size, const std::string& act, bool bias,
                           const at::TensorOptions& t, bool fused)
    : act_(act) {
  if (fused) {
    gate_up_proj = register_module("gate_up_proj", Linear(hidden_size, 2 * intermediate_size, bias, t));
  } else {
    gate_proj = register_module("gate_proj", Linear(hidden_size, intermediate_size, bias, t));
    up_proj = register_module("up_proj", Linear(hidden_size, intermediate_size, bias, t));
  }
  down_proj = register_module("down_proj", Linear(intermediate_size, hidden_size, bias, t));
}

at::Tensor GatedMLPImpl::forward(const at::Tensor& x) {
  if (gate_up_proj) {
    const auto halves = gate_up_proj(x).chunk(2, -1);  // [gate | up], this rank's share of each under a split
    return down_proj(halves[1] * hf_activation(act_, halves[0]));
  }
  return down_proj(hf_activation(act_, gate_proj(x)) * up_proj(x));
}

}  // namespace tessera::models
