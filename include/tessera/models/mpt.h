// MPT, LLM Foundry's decoder-only transformer, as LibTorch modules. Submodule names match LLM Foundry and Hugging
// Face, so named_parameters() gives the checkpoint keys: transformer.wte.weight, transformer.wpe.weight,
// transformer.blocks.{i}.norm_1.weight, ....attn.Wqkv.weight, ....ffn.up_proj.weight, transformer.norm_f.weight,
// lm_head.weight (untied only). Model code knows nothing about distribution; sharding is applied from outside.
// Modules are not thread-safe.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/modules/container/modulelist.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/models/attention.h"
#include "tessera/models/layers.h"
#include "tessera/models/mpt_config.h"

namespace tessera::models {

// mptmlp: down_proj(gelu(up_proj(x))); mptglu: down_proj(gelu(gate_proj(x)) * up_proj(x)). Exact (erf) GELU.
class FFNImpl : public torch::nn::Cloneable<FFNImpl> {
 public:
  FFNImpl(const MPTOptions& options, const at::TensorOptions& tensor_options);
  void reset() override {}
  at::Tensor forward(const at::Tensor& x);

  Linear up_proj{nullptr};
  Linear gate_proj{nullptr};  // mptglu only
  Linear down_proj{nullptr};
};
TORCH_MODULE(FFN);

// Pre-LN block: x + drop(attn(norm_1(x))), then + drop(ffn(norm_2(x))).
class MPTBlockImpl : public torch::nn::Cloneable<MPTBlockImpl> {
 public:
  MPTBlockImpl(const MPTOptions& options, const at::TensorOptions& tensor_options);
  void reset() override {}
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  Norm norm_1{nullptr};
  GroupedQueryAttention attn{nullptr};
  Norm norm_2{nullptr};
  FFN ffn{nullptr};

 private:
  double resid_pdrop_;
};
TORCH_MODULE(MPTBlock);

// Keys and values of every layer for incremental decoding, plus the key padding mask seen so far.
struct KVCache {
  std::vector<LayerCache> layers;
  at::Tensor attention_mask;  // (B, length) bool, true = real token; undefined when no mask was given
  int64_t length = 0;         // positions cached
};

// Extension point for code that wraps parts of the forward pass (the sharding engine gathers a unit's parameters
// around it). MPT's units: 0 = the root (embeddings, final norm and head: one unit because the head may be tied to
// the embedding; it runs twice per forward), 1..n_layers = the blocks. Unit u's parameters are those named
// "transformer.blocks.{u-1}." for blocks and all others for the root. Without a runner, fn(x) runs directly.
class UnitRunner {
 public:
  virtual ~UnitRunner() = default;
  virtual at::Tensor run(int64_t unit, const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& x) = 0;
};
int64_t unit_of_parameter(const std::string& name);  // by the naming rule above

struct ForwardOptions {
  std::optional<at::Tensor> attention_mask;  // (B, S) bool/int, true or 1 = token, false or 0 = padding
  std::optional<at::Tensor> sequence_id;     // (B, S) int64: packed-document ids (attn_uses_sequence_id)
  KVCache* cache = nullptr;                  // incremental decoding: reads and extends the cache
  bool reference_attention = false;          // explicit softmax path instead of SDPA (for tests)
};

class MPTModelImpl : public torch::nn::Cloneable<MPTModelImpl> {
 public:
  MPTModelImpl(const MPTOptions& options, const at::TensorOptions& tensor_options);
  void reset() override {}
  // input_ids: (B, S) int64 -> hidden states before norm_f: (B, S, d_model), the blocks run through unit_runner.
  at::Tensor forward_blocks(const at::Tensor& input_ids, const ForwardOptions& fo = {});
  // input_ids: (B, S) int64 -> hidden states after norm_f: (B, S, d_model).
  at::Tensor forward(const at::Tensor& input_ids, const ForwardOptions& fo = {});

  Embedding wte{nullptr};
  Embedding wpe{nullptr};  // learned positions only
  torch::nn::ModuleList blocks{nullptr};
  Norm norm_f{nullptr};
  std::shared_ptr<UnitRunner> unit_runner;  // set by parallelize(); runs every unit of this model's forward

 private:
  AttentionInputs attention_inputs(const at::Tensor& input_ids, const ForwardOptions& fo, int64_t past,
                                   const at::Tensor& key_mask);
  // (1, H, s_q, s_k) float32: causal, sliding window and ALiBi for queries at past .. past + s_q; cached per shape.
  const at::Tensor& structural_mask(int64_t past, int64_t s_q, const at::Device& device);

  MPTOptions o_;
  at::Tensor slopes_;  // (H,) ALiBi slopes
  struct MaskKey {
    int64_t past = -1, s_q = -1;
    at::Device device = at::kCPU;
  } mask_key_;
  at::Tensor mask_cache_;
};
TORCH_MODULE(MPTModel);

class MPTForCausalLMImpl : public torch::nn::Cloneable<MPTForCausalLMImpl> {
 public:
  explicit MPTForCausalLMImpl(const MPTOptions& options);
  void reset() override {}
  // input_ids: (B, S) int64 -> logits (B, S, vocab_size).
  at::Tensor forward(const at::Tensor& input_ids, const ForwardOptions& fo = {});
  const MPTOptions& options() const { return o_; }

  MPTModel transformer{nullptr};
  Linear lm_head{nullptr};  // only when tie_word_embeddings is false

 private:
  MPTOptions o_;
};
TORCH_MODULE(MPTForCausalLM);

// Builds the model on options.init_device ("cpu", "cuda" or "meta"); on a real device the weights are initialised
// with LLM Foundry's init_config scheme using `seed`.
MPTForCausalLM build_mpt(const MPTOptions& options, uint64_t seed = 17);

// LLM Foundry's parameter initialisation (param_init_fns.py) for options.init.name: Linear weights by the scheme
// (fused Wqkv per Q/K/V slice), residual projections divided by init_div_is_residual, biases zero, embeddings by
// emb_init_std / emb_init_uniform_lim / the scheme, norms weight 1 bias 0. Each module draws from its own generator,
// seeded from `seed` and the module's name, so initialising any subset of modules (`select` on module names, e.g.
// one unit at a time when building a sharded model from `meta`) gives exactly the values of a whole-model init.
void init_mpt_weights(MPTForCausalLM& model, uint64_t seed,
                      const std::function<bool(const std::string&)>& select = nullptr);
// The seed of module `module_name`'s generator under init_mpt_weights(model, seed).
uint64_t module_seed(uint64_t seed, const std::string& module_name);

// A model built on `meta` describes shapes only (no memory). materialize() returns the same model allocated on
// `device` and initialised from `seed` (identical to building it there directly); the meta model is left as it was.
MPTForCausalLM materialize(const MPTForCausalLM& meta_model, const at::Device& device, uint64_t seed);

// Next-token loss: cross-entropy of logits[:, t] against labels[:, t + 1] over labels != ignore_index, their mean
// (at::Reduction::Mean) or sum (at::Reduction::Sum). Computed in fp32 on the logits as they are (no copy without
// the last position: the targets are shifted instead, with the last one ignored).
at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels, int64_t ignore_index = -100,
                          at::Reduction::Reduction reduction = at::Reduction::Mean);

}  // namespace tessera::models
