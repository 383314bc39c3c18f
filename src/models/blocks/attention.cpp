// The attention primitives the families share: masks, positions, ALiBi slopes, rotary embeddings, the KV cache and
// grouped-query scaled_dot_product_attention, with a reference path for testing.
#include "tessera/models/blocks/attention.h"

#include <ATen/autocast_mode.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <limits>

namespace tessera::models {
namespace {

// The most negative finite value of a floating dtype (torch.finfo(dtype).min), for masking scores in that dtype.
double lowest_value(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16:
      return static_cast<double>(std::numeric_limits<c10::BFloat16>::lowest());
    case at::kHalf:
      return static_cast<double>(std::numeric_limits<c10::Half>::lowest());
    case at::kDouble:
      return std::numeric_limits<double>::lowest();
    default:
      return static_cast<double>(std::numeric_limits<float>::lowest());
  }
}

}  // namespace

at::ScalarType compute_dtype(const at::Tensor& param) {
  // A parameter this rank does not hold (another pipeline stage's: `meta`): the autocast of the device computing.
  const at::DeviceType device = !param.is_meta()                               ? param.device().type()
                                : at::autocast::is_autocast_enabled(at::kCUDA) ? at::kCUDA
                                                                               : at::kCPU;
  if (at::autocast::is_autocast_enabled(device)) return at::autocast::get_autocast_dtype(device);
  return param.scalar_type();
}

at::Tensor key_padding_mask(const at::Tensor& ids, const ForwardOptions& fo) {
  const KVCache* cache = fo.cache;
  const bool cached = cache != nullptr && cache->attention_mask.defined();
  if (!fo.attention_mask && !cached) return {};
  const at::Tensor now = fo.attention_mask ? fo.attention_mask->to(at::kBool)
                                           : at::ones({ids.size(0), ids.size(1)}, ids.options().dtype(at::kBool));
  return cached ? at::cat({cache->attention_mask, now}, 1) : now;
}

at::Tensor positions_after_padding(const at::Tensor& key_mask, int64_t past, int64_t s,
                                   const at::TensorOptions& options) {
  const at::Tensor pos = at::arange(past, past + s, options.dtype(at::kLong)).unsqueeze(0);
  if (!key_mask.defined()) return pos;
  const at::Tensor pads = at::cumsum(key_mask.logical_not().to(at::kLong), 1).narrow(1, past, s);
  return at::clamp_min(pos - pads, 0);
}

at::Tensor document_positions(const at::Tensor& sid) {
  const int64_t s = sid.size(1);
  const at::Tensor index = at::arange(s, sid.options().dtype(at::kLong)).unsqueeze(0).expand_as(sid);
  at::Tensor starts = at::ones_like(sid, at::kBool);
  starts.narrow(1, 1, s - 1).copy_(sid.narrow(1, 1, s - 1) != sid.narrow(1, 0, s - 1));
  const at::Tensor doc_start = std::get<0>(at::cummax(at::where(starts, index, at::zeros_like(index)), 1));
  return index - doc_start;
}

AttentionInputs causal_attention_inputs(const at::Tensor& ids, const ForwardOptions& fo, int64_t past,
                                        const at::Tensor& key_mask, at::ScalarType dtype, int64_t sliding_window) {
  AttentionInputs in;
  in.past = past;
  in.reference = fo.reference_attention;
  const int64_t s_q = ids.size(1), s_k = past + s_q;
  const bool padding = key_mask.defined() && !key_mask.all().item<bool>();
  const bool seq_ids = fo.sequence_id.has_value();
  const bool windowed = sliding_window > 0 && s_k > sliding_window;
  if (!padding && !seq_ids && !windowed && !(past > 0 && s_q > 1)) {
    in.is_causal = past == 0;
    return in;
  }
  const auto lopts = ids.options().dtype(at::kLong);
  const at::Tensor qpos = at::arange(past, s_k, lopts).unsqueeze(1), kpos = at::arange(0, s_k, lopts).unsqueeze(0);
  at::Tensor blocked = (kpos > qpos).view({1, 1, s_q, s_k});
  if (windowed) blocked = blocked | (kpos <= qpos - sliding_window).view({1, 1, s_q, s_k});
  if (padding) blocked = blocked | key_mask.logical_not().view({ids.size(0), 1, 1, s_k});
  if (seq_ids) {
    TORCH_CHECK(past == 0, "sequence_id cannot be combined with a KV cache");
    const at::Tensor& sid = *fo.sequence_id;
    blocked = blocked | (sid.unsqueeze(2) != sid.unsqueeze(1)).unsqueeze(1);
  }
  in.mask = at::zeros(blocked.sizes(), ids.options().dtype(at::kFloat))
                .masked_fill(blocked, std::numeric_limits<float>::lowest())
                .to(dtype);
  return in;
}

