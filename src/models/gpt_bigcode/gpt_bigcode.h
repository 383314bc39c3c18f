// The GPT-BigCode family (BigCode's StarCoder 1, StarCoderBase, SantaCoder) as LibTorch modules with Hugging Face's
// module names, so named_parameters() gives the keys of GPTBigCodeForCausalLM folders: transformer.wte.weight,
// transformer.wpe.weight, transformer.h.{i}.ln_1.*, ....attn.c_attn.*, ....attn.c_proj.*, ....ln_2.*,
// ....mlp.c_fc.*, ....mlp.c_proj.*, transformer.ln_f.*, lm_head.weight (untied only). The function is transformers'
// GPTBigCodeForCausalLM (4.57): GPT-2 blocks (LayerNorms before attention and MLP, learned positions, biases
// everywhere) with multi-query attention (`multi_query`: one key/value head, c_attn's output [queries | key |
// value]) or multi-head attention (c_attn's output head-major, each head's query, key and value together).
// GPTBigCodeForCausalLM implements the model protocol (causal_lm.h); `model.name: gpt_bigcode`. Not thread-safe.
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

// transformers' GPTBigCodeConfig keys and defaults.
struct GPTBigCodeOptions {
  int64_t vocab_size = 50257;
  int64_t max_position_embeddings = 1024;  // config key n_positions
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_inner = 0;  // resolved: 4 * n_embd when not given
  std::string activation_function = "gelu_pytorch_tanh";
  double resid_pdrop = 0.1;
  double embd_pdrop = 0.1;
  double attn_pdrop = 0.1;
  double layer_norm_epsilon = 1e-5;
  double initializer_range = 0.02;
  bool scale_attn_weights = true;
  // Where transformers' eager attention upcasts its softmax; its SDPA path, and Tessera, compute the softmax in float32
  // whatever they say.
  bool attention_softmax_in_fp32 = true;
  bool scale_attention_softmax_in_fp32 = true;
  bool multi_query = true;
  bool tie_word_embeddings = true;
  std::optional<int64_t> bos_token_id = 50256, eos_token_id = 50256, pad_token_id;
  std::string init_device = "cpu";  // cpu | cuda | meta

  int64_t head_dim() const { return n_embd / n_head; }
  int64_t kv_heads() const { return multi_query ? 1 : n_head; }
};

// Reads a `model:` section with name gpt_bigcode (GPTBigCodeConfig's keys); errors name the key path and line.
GPTBigCodeOptions parse_gpt_bigcode_options(config::Section& s);
// config.json (model_type gpt_bigcode) -> options; throws Error("hf") naming `where` for what the family does not
// compute.
GPTBigCodeOptions gpt_bigcode_options_from_hf_config(const nlohmann::json& config, const std::string& where);
nlohmann::ordered_json gpt_bigcode_hf_config(const GPTBigCodeOptions& o, at::ScalarType dtype);

class GPTBigCodeAttentionImpl : public torch::nn::Module {
 public:
  GPTBigCodeAttentionImpl(const GPTBigCodeOptions& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  Linear c_attn{nullptr}, c_proj{nullptr};

 private:
  GPTBigCodeOptions o_;
};
TORCH_MODULE(GPTBigCodeAttention);

// c_proj(act(c_fc(x))), then the residual dropout.
class GPTBigCodeMLPImpl : public torch::nn::Module {
 public:
  GPTBigCodeMLPImpl(const GPTBigCodeOptions& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x);

  Linear c_fc{nullptr}, c_proj{nullptr};

 private:
  std::string act_;
  double dropout_;
};
TORCH_MODULE(GPTBigCodeMLP);

class GPTBigCodeBlockImpl : public torch::nn::Module {
 public:
  GPTBigCodeBlockImpl(const GPTBigCodeOptions& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  Norm ln_1{nullptr};
  GPTBigCodeAttention attn{nullptr};
  Norm ln_2{nullptr};
  GPTBigCodeMLP mlp{nullptr};
};
TORCH_MODULE(GPTBigCodeBlock);

class GPTBigCodeModelImpl : public torch::nn::Module {
 public:
  GPTBigCodeModelImpl(const GPTBigCodeOptions& o, const at::TensorOptions& t);

  Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList h{nullptr};
  Norm ln_f{nullptr};
};
TORCH_MODULE(GPTBigCodeModel);

// Units: 0 = the root (embeddings, final norm and head), 1..n_layer = the blocks.
class GPTBigCodeForCausalLMImpl : public DecoderLM<GPTBigCodeBlockImpl>, public TensorParallelModel {
 public:
  explicit GPTBigCodeForCausalLMImpl(const GPTBigCodeOptions& o);
  const GPTBigCodeOptions& options() const { return o_; }

  // transformers' scheme, with the attention's and the MLP's c_proj weights at std initializer_range / sqrt(2 n_layer).
  void init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select = nullptr) override;
  std::shared_ptr<CausalLM> rebuild(const std::string& device, std::optional<uint64_t> seed) const override;
  // 6 N (less the position table and an untied input embedding) + 12 L d S.
  double flops_per_token(int64_t seq_len) const override;
  int64_t vocab_size() const override { return o_.vocab_size; }
  int64_t max_seq_len() const override { return o_.max_position_embeddings; }
  std::string describe() const override;
  std::string family() const override { return "gpt_bigcode"; }
  bool has_hf_format() const override { return true; }
  nlohmann::ordered_json hf_config(at::ScalarType dtype) const override { return gpt_bigcode_hf_config(o_, dtype); }
  std::optional<std::string> tied_embedding_name() const override;
  // Multi-head attention: heads (c_attn is head-major), the MLP's hidden units and the vocabulary (where it divides);
  // the LayerNorms on sequence shards. Multi-query attention's one key/value head does not split: refused.
  TensorParallelPlan tensor_parallel_plan(int64_t degree) const override;

  GPTBigCodeModel transformer{nullptr};
  Linear lm_head{nullptr};  // only when tie_word_embeddings is false

 protected:
  const torch::nn::ModuleList& decoder_layers() const override { return transformer->h; }
  EmbeddingImpl& token_embedding() override { return *transformer->wte; }
  at::Tensor embed(const at::Tensor& ids, const DecoderCall& call) override;  // tokens + learned positions
  AttentionInputs attention_inputs(const DecoderCall& call) override {
    return causal_attention_inputs(call.ids, call.fo, call.past, call.key_mask, call.dtype);
  }
  at::Tensor head(const at::Tensor& h) override { return head_logits(transformer->ln_f(h), lm_head); }

 private:
  GPTBigCodeOptions o_;
};
TORCH_MODULE(GPTBigCodeForCausalLM);

// Builds the model on options.init_device; on a real device initialised as transformers' GPTBigCodePreTrainedModel
// does, each module from its own generator seeded from `seed` and the module's name.
GPTBigCodeForCausalLM build_gpt_bigcode(const GPTBigCodeOptions& options, uint64_t seed = 17);

}  // namespace tessera::models
