// The StarCoder2 family (BigCode's StarCoder2 3B / 7B / 15B) as LibTorch modules with Hugging Face's module names,
// so named_parameters() gives the keys of Starcoder2ForCausalLM folders: model.embed_tokens.weight,
// model.layers.{i}.input_layernorm.*, ....self_attn.{q,k,v,o}_proj.*, ....post_attention_layernorm.*,
// ....mlp.{c_fc,c_proj}.*, model.norm.*, lm_head.weight (untied only). The function is transformers'
// Starcoder2ForCausalLM (4.57): LayerNorms with biases before the attention and the MLP, q/k/v/o projections with
// biases (use_bias), grouped-query attention with rotary embeddings and an optional sliding window, a GELU MLP with
// biases, dropout on the embeddings and on each block's output. Starcoder2ForCausalLM implements the model protocol
// (causal_lm.h); `model.name: starcoder2`. Not thread-safe.
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

// transformers' Starcoder2Config keys and defaults (StarCoder2 3B's).
struct Starcoder2Options {
  int64_t vocab_size = 49152;
  int64_t hidden_size = 3072;
  int64_t intermediate_size = 12288;
  int64_t num_hidden_layers = 30;
  int64_t num_attention_heads = 24;
  int64_t num_key_value_heads = 2;
  std::string hidden_act = "gelu_pytorch_tanh";
  int64_t max_position_embeddings = 4096;
  double initializer_range = 0.018042;
  double norm_epsilon = 1e-5;
  std::optional<int64_t> bos_token_id = 50256, eos_token_id = 50256, pad_token_id;
  bool tie_word_embeddings = true;  // PretrainedConfig's default: Starcoder2Config does not set it
  double rope_theta = 10000.0;
  double rope_factor = 1.0;               // rope_scaling of the linear kind; 1: none
  std::optional<int64_t> sliding_window;  // each query sees at most this many keys; null: unlimited
  double attention_dropout = 0.0;
  double residual_dropout = 0.0;
  double embedding_dropout = 0.0;
  bool use_bias = true;
  std::string init_device = "cpu";  // cpu | cuda | meta

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
};

// Reads a `model:` section with name starcoder2 (Starcoder2Config's keys); errors name the key path and line.
Starcoder2Options parse_starcoder2_options(config::Section& s);
// config.json (model_type starcoder2) -> options; throws Error("hf") naming `where` for what the family does not
// compute.
Starcoder2Options starcoder2_options_from_hf_config(const nlohmann::json& config, const std::string& where);
nlohmann::ordered_json starcoder2_hf_config(const Starcoder2Options& o, at::ScalarType dtype);

// c_proj(act(c_fc(x))), then the residual dropout.
class Starcoder2MLPImpl : public torch::nn::Module {
 public:
  Starcoder2MLPImpl(const Starcoder2Options& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x);

  Linear c_fc{nullptr}, c_proj{nullptr};

 private:
  std::string act_;
  double dropout_;
};
TORCH_MODULE(Starcoder2MLP);

class Starcoder2DecoderLayerImpl : public torch::nn::Module {
 public:
  Starcoder2DecoderLayerImpl(const Starcoder2Options& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  SelfAttention self_attn{nullptr};
  Starcoder2MLP mlp{nullptr};
  Norm input_layernorm{nullptr}, post_attention_layernorm{nullptr};

 private:
  double residual_dropout_;
};
TORCH_MODULE(Starcoder2DecoderLayer);

class Starcoder2ModelImpl : public torch::nn::Module {
 public:
  Starcoder2ModelImpl(const Starcoder2Options& o, const at::TensorOptions& t);

  Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  Norm norm{nullptr};
};
TORCH_MODULE(Starcoder2Model);

// Units: 0 = the root (embedding, final norm and head), 1..num_hidden_layers = the decoder layers.
class Starcoder2ForCausalLMImpl : public DecoderLM<Starcoder2DecoderLayerImpl>, public TensorParallelModel {
 public:
  explicit Starcoder2ForCausalLMImpl(const Starcoder2Options& o);
  const Starcoder2Options& options() const { return o_; }

  void init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select = nullptr) override;
  std::shared_ptr<CausalLM> rebuild(const std::string& device, std::optional<uint64_t> seed) const override;
  // 6 N (less an untied input embedding, a lookup) + 12 L (heads x head_dim) x keys (at most the window).
  double flops_per_token(int64_t seq_len) const override;
  int64_t vocab_size() const override { return o_.vocab_size; }
  int64_t max_seq_len() const override { return o_.max_position_embeddings; }
  std::string describe() const override;
  std::string family() const override { return "starcoder2"; }
  bool has_hf_format() const override { return true; }
  nlohmann::ordered_json hf_config(at::ScalarType dtype) const override { return starcoder2_hf_config(o_, dtype); }
  std::optional<std::string> tied_embedding_name() const override;
  // Heads, the MLP's hidden units and the vocabulary (where it divides); the layers' LayerNorms on sequence shards.
  TensorParallelPlan tensor_parallel_plan(int64_t degree) const override;

  Starcoder2Model model{nullptr};
  Linear lm_head{nullptr};  // only when tie_word_embeddings is false

 protected:
  const torch::nn::ModuleList& decoder_layers() const override { return model->layers; }
  EmbeddingImpl& token_embedding() override { return *model->embed_tokens; }
  at::Tensor embed(const at::Tensor& ids, const DecoderCall& call) override;  // the embedding dropout
  AttentionInputs attention_inputs(const DecoderCall& call) override;         // causal or windowed masks, rotary
  at::Tensor head(const at::Tensor& h) override { return head_logits(model->norm(h), lm_head); }

 private:
  Starcoder2Options o_;
  at::Tensor inv_freq_;  // (head_dim / 2,) float32, on the CPU
};
TORCH_MODULE(Starcoder2ForCausalLM);

// Builds the model on options.init_device; on a real device initialised as transformers' Starcoder2PreTrainedModel
// does (normal with std initializer_range for Linear and Embedding weights, the pad_token_id embedding row zeroed,
// zero biases, LayerNorms weight 1 and bias 0), each module from its own generator seeded from `seed` and the
// module's name.
Starcoder2ForCausalLM build_starcoder2(const Starcoder2Options& options, uint64_t seed = 17);

}  // namespace tessera::models