at::Tensor token_positions(const at::Tensor& ids, const ForwardOptions& fo, int64_t past, const at::Tensor& key_mask) {
  if (fo.sequence_id) return document_positions(*fo.sequence_id);
  return positions_after_padding(key_mask, past, ids.size(1), ids.options());
}

void set_rope_tables(AttentionInputs& in, const at::Tensor& positions, const at::Tensor& inv_freq) {
  const at::Tensor freqs = positions.to(at::kFloat).unsqueeze(-1) * inv_freq.to(positions.device()).view({1, 1, -1});
  in.rope_cos = freqs.cos();
  in.rope_sin = freqs.sin();
}

at::Tensor alibi_slopes(int64_t n_heads, double alibi_bias_max) {
  const int64_t n = int64_t{1} << static_cast<int64_t>(std::ceil(std::log2(static_cast<double>(n_heads))));
  at::Tensor m = at::arange(1, n + 1, at::kFloat) * static_cast<float>(alibi_bias_max / static_cast<double>(n));
  at::Tensor slopes = 1.0 / at::pow(2, m);
  if (n != n_heads) {
    using at::indexing::None;
    using at::indexing::Slice;
    slopes = at::cat({slopes.index({Slice(1, None, 2)}), slopes.index({Slice(None, None, 2)})}).slice(0, 0, n_heads);
  }
  return slopes;
}

at::Tensor rotary_inv_freq(int64_t head_dim, double theta) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  return 1.0 / at::pow(theta, at::arange(0, head_dim, 2, f32) / static_cast<double>(head_dim));
}

double yarn_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

double yarn_attention_factor(const YarnRope& y) {
  if (y.attention_factor) return *y.attention_factor;
  if (y.mscale && *y.mscale != 0 && y.mscale_all_dim && *y.mscale_all_dim != 0) {
    return yarn_mscale(y.factor, *y.mscale) / yarn_mscale(y.factor, *y.mscale_all_dim);
  }
  return yarn_mscale(y.factor, 1.0);
}

at::Tensor yarn_inv_freq(int64_t dim, double theta, const YarnRope& y) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  // As transformers computes them, in float32: pos_freqs = theta ** (arange(0, dim, 2) / dim).
  const at::Tensor pos_freqs = at::pow(theta, at::arange(0, dim, 2, f32) / static_cast<double>(dim));
  const at::Tensor extrapolation = 1.0 / pos_freqs, interpolation = 1.0 / (y.factor * pos_freqs);
  const double d = static_cast<double>(dim), len = static_cast<double>(y.original_max_position_embeddings);
  auto correction_dim = [&](double rotations) {
    return d * std::log(len / (rotations * 2 * M_PI)) / (2 * std::log(theta));
  };
  double low = correction_dim(y.beta_fast), high = correction_dim(y.beta_slow);
  if (y.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, d - 1);
  if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
  const at::Tensor ramp = ((at::arange(dim / 2, f32) - low) / (high - low)).clamp(0, 1);
  const at::Tensor extrapolated = 1 - ramp;
  return interpolation * (1 - extrapolated) + extrapolation * extrapolated;
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  // x: (B, S, H, hd); cos/sin: (S, r/2) or (B, S, r/2) -> broadcast over heads (and batch). With r < hd (partial
  // rotary) the first r features of each head rotate and the rest pass through.
  const int64_t rotary = 2 * cos.size(-1), hd = x.size(-1);
  if (rotary < hd) {
    return at::cat({apply_rotary(x.narrow(-1, 0, rotary), cos, sin), x.narrow(-1, rotary, hd - rotary)}, -1);
  }
  const int64_t half = hd / 2;
  const at::Tensor x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
  const at::Tensor c = cos.unsqueeze(-2).to(x.scalar_type()), s = sin.unsqueeze(-2).to(x.scalar_type());
  return at::cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1);
}

