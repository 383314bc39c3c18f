// The Granite family (IBM's Granite 3.x dense language models) as LibTorch modules with Hugging Face's module names,
// so named_parameters() gives the keys of GraniteForCausalLM folders: model.embed_tokens.weight,
// model.layers.{i}.input_layernorm.weight, ....self_attn.{q,k,v,o}_proj.*, ....post_attention_layernorm.weight,
// ....mlp.{gate,up,down}_proj.*, model.norm.weight, lm_head.weight (untied only). The function is transformers'
// GraniteForCausalLM (4.57): a Llama-shaped decoder (RMSNorm before attention and MLP, rotary, GQA, gated MLP) with
// four scalars of its config: the embeddings times `embedding_multiplier`, the attention scores scaled by
// `attention_multiplier` (in place of 1 / sqrt(head_dim)), each block's output times `residual_multiplier` before it
// joins the residual, and the logits divided by `logits_scaling`. GraniteForCausalLM implements the model protocol
// (causal_lm.h); `model.name: granite`. Not thread-safe.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/modules/container/modulelist.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "tessera/config/reader.h"
#include "tessera/models/blocks/attention.h"
#include "tessera/models/blocks/decoder.h"
#include "tessera/models/blocks/layers.h"
#include "tessera/models/blocks/self_attention.h"
#include "tessera/models/causal_lm.h"
#include "tessera/models/parallel_plan.h"

namespace tessera::models {

// transformers' GraniteConfig keys and defaults.
struct GraniteOptions {
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 0;  // resolved: num_attention_heads when not given
  std::string hidden_act = "silu";
  int64_t max_position_embeddings = 2048;
  double initializer_range = 0.02;
  double rms_norm_eps = 1e-6;
  std::optional<int64_t> bos_token_id = 1, eos_token_id = 2, pad_token_id;
  bool tie_word_embeddings = false;
  double rope_theta = 10000.0;
  double rope_factor = 1.0;  // rope_scaling of the linear kind; 1: none
  bool attention_bias = false;
  double attention_dropout = 0.0;
  bool mlp_bias = false;
  double embedding_multiplier = 1.0;
  double logits_scaling = 1.0;
  double residual_multiplier = 1.0;
  double attention_multiplier = 1.0;
  std::string init_device = "cpu";  // cpu | cuda | meta

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
};

// Reads a `model:` section with name granite (GraniteConfig's keys); errors name the key path and line.
GraniteOptions parse_granite_options(config::Section& s);
// config.json (model_type granite) -> options; throws Error("hf") naming `where` for what the family does not compute.
GraniteOptions granite_options_from_hf_config(const nlohmann::json& config, const std::string& where);
nlohmann::ordered_json granite_hf_config(const GraniteOptions& o, at::ScalarType dtype);

class GraniteDecoderLayerImpl : public torch::nn::Module {
 public:
  GraniteDecoderLayerImpl(const GraniteOptions& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  SelfAttention self_attn{nullptr};
  GatedMLP mlp{nullptr};
  Norm input_layernorm{nullptr}, post_attention_layernorm{nullptr};

 private:
  double residual_multiplier_;
};
TORCH_MODULE(GraniteDecoderLayer);

class GraniteModelImpl : public torch::nn::Module {
 public:
  GraniteModelImpl(const GraniteOptions& o, const at::TensorOptions& t);

  Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  Norm norm{nullptr};
};
TORCH_MODULE(GraniteModel);

// Units: 0 = the root (embedding, final norm and head), 1..num_hidden_layers = the decoder layers.
class GraniteForCausalLMImpl : public DecoderLM<GraniteDecoderLayerImpl>, public TensorParallelModel {
 public:
  explicit GraniteForCausalLMImpl(const GraniteOptions& o);
  const GraniteOptions& options() const { return o_; }

  void init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select = nullptr) override;
  std::shared_ptr<CausalLM> rebuild(const std::string& device, std::optional<uint64_t> seed) const override;
  // 6 N (less an untied input embedding, a lookup) + 12 L (heads x head_dim) S.
  double flops_per_token(int64_t seq_len) const override;
  int64_t vocab_size() const override { return o_.vocab_size; }
  int64_t max_seq_len() const override { return o_.max_position_embeddings; }
  std::string describe() const override;
  std::string family() const override { return "granite"; }
  bool has_hf_format() const override { return true; }
  nlohmann::ordered_json hf_config(at::ScalarType dtype) const override { return granite_hf_config(o_, dtype); }
  std::optional<std::string> tied_embedding_name() const override;
  // Heads, the MLP's hidden units and the vocabulary (where it divides); the layers' norms on sequence shards.
  TensorParallelPlan tensor_parallel_plan(int64_t degree) const override;

  GraniteModel model{nullptr};
  Linear lm_head{nullptr};  // only when tie_word_embeddings is false

 protected:
  const torch::nn::ModuleList& decoder_layers() const override { return model->layers; }
  EmbeddingImpl& token_embedding() override { return *model->embed_tokens; }
  at::Tensor embed(const at::Tensor& ids, const DecoderCall& call) override;  // times embedding_multiplier
  AttentionInputs attention_inputs(const DecoderCall& call) override;         // causal masks, rotary tables
  at::Tensor head(const at::Tensor& h) override;                              // divided by logits_scaling

 private:
  GraniteOptions o_;
  at::Tensor inv_freq_;  // (head_dim / 2,) float32, on the CPU
};
TORCH_MODULE(GraniteForCausalLM);

// Builds the model on options.init_device; on a real device initialised as transformers' GranitePreTrainedModel does
// (normal with std initializer_range for Linear and Embedding weights, the pad_token_id embedding row zeroed, zero
// biases, norms 1), each module from its own generator seeded from `seed` and the module's name.
GraniteForCausalLM build_granite(const GraniteOptions& options, uint64_t seed = 17);

}  // namespace tessera::models
