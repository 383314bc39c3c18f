// The decoder-only causal LM every family is, once: the root unit embeds the tokens, the decoder layers run as units
// 1..n through the sharding engine's runner (each with the call's shared attention inputs and its own KV-cache slot,
// on context shards when the call has one), and the root unit runs again for the final norm and the head. A family
// derives its causal LM from DecoderLM<its layer, its attention inputs>, registers its modules under its own names, and
// writes only the steps that differ: how it embeds (learned positions, scaling), how it builds the attention inputs
// (masks, rotary tables, ALiBi, soft-caps), and its final norm and head.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/modules/container/modulelist.h>

#include <memory>
#include <string>
#include <utility>

#include "tessera/models/blocks/attention.h"
#include "tessera/models/blocks/layers.h"
#include "tessera/models/causal_lm.h"
#include "tessera/models/family_support.h"

namespace tessera::models {

// One forward call as the decoder's steps see it.
struct DecoderCall {
  at::Tensor ids;                                // (B, s) int64
  ForwardOptions fo;                             // the call's options (mask, packed documents, cache, context shard)
  int64_t past = 0;                              // positions already in the KV cache
  int64_t s = 0;                                 // new positions
  at::Tensor key_mask;                           // key_padding_mask(): (B, past + s) bool; undefined without a mask
  at::Tensor positions;                          // token_positions(): each token's position, per packed document
  at::ScalarType dtype = at::ScalarType::Float;  // the compute dtype (compute_dtype() of the token embedding)
};

template <class Layer, class Inputs = AttentionInputs>
class DecoderLM : public CausalLM {
 public:
  // embed (unit 0) -> the decoder layers (units 1..n) -> final norm and head (unit 0): input_ids (B, S) int64 ->
  // logits (B, S, vocab_size()), or this context shard's positions' logits.
  at::Tensor forward(const at::Tensor& ids, const ForwardOptions& fo = {}) override {
    TORCH_CHECK(ids.dim() == 2, "input_ids must be (batch, seq), got ", ids.sizes());
    DecoderCall call;
    call.ids = ids;
    call.fo = fo;
    call.past = fo.cache ? fo.cache->length : 0;
    call.s = ids.size(1);
    call.key_mask = key_padding_mask(ids, fo);
    call.positions = token_positions(ids, fo, call.past, call.key_mask);
    call.dtype = compute_dtype(token_embedding().weight);
    begin_forward(call);
    // The lambdas capture by value: the sharding engine may run a unit again in backward (activation checkpointing).
    at::Tensor x = run_unit(
        runner_, 0, [this, call](const at::Tensor& t) { return embed(t, call); }, ids);
    Inputs in = attention_inputs(call);
    if (fo.context) in = context_parallel_inputs(in, fo.context, call.dtype);
    x = run_decoder_layers<Layer, Inputs>(runner_, decoder_layers(), in, fo.cache, call.key_mask, call.s, x);
    const at::Tensor logits = run_unit(
        runner_, 0, [this](const at::Tensor& h) { return head(h); }, x);
    end_forward();
    return logits;
  }

  int64_t num_units() const override { return static_cast<int64_t>(decoder_layers()->size()) + 1; }
  // Unit i + 1 for the parameters of layer i (named layer_prefix + i + "."), the root's otherwise.
  int64_t unit_of_parameter(const std::string& name) const override { return layer_unit(name, layer_prefix_); }
  void set_unit_runner(std::shared_ptr<UnitRunner> runner) override { runner_ = std::move(runner); }
  // Every step above runs on a context shard (the keys and values gathered per layer); a family whose layers cannot
  // (per-token auxiliary losses) says false.
  bool supports_context_parallel() const override { return true; }

 protected:
  // `layer_prefix`: the layers' module path with a trailing dot ("model.layers.").
  explicit DecoderLM(std::string layer_prefix) : layer_prefix_(std::move(layer_prefix)) {}

  // The family's modules, registered by its constructor under its own names.
  virtual const torch::nn::ModuleList& decoder_layers() const = 0;
  virtual EmbeddingImpl& token_embedding() = 0;
  // The root's first call: token ids -> the layers' input. Default: the token embedding.
  virtual at::Tensor embed(const at::Tensor& ids, const DecoderCall& call) {
    (void)call;
    return token_embedding().forward(ids);
  }
  // The layers' shared attention inputs for the call (masks, rotary tables, soft-caps), over the whole sequence.
  virtual Inputs attention_inputs(const DecoderCall& call) = 0;
  // The root's second call: the last layer's output -> logits (the final norm, the head, any scaling of the logits).
  virtual at::Tensor head(const at::Tensor& h) = 0;
  // Around a forward: a mixture of experts' bookkeeping.
  virtual void begin_forward(const DecoderCall& call) { (void)call; }
  virtual void end_forward() {}

  // For head(): `x` through the untied head `lm_head`, or through the token embedding it is tied to.
  at::Tensor head_logits(const at::Tensor& x, const Linear& lm_head) {
    return lm_head ? lm_head.ptr()->forward(x) : token_embedding().attend(x);
  }

  std::shared_ptr<UnitRunner> runner_;

 private:
  std::string layer_prefix_;
};

}  // namespace tessera::models