at::Tensor apply_rotary_interleaved(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = cos.size(-1), rotary = 2 * half, hd = x.size(-1);
  if (rotary < hd) {
    return at::cat({apply_rotary_interleaved(x.narrow(-1, 0, rotary), cos, sin), x.narrow(-1, rotary, hd - rotary)},
                   -1);
  }
  const at::Tensor pairs = x.unflatten(-1, {half, 2});
  const at::Tensor x1 = pairs.select(-1, 0), x2 = pairs.select(-1, 1);
  const at::Tensor c = cos.unsqueeze(-2).to(x.scalar_type()), s = sin.unsqueeze(-2).to(x.scalar_type());
  return at::stack({x1 * c - x2 * s, x2 * c + x1 * s}, -1).flatten(-2);
}

void append_to_cache(LayerCache* cache, at::Tensor& k, at::Tensor& v) {
  if (cache == nullptr) return;
  if (cache->key.defined()) {
    k = at::cat({cache->key, k}, 2);
    v = at::cat({cache->value, v}, 2);
  }
  cache->key = k;
  cache->value = v;
}

namespace {

at::Tensor attend_gathered(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionInputs& in,
                           double scale, double dropout, bool training, const at::Tensor& sinks) {
  const int64_t s = q.size(2), h = q.size(1), kv = k.size(1);
  at::Tensor context;
  // Kernel choice: on CPU, ATen's fused SDPA is slower than the explicit softmax path in bf16 for short keys (about
  // 2x at 128 and 1.6x at 256 keys, forward + backward; bench_attention_variants, docs/performance.md) and faster
  // everywhere else. Both compute the same attention.
  const bool short_bf16_on_cpu =
      q.device().is_cpu() && q.scalar_type() == at::kBFloat16 && k.size(2) <= 256 && dropout == 0.0;
  if (in.reference || short_bf16_on_cpu || in.softcap > 0 || sinks.defined()) {
    // Plain path: kv head g serves query heads g * n_rep .. g * n_rep + n_rep - 1, as LLM Foundry's repeat_kv_for_gqa.
    const int64_t rep = h / kv;
    const at::Tensor kf = rep > 1 ? k.repeat_interleave(rep, 1) : k, vf = rep > 1 ? v.repeat_interleave(rep, 1) : v;
    at::Tensor scores = at::matmul(q, kf.transpose(-1, -2)) * scale;  // (B, H, s_q, s_k)
    if (in.softcap > 0) scores = at::tanh(scores / in.softcap) * in.softcap;
    if (in.mask) scores = scores + *in.mask;
    if (in.is_causal) {
      const int64_t sk = kf.size(2);
      const at::Tensor future = at::ones({s, sk}, q.options().dtype(at::kBool)).triu(sk - s + 1);
      scores = scores.masked_fill(future, lowest_value(scores.scalar_type()));
    }
    at::Tensor weights;
    if (sinks.defined()) {
      // transformers' gpt-oss: the sink logit as one more column, the row's maximum subtracted, the softmax, the
      // sink's column dropped.
      const int64_t sk = scores.size(-1);
      const at::Tensor sink = sinks.to(scores.scalar_type()).view({1, -1, 1, 1}).expand({q.size(0), h, s, 1});
      at::Tensor combined = at::cat({scores, sink}, -1);
      combined = combined - std::get<0>(combined.max(-1, /*keepdim=*/true));
      weights = at::softmax(combined, -1).narrow(-1, 0, sk);
    } else {
      weights = at::softmax(scores, -1);
    }
    weights = at::dropout(weights, dropout, training);
    return at::matmul(weights, vf);
  }
  // An additive mask (ALiBi, padding) rules out the flash kernel, and CUDA's memory-efficient kernel, the one that
  // takes a mask, does not take grouped K/V (torch 2.11 would fall back to the math kernel, which materialises the
  // scores): on a GPU, grouped K/V with a mask are expanded to one head per query head first.
  if (in.mask && kv != h && q.is_cuda()) {
    const int64_t rep = h / kv;
    return at::scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), in.mask,
                                            dropout, in.is_causal, scale, /*enable_gqa=*/false);
  }
  return at::scaled_dot_product_attention(q, k, v, in.mask, dropout, in.is_causal, scale, /*enable_gqa=*/kv != h);
}

}  // namespace

at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionInputs& in,
                  double scale, double dropout, bool training, const at::Tensor& sinks) {
  if (!in.context) return attend_gathered(q, k, v, in, scale, dropout, training, sinks);
  // Context parallelism: this rank's queries over every rank's keys and values (the mask's columns follow their order).
  ContextExchange& exchange = *in.context->exchange;
  return attend_gathered(q, exchange.whole_sequence(k, 2), exchange.whole_sequence(v, 2), in, scale, dropout, training,
                         sinks);
}

}  // namespace tessera::models
