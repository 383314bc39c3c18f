// The Phi-3 family (Microsoft's Phi-3 mini/small-shaped dense models, Phi-3.5 mini, Phi-4 mini) as LibTorch modules
// with Hugging Face's module names, so named_parameters() gives the keys of Phi3ForCausalLM folders:
// model.embed_tokens.weight, model.layers.{i}.self_attn.{qkv_proj,o_proj}.weight (q, k and v fused, in that order),
// ....mlp.{gate_up_proj,down_proj}.weight (gate and up fused, in that order), ....{input,post_attention}_layernorm
// .weight, model.norm.weight, lm_head.weight (untied only). The function is transformers' Phi3ForCausalLM (4.57):
// Llama-style RMSNorm blocks, grouped-query attention, rotary on the first partial_rotary_factor of each head,
// `longrope` (`su`) scaling (short factors up to original_max_position_embeddings, long ones beyond, cos/sin scaled by
// the attention factor), an optional sliding window, residual dropout. Phi3ForCausalLM implements the model protocol
// (causal_lm.h); `model.name: phi3`. Not thread-safe.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/modules/container/modulelist.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/config/reader.h"
#include "tessera/models/blocks/attention.h"
#include "tessera/models/blocks/decoder.h"
#include "tessera/models/blocks/layers.h"
#include "tessera/models/causal_lm.h"
#include "tessera/models/parallel_plan.h"

namespace tessera::models {

// HF's Phi3Config keys and defaults (those of Phi-3 mini).
struct Phi3Options {
  int64_t vocab_size = 32064;
  int64_t hidden_size = 3072;
  int64_t intermediate_size = 8192;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 0;  // resolved: num_attention_heads when not given
  double resid_pdrop = 0.0;
  double embd_pdrop = 0.0;  // read and kept for config.json; transformers 4.57's Phi-3 applies no embedding dropout
  double attention_dropout = 0.0;
  std::string hidden_act = "silu";
  int64_t max_position_embeddings = 4096;
  int64_t original_max_position_embeddings = 4096;
  double initializer_range = 0.02;
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  double rope_theta = 10000.0;
  double partial_rotary_factor = 1.0;
  // rope_scaling {type: longrope (or su), short_factor, long_factor}: empty factors = no scaling.
  std::vector<double> short_factor, long_factor;
  std::optional<int64_t> sliding_window;
  std::optional<int64_t> bos_token_id = 1, eos_token_id = 32000, pad_token_id = 32000;
  std::string init_device = "cpu";  // cpu | cuda | meta

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  int64_t rotary_ndims() const { return static_cast<int64_t>(static_cast<double>(head_dim()) * partial_rotary_factor); }
  bool longrope() const { return !short_factor.empty(); }
  // transformers' longrope attention factor: sqrt(1 + ln(s) / ln(original)), s = max / original positions (1 when
  // s <= 1 or without longrope).
  double rope_attention_factor() const;
};

// Reads a `model:` section with name phi3 (HF's Phi3Config keys); errors name the key path and line.
Phi3Options parse_phi3_options(config::Section& s);
// config.json (model_type phi3) -> options; throws Error("hf") naming `where` for what the family does not compute.
Phi3Options phi3_options_from_hf_config(const nlohmann::json& config, const std::string& where);
nlohmann::ordered_json phi3_hf_config(const Phi3Options& o, at::ScalarType dtype);

class Phi3AttentionImpl : public torch::nn::Module {
 public:
  Phi3AttentionImpl(const Phi3Options& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  Linear o_proj{nullptr}, qkv_proj{nullptr};

 private:
  Phi3Options o_;
};
TORCH_MODULE(Phi3Attention);

// down_proj(up * act(gate)), [gate | up] = gate_up_proj(x).
class Phi3MLPImpl : public torch::nn::Module {
 public:
  Phi3MLPImpl(const Phi3Options& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x);

  Linear gate_up_proj{nullptr}, down_proj{nullptr};

 private:
  std::string act_;
};
TORCH_MODULE(Phi3MLP);

class Phi3DecoderLayerImpl : public torch::nn::Module {
 public:
  Phi3DecoderLayerImpl(const Phi3Options& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  Phi3Attention self_attn{nullptr};
  Phi3MLP mlp{nullptr};
  Norm input_layernorm{nullptr}, post_attention_layernorm{nullptr};

 private:
  double resid_pdrop_;
};
TORCH_MODULE(Phi3DecoderLayer);

class Phi3ModelImpl : public torch::nn::Module {
 public:
  Phi3ModelImpl(const Phi3Options& o, const at::TensorOptions& t);

  Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  Norm norm{nullptr};
};
TORCH_MODULE(Phi3Model);

// Units: 0 = the root (embedding, final norm and head), 1..num_hidden_layers = the decoder layers.
class Phi3ForCausalLMImpl : public DecoderLM<Phi3DecoderLayerImpl>, public TensorParallelModel {
 public:
  explicit Phi3ForCausalLMImpl(const Phi3Options& o);
  const Phi3Options& options() const { return o_; }

  void init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select = nullptr) override;
  std::shared_ptr<CausalLM> rebuild(const std::string& device, std::optional<uint64_t> seed) const override;
  // 6 N (less an untied input embedding) + 12 L (heads x head_dim) S.
  double flops_per_token(int64_t seq_len) const override;
  int64_t vocab_size() const override { return o_.vocab_size; }
  int64_t max_seq_len() const override { return o_.max_position_embeddings; }
  std::string describe() const override;
  std::string family() const override { return "phi3"; }
  bool has_hf_format() const override { return true; }
  nlohmann::ordered_json hf_config(at::ScalarType dtype) const override { return phi3_hf_config(o_, dtype); }
  std::optional<std::string> tied_embedding_name() const override;
  // Heads (of the fused qkv_proj), the MLP's hidden units (of the fused gate_up_proj) and the vocabulary split.
  TensorParallelPlan tensor_parallel_plan(int64_t degree) const override;
  // longrope: keys cached with the short factors are stale once a row passes original_max_position_embeddings
  // (transformers' Phi3ForCausalLM.prepare_inputs_for_generation recomputes the cache there).
  bool kv_cache_stale(int64_t past, int64_t total) const override {
    return o_.longrope() && total >= o_.original_max_position_embeddings + 1 &&
           past <= o_.original_max_position_embeddings;
  }

  Phi3Model model{nullptr};
  Linear lm_head{nullptr};  // only when tie_word_embeddings is false

 protected:
  const torch::nn::ModuleList& decoder_layers() const override { return model->layers; }
  EmbeddingImpl& token_embedding() override { return *model->embed_tokens; }
  // Causal (or sliding-window) masks; rotary tables with longrope's short or long factors.
  AttentionInputs attention_inputs(const DecoderCall& call) override;
  at::Tensor head(const at::Tensor& h) override { return head_logits(model->norm(h), lm_head); }

 private:
  Phi3Options o_;
  at::Tensor inv_freq_short_, inv_freq_long_;  // (rotary_ndims / 2,) float32 on the CPU; long: longrope only
};
TORCH_MODULE(Phi3ForCausalLM);

// Builds the model on options.init_device; on a real device initialised as HF's Phi3PreTrainedModel does (normal with
// std initializer_range for Linear and Embedding weights, the pad_token_id embedding row zeroed, RMSNorms 1), each
// module from its own generator.
Phi3ForCausalLM build_phi3(const Phi3Options& options, uint64_t seed = 17);

}  // namespace tessera::models
