// Attention as every family computes it: padding masks and positions, ALiBi slopes, rotary embeddings, the KV cache,
// and grouped-query scaled_dot_product_attention with ALiBi / causal / sliding-window / packed-document / padding
// masks (or the explicit softmax path). Each family's attention module projects, splits and combines heads its own
// way and calls attend().
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/modules/container/modulelist.h>

#include <optional>
#include <vector>

#include "tessera/models/causal_lm.h"
#include "tessera/models/context_parallel.h"

namespace tessera::models {

// The dtype a forward computes in: the autocast dtype of `param`'s device when autocast is on, else param's own.
at::ScalarType compute_dtype(const at::Tensor& param);

// The key padding mask over the cached and new positions of a forward on `ids` (B, S): (B, past + S) bool, true =
// real token; undefined when neither `fo` nor its cache has a mask.
at::Tensor key_padding_mask(const at::Tensor& ids, const ForwardOptions& fo);

// Positions past .. past + s, less the padding before each token of each row (left padding: positions count real
// tokens only, as LLM Foundry and HF's generate set them), clamped at 0: int64 (B, s) with a `key_mask`
// (key_padding_mask()), (1, s) without one (undefined).
at::Tensor positions_after_padding(const at::Tensor& key_mask, int64_t past, int64_t s,
                                   const at::TensorOptions& options);

// Positions that restart at 0 at each packed document of `sequence_id` (B, S) int64: int64 (B, S).
at::Tensor document_positions(const at::Tensor& sequence_id);

// LLM Foundry's gen_slopes: slope_k = 2^(-alibi_bias_max * k / n) for k = 1..n, n the next power of two; for other
// head counts the odd-indexed slopes of the power of two come first. Shape (n_heads,), float32.
at::Tensor alibi_slopes(int64_t n_heads, double alibi_bias_max);

// Everything a block's attention needs for one forward call, built once per call by the model and shared by blocks.
struct AttentionInputs {
  int64_t past = 0;                // positions already in the KV cache before this chunk
  std::optional<at::Tensor> mask;  // additive, broadcastable to (B, H, s_q, s_k), in the compute dtype
  bool is_causal = false;          // no mask needed beyond plain causal masking
  at::Tensor rope_cos, rope_sin;   // (s_q, head_dim / 2) for positions past .. past + s_q, or (B or 1, s_q,
                                   // head_dim / 2) for per-row positions; undefined without RoPE
  bool reference = false;          // use the explicit softmax(QK^T * scale + mask) V path instead of SDPA
  double softcap = 0;              // > 0: scores capped as softcap * tanh(scores / softcap) before the mask (Gemma 2's
                                   // attn_logit_softcapping); takes the explicit path
  // Context parallelism (context_parallel.h): the layers run on this shard's positions, and attend() gathers the keys
  // and values of the whole sequence over its group (the mask's rows are this shard's positions, its columns the
  // gathered keys; the rotary tables are this shard's positions').
  std::shared_ptr<const ContextShard> context;
};

// The attention inputs of families whose layers are of two kinds (GPT-Neo's global and local layers, Gemma's full
// and sliding-window ones): each layer reads the set of its kind.
struct GlobalLocalInputs {
  AttentionInputs global, local;
};

// The causal attention inputs of a forward on `ids` (B, s_q) after `past` cached positions, as transformers' decoders
// mask: plain causal (is_causal, no mask) when nothing else applies, else an additive mask in `dtype` (the most
// negative float where blocked) hiding future keys, the padding of `key_mask` (key_padding_mask()), other packed
// documents of fo.sequence_id, and, when `sliding_window` > 0, keys at or beyond `sliding_window` positions back
// (HF's sliding window: query q sees key k when q - k < window). Sets past and reference from `fo` too.
AttentionInputs causal_attention_inputs(const at::Tensor& ids, const ForwardOptions& fo, int64_t past,
                                        const at::Tensor& key_mask, at::ScalarType dtype, int64_t sliding_window = 0);

// The positions a rotary or learned-position family reads for a forward on `ids` (B, s) after `past` cached ones:
// positions_after_padding(), or each packed document's own positions with fo.sequence_id.
at::Tensor token_positions(const at::Tensor& ids, const ForwardOptions& fo, int64_t past, const at::Tensor& key_mask);

// Sets in.rope_cos / rope_sin ((B or 1, s, inv_freq.size(0)), float32 as HF computes them) for `positions`.
void set_rope_tables(AttentionInputs& in, const at::Tensor& positions, const at::Tensor& inv_freq);

// Rotary inverse frequencies as HF and LLM Foundry compute them: 1 / theta^(arange(0, head_dim, 2) / head_dim),
// float32, (head_dim / 2,), on the CPU.
at::Tensor rotary_inv_freq(int64_t head_dim, double theta);

// transformers' YaRN (rope_type yarn, _compute_yarn_parameters): the inverse frequencies blend interpolation (divided
// by `factor`) and extrapolation with a linear ramp between the dimensions that turn beta_fast and beta_slow times
// over original_max_position_embeddings (the bounds floored and ceiled unless truncate is false); the rotary tables
// are scaled by attention_factor (when unset: mscale(factor, mscale) / mscale(factor, mscale_all_dim) with both
// given, else mscale(factor, 1)).
struct YarnRope {
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0, beta_slow = 1.0;
  std::optional<double> mscale{}, mscale_all_dim{}, attention_factor{};
  bool truncate = true;
};
// 0.1 * mscale * ln(scale) + 1 for scale > 1, else 1 (yarn_get_mscale).
double yarn_mscale(double scale, double mscale);
// (dim / 2,) float32 on the CPU.
at::Tensor yarn_inv_freq(int64_t dim, double theta, const YarnRope& yarn);
double yarn_attention_factor(const YarnRope& yarn);

// Applies GPT-NeoX-style (flash-attn "dail", non-interleaved; HF's rotate_half) rotary embeddings to
// x: (B, S, heads, head_dim), with cos/sin (S, r / 2) or, for per-row positions, (B, S, r / 2): r = head_dim rotates
// whole heads, a smaller r (partial rotary) the first r features of each head, the rest passing through.
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
// The same rotation in the interleaved layout (GPT-J's, GLM's): features 2i and 2i + 1 rotate as a pair by the angle of
// table column i; with narrower tables, the first r features of each head, the rest passing through.
at::Tensor apply_rotary_interleaved(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// With a cache: prepends its keys and values to k and v ((B, KV, S, hd)) and stores the result in it.
void append_to_cache(LayerCache* cache, at::Tensor& k, at::Tensor& v);

// `in` (a whole sequence's inputs, no cache) for a forward on `shard`'s positions: the mask's rows at those positions
// and its columns in the gathered keys' order, or, for plain causal attention, such a mask made from the positions (in
// `dtype`, the compute dtype); rotary tables at those positions.
AttentionInputs context_parallel_inputs(const AttentionInputs& in, std::shared_ptr<const ContextShard> shard,
                                        at::ScalarType dtype);

// x (B, S, ...) at the positions of the inputs' context shard, or x itself without one.
inline at::Tensor context_positions_of(const AttentionInputs& in, const at::Tensor& x) {
  return in.context ? x.index_select(1, in.context->positions) : x;
}
// Families whose layers are of two kinds run both sets on the same shard.
inline GlobalLocalInputs context_parallel_inputs(const GlobalLocalInputs& in, std::shared_ptr<const ContextShard> shard,
                                                 at::ScalarType dtype) {
  return {context_parallel_inputs(in.global, shard, dtype), context_parallel_inputs(in.local, shard, dtype)};
}
inline at::Tensor context_positions_of(const GlobalLocalInputs& in, const at::Tensor& x) {
  return context_positions_of(in.global, x);
}

// Runs the decoder layers (`LayerImpl`s with forward(x, in, LayerCache*)) as units 1..n through `runner`, each with
// the call's shared attention inputs (AttentionInputs, or a family's own set of them) and its own slot of `cache`;
// then advances the cache by `new_tokens` and keeps the key padding mask seen so far. The lambdas capture by value:
// the sharding engine may run them again in backward (activation checkpointing).
//
// With a context shard in `in` (context_parallel_inputs()), the layers run on its positions of x and return those.
// (Under sequence parallelism the engine's runner cuts the sequence before the first layer and joins it after the
// last; layers read sequence lengths from their projections' outputs, never from x.)
template <class LayerImpl, class Inputs = AttentionInputs>
at::Tensor run_decoder_layers(const std::shared_ptr<UnitRunner>& runner, const torch::nn::ModuleList& layers,
                              const Inputs& in, KVCache* cache, const at::Tensor& key_mask, int64_t new_tokens,
                              at::Tensor x) {
  if (cache && cache->layers.empty()) cache->layers.resize(layers->size());
  x = context_positions_of(in, x);
  for (size_t i = 0; i < layers->size(); ++i) {
    auto* layer = layers->ptr(i)->as<LayerImpl>();
    LayerCache* layer_cache = cache ? &cache->layers[i] : nullptr;
    auto fn = [layer, in, layer_cache](const at::Tensor& h) { return layer->forward(h, in, layer_cache); };
    x = run_unit(runner, static_cast<int64_t>(i) + 1, fn, x);
  }
  if (cache) {
    cache->length += new_tokens;
    if (key_mask.defined()) cache->attention_mask = key_mask;
  }
  return x;
}

// Attention of q (B, H, s_q, hd) over k, v (B, KV, s_k, hd), H a multiple of KV (grouped-query), with `in`'s mask or
// causal flag (with a context shard, k and v are this rank's and are gathered over its group first): SDPA, or the
// explicit softmax path (in.reference; and for short bf16 keys on CPU, where it is faster). `sinks` (H,), when given:
// a learned logit per head that joins each row's softmax and takes its share of the probability without a value
// (gpt-oss's attention sinks; the explicit path). Returns (B, H, s_q, hd of v).
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionInputs& in,
                  double scale, double dropout, bool training, const at::Tensor& sinks = at::Tensor());

}  // namespace tessera::models
