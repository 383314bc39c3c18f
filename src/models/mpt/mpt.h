// MPT, LLM Foundry's decoder-only transformer, as LibTorch modules. Submodule names match LLM Foundry and Hugging
// Face, so named_parameters() gives the checkpoint keys: transformer.wte.weight, transformer.wpe.weight,
// transformer.blocks.{i}.norm_1.weight, ....attn.Wqkv.weight, ....ffn.up_proj.weight, transformer.norm_f.weight,
// lm_head.weight (untied only). MPTForCausalLM implements the model protocol (causal_lm.h); model code knows
// nothing about distribution, sharding is applied from outside.
// Modules are not thread-safe.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/modules/container/modulelist.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/mpt/mpt_config.h"
#include "tessera/models/blocks/attention.h"
#include "tessera/models/blocks/decoder.h"
#include "tessera/models/blocks/layers.h"
#include "tessera/models/blocks/moe.h"
#include "tessera/models/capabilities.h"
#include "tessera/models/causal_lm.h"
#include "tessera/models/parallel_plan.h"

namespace tessera::models {

// MPT attention: fused Wqkv ([Q | K | V], head-major) or, with attn_config.fused_qkv: false, LLM Foundry's separate
// Wq, Wk, Wv (the same function); grouped-query heads, optional qk LayerNorm, clipping and rotary embeddings.
class GroupedQueryAttentionImpl : public torch::nn::Module {
 public:
  GroupedQueryAttentionImpl(const MPTOptions& options, const at::TensorOptions& tensor_options);
  // x: (B, S, d_model) -> (B, S, d_model). With `cache`, appends this chunk's keys and values to it.
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  Linear Wqkv{nullptr};  // fused_qkv (the default)
  Linear Wq{nullptr};    // fused_qkv: false
  Linear Wk{nullptr};
  Linear Wv{nullptr};
  Linear out_proj{nullptr};
  Norm q_ln{nullptr};
  Norm k_ln{nullptr};

 private:
  MPTOptions o_;
  double scale_;
};
TORCH_MODULE(GroupedQueryAttention);

// mptmlp: down_proj(gelu(up_proj(x))); mptglu: down_proj(gelu(gate_proj(x)) * up_proj(x)). Exact (erf) GELU.
class FFNImpl : public torch::nn::Module {
 public:
  FFNImpl(const MPTOptions& options, const at::TensorOptions& tensor_options);
  at::Tensor forward(const at::Tensor& x);

  Linear up_proj{nullptr};
  Linear gate_proj{nullptr};  // mptglu only
  Linear down_proj{nullptr};

 private:
  std::string act_;  // ffn_config.ffn_act_fn, by its ACT2FN name
};
TORCH_MODULE(FFN);

// Pre-LN block: x + drop(attn(norm_1(x))), then + drop(ffn(norm_2(x))). The ffn is the dense FFN or, with
// ffn_config.ffn_type torch_dmoe / mb_moe / mb_dmoe, a mixture of experts (moe.h), registered as "ffn" either way.
class MPTBlockImpl : public torch::nn::Module {
 public:
  MPTBlockImpl(const MPTOptions& options, const at::TensorOptions& tensor_options,
               std::shared_ptr<AuxLossScale> aux_scale = nullptr, std::shared_ptr<HfRouterLoss> hf_loss = nullptr);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  Norm norm_1{nullptr};
  GroupedQueryAttention attn{nullptr};
  Norm norm_2{nullptr};
  FFN ffn{nullptr};
  MoE moe{nullptr};  // registered as "ffn" instead of `ffn`

 private:
  double resid_pdrop_;
};
TORCH_MODULE(MPTBlock);

class MPTModelImpl : public torch::nn::Module {
 public:
  MPTModelImpl(const MPTOptions& options, const at::TensorOptions& tensor_options,
               std::shared_ptr<AuxLossScale> aux_scale = nullptr, std::shared_ptr<HfRouterLoss> hf_loss = nullptr);
  // The root's first call: wte (plus learned positions counting real tokens only, LLM Foundry's left-padding fix),
  // embedding_fraction and emb_pdrop. `key_mask` is key_padding_mask() over `past` cached and the new positions.
  at::Tensor embed(const at::Tensor& input_ids, const at::Tensor& key_mask, int64_t past);
  // The blocks' attention inputs: causal, sliding-window and ALiBi masks (cached per shape), packed documents,
  // padding, rotary tables.
  AttentionInputs attention_inputs(const at::Tensor& input_ids, const ForwardOptions& fo, int64_t past,
                                   const at::Tensor& key_mask);

  Embedding wte{nullptr};
  Embedding wpe{nullptr};  // learned positions only
  torch::nn::ModuleList blocks{nullptr};
  Norm norm_f{nullptr};

