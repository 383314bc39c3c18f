// The GPT-NeoX family (EleutherAI's GPT-NeoX-20B and the Pythia suite, 14M ... 12B) as LibTorch modules with
// Hugging Face's module names, so named_parameters() gives the keys of GPTNeoXForCausalLM folders:
// gpt_neox.embed_in.weight, gpt_neox.layers.{i}.{input_layernorm,post_attention_layernorm}.{weight,bias},
// ....attention.{query_key_value,dense}.{weight,bias}, ....mlp.{dense_h_to_4h,dense_4h_to_h}.{weight,bias},
// gpt_neox.final_layer_norm.{weight,bias}, embed_out.weight (untied only). The function is transformers'
// GPTNeoXForCausalLM (4.57): per-head interleaved q/k/v, rotary on the first rotary_pct of each head (HF's
// rotate-half layout), parallel (x + attn(ln1 x) + mlp(ln2 x)) or sequential residuals, biases on or off.
// GPTNeoXForCausalLM implements the model protocol (causal_lm.h); `model.name: gpt_neox`. Not thread-safe.
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
#include "tessera/models/causal_lm.h"
#include "tessera/models/parallel_plan.h"

namespace tessera::models {

// HF's GPTNeoXConfig keys and defaults (those of GPT-NeoX-20B).
struct GPTNeoXOptions {
  int64_t vocab_size = 50432;
  int64_t hidden_size = 6144;
  int64_t num_hidden_layers = 44;
  int64_t num_attention_heads = 64;
  int64_t intermediate_size = 24576;
  std::string hidden_act = "gelu";
  double rotary_pct = 0.25;
  double rotary_emb_base = 10000.0;
  double rope_linear_factor = 1.0;  // rope_scaling {rope_type: linear, factor}; 1 = none
  double attention_dropout = 0.0;
  double hidden_dropout = 0.0;
  int64_t max_position_embeddings = 2048;
  double initializer_range = 0.02;
  double layer_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  bool use_parallel_residual = true;
  bool attention_bias = true;
  std::optional<int64_t> bos_token_id = 0, eos_token_id = 2, pad_token_id;
  std::string init_device = "cpu";  // cpu | cuda | meta

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  // The rotated dimensions of each head: int(head_dim * rotary_pct), as transformers truncates it.
  int64_t rotary_ndims() const;
};

// Reads a `model:` section with name gpt_neox (HF's GPTNeoXConfig keys); errors name the key path and line.
GPTNeoXOptions parse_gpt_neox_options(config::Section& s);
// config.json (model_type gpt_neox) -> options; throws Error("hf") naming `where` for what the family does not
// compute.
GPTNeoXOptions gpt_neox_options_from_hf_config(const nlohmann::json& config, const std::string& where);
nlohmann::ordered_json gpt_neox_hf_config(const GPTNeoXOptions& o, at::ScalarType dtype);

class GPTNeoXAttentionImpl : public torch::nn::Module {
 public:
  GPTNeoXAttentionImpl(const GPTNeoXOptions& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  Linear query_key_value{nullptr}, dense{nullptr};

 private:
  GPTNeoXOptions o_;
};
TORCH_MODULE(GPTNeoXAttention);

// dense_4h_to_h(act(dense_h_to_4h(x))).
class GPTNeoXMLPImpl : public torch::nn::Module {
 public:
  GPTNeoXMLPImpl(const GPTNeoXOptions& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x);

  Linear dense_h_to_4h{nullptr}, dense_4h_to_h{nullptr};

 private:
  std::string act_;
};
TORCH_MODULE(GPTNeoXMLP);

class GPTNeoXLayerImpl : public torch::nn::Module {
 public:
  GPTNeoXLayerImpl(const GPTNeoXOptions& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  Norm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  GPTNeoXAttention attention{nullptr};
  GPTNeoXMLP mlp{nullptr};

 private:
  GPTNeoXOptions o_;
};
TORCH_MODULE(GPTNeoXLayer);

class GPTNeoXModelImpl : public torch::nn::Module {
 public:
  GPTNeoXModelImpl(const GPTNeoXOptions& o, const at::TensorOptions& t);

  Embedding embed_in{nullptr};
  torch::nn::ModuleList layers{nullptr};
  Norm final_layer_norm{nullptr};
};
TORCH_MODULE(GPTNeoXModel);

// Units: 0 = the root (embedding, final norm and head), 1..num_hidden_layers = the layers.
class GPTNeoXForCausalLMImpl : public DecoderLM<GPTNeoXLayerImpl>, public TensorParallelModel {
 public:
  explicit GPTNeoXForCausalLMImpl(const GPTNeoXOptions& o);
  const GPTNeoXOptions& options() const { return o_; }

  void init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select = nullptr) override;
  std::shared_ptr<CausalLM> rebuild(const std::string& device, std::optional<uint64_t> seed) const override;
  // 6 N (less an untied input embedding) + 12 L d S.
  double flops_per_token(int64_t seq_len) const override;
  std::optional<double> activation_bytes(int64_t batch, int64_t seq_len, int bytes_per_value,
                                         bool activation_checkpointing) const override;
  int64_t vocab_size() const override { return o_.vocab_size; }
  int64_t max_seq_len() const override { return o_.max_position_embeddings; }
  std::string describe() const override;
  std::string family() const override { return "gpt_neox"; }
  bool has_hf_format() const override { return true; }
  nlohmann::ordered_json hf_config(at::ScalarType dtype) const override { return gpt_neox_hf_config(o_, dtype); }
  std::optional<std::string> tied_embedding_name() const override;
  // Heads, the MLP's hidden units and the vocabulary split.
  TensorParallelPlan tensor_parallel_plan(int64_t degree) const override;

  GPTNeoXModel gpt_neox{nullptr};
  Linear embed_out{nullptr};  // only when tie_word_embeddings is false

 protected:
  const torch::nn::ModuleList& decoder_layers() const override { return gpt_neox->layers; }
  EmbeddingImpl& token_embedding() override { return *gpt_neox->embed_in; }
  at::Tensor embed(const at::Tensor& ids, const DecoderCall& call) override;
  AttentionInputs attention_inputs(const DecoderCall& call) override;
  at::Tensor head(const at::Tensor& h) override { return head_logits(gpt_neox->final_layer_norm(h), embed_out); }

 private:
  GPTNeoXOptions o_;
  at::Tensor inv_freq_;  // (rotary_ndims / 2,) float32 on the CPU
};
TORCH_MODULE(GPTNeoXForCausalLM);

// Builds the model on options.init_device; on a real device initialised as HF's GPTNeoXPreTrainedModel does (normal
// with std initializer_range for Linear and Embedding weights, zero biases, LayerNorms weight 1 and bias 0), each
// module from its own generator seeded from `seed` and the module's name.
GPTNeoXForCausalLM build_gpt_neox(const GPTNeoXOptions& options, uint64_t seed = 17);

}  // namespace tessera::models