 private:
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

// MPT as a CausalLM (the model protocol, causal_lm.h); `model.name: mpt_causal_lm`.
class MPTForCausalLMImpl : public DecoderLM<MPTBlockImpl>,
                           public TensorParallelModel,
                           public MixtureOfExpertsModel,
                           public AlibiSurgery,
                           public LowPrecisionNormsModel {
 public:
  explicit MPTForCausalLMImpl(const MPTOptions& options);
  const MPTOptions& options() const { return o_; }

  void init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select = nullptr) override;
  std::shared_ptr<CausalLM> rebuild(const std::string& device, std::optional<uint64_t> seed) const override;
  double flops_per_token(int64_t seq_len) const override;
  std::optional<double> activation_bytes(int64_t batch, int64_t seq_len, int bytes_per_value,
                                         bool activation_checkpointing) const override;
  int64_t largest_unit_params() const override { return mpt_largest_unit_params(o_); }
  int64_t vocab_size() const override { return o_.vocab_size; }
  int64_t max_seq_len() const override { return o_.max_seq_len; }
  std::string describe() const override;
  std::string family() const override { return "mpt"; }
  bool has_hf_format() const override { return true; }
  nlohmann::ordered_json hf_config(at::ScalarType dtype) const override;
  HfFormat hf_format(at::ScalarType dtype) const override;
  std::optional<std::string> tied_embedding_name() const override;
  std::shared_ptr<CausalLM> with_alibi(double alibi_bias_max, int64_t max_seq_len, uint64_t seed) const override;
  void record_low_precision_norms() override;  // norm_type, so that rebuild() keeps them
  std::map<std::string, at::Tensor> auxiliary_losses() const override;
  void set_auxiliary_loss_scale(double scale) override { aux_scale_->set(scale); }
  std::vector<std::pair<std::string, at::Tensor>> expert_token_counts() const override;
  int64_t num_active_params() const override { return mpt_active_param_count(o_); }
  // Heads, the MLP's hidden units and (where the vocabulary divides) the head split; the blocks' norms on sequence
  // shards. Refused for MoE layers, qk_ln (a norm over every head at once) and ALiBi (slopes per head).
  TensorParallelPlan tensor_parallel_plan(int64_t degree) const override;
  bool supports_context_parallel() const override {
    return !o_.ffn.moe;
  }  // the router's losses count each
     // rank's tokens as the whole batch

  MPTModel transformer{nullptr};
  Linear lm_head{nullptr};  // only when tie_word_embeddings is false

 protected:
  const torch::nn::ModuleList& decoder_layers() const override { return transformer->blocks; }
  EmbeddingImpl& token_embedding() override { return *transformer->wte; }
  at::Tensor embed(const at::Tensor& ids, const DecoderCall& call) override;
  AttentionInputs attention_inputs(const DecoderCall& call) override {
    return transformer->attention_inputs(call.ids, call.fo, call.past, call.key_mask);
  }
  at::Tensor head(const at::Tensor& h) override;  // norm_f, the head, logit_scale
  // The MoE layers' records; DBRX's transformers-style load-balancing loss over the whole forward.
  void begin_forward(const DecoderCall& call) override;
  void end_forward() override;

 private:
  MPTOptions o_;
  std::shared_ptr<AuxLossScale> aux_scale_ = std::make_shared<AuxLossScale>();
  std::shared_ptr<HfRouterLoss> hf_loss_ = std::make_shared<HfRouterLoss>();  // DBRX's transformers-style loss
  at::Tensor hf_aux_;                                                         // its last training value
  bool transformers_loss_ = false;  // this forward trains DBRX's experts with transformers' loss
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
void init_mpt_weights(MPTForCausalLMImpl& model, uint64_t seed,
                      const std::function<bool(const std::string&)>& select = nullptr);
inline void init_mpt_weights(MPTForCausalLM& model, uint64_t seed,
                             const std::function<bool(const std::string&)>& select = nullptr) {
  init_mpt_weights(*model, seed, select);
}

// A model built on `meta` describes shapes only (no memory). materialize() returns the same model allocated on
// `device` and initialised from `seed` (identical to building it there directly); the meta model is left as it was.
MPTForCausalLM materialize(const MPTForCausalLM& meta_model, const at::Device& device, uint64_t seed);

// config.json <-> MPTOptions (LLM Foundry's MPTConfig fields plus HF's aliases). Reading accepts HF's
// layer_norm_epsilon and the PretrainedConfig fields that change no model (refuse_unread_hf_keys(), family_support.h);
// it throws tessera::Error("hf") naming `where` for a model_type other than "mpt", any other key it does not read
// (attn_config's too), or an invalid or unsupported architecture value.
MPTOptions mpt_options_from_hf_config(const nlohmann::json& config, const std::string& where);
nlohmann::ordered_json mpt_hf_config(const MPTOptions& options, at::ScalarType dtype);

// The folder transformers loads as exactly `model`'s function (CausalLM::hf_format): ALiBi models without biases as
// transformers' MptForCausalLM (the family's own names), models with learned positions as GPT2LMHeadModel (biases
// the MPT lacks stored as zeros, Conv1D weights transposed). Throws Error("hf") naming every setting that no
// transformers architecture represents (grouped-query attention, qk_ln, GLU, RMSNorm, rotary, ALiBi with biases, ...)
// and what to do instead.
HfFormat mpt_hf_format(const MPTOptions& options, at::ScalarType dtype, const CausalLM& model);
// config.json of transformers' GPT-2 (model_type gpt2, activation_function "gelu") -> the MPT computing the same
// function: learned positions, biases, LayerNorm. Throws Error("hf") naming `where` for what MPT cannot compute
// (gelu_new, per-layer scaling, cross-attention) and for a key GPT2Config does not read that can change the model.
MPTOptions mpt_options_from_gpt2_config(const nlohmann::json& config, const std::string& where);
// config.json of transformers' DBRX (model_type dbrx: GQA with clip_qkv and rotary positions, LayerNorms without
// biases, GLU experts with DbrxRouter's routing and transformers' load-balancing loss) -> the MPT computing the same
// function, with hf_layout "dbrx", which exports as DbrxForCausalLM again (module names mapped: blocks.{i}.norm_1 ->
// blocks.{i}.norm_attn_norm.norm_1, ...). Reads transformers 5's form too (rope_parameters: hf_config_v4()). Throws
// Error("hf") naming `where` for what Tessera does not compute and for a key it does not read that can change the
// model (attn_config's and ffn_config's too).
MPTOptions mpt_options_from_dbrx_config(const nlohmann::json& config, const std::string& where);
nlohmann::ordered_json dbrx_hf_config(const MPTOptions& options, at::ScalarType dtype);

}  // namespace tessera::models
