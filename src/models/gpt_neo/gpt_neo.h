// The GPT-Neo family (EleutherAI's GPT-Neo 125M, 1.3B, 2.7B) as LibTorch modules with Hugging Face's module names,
// so named_parameters() gives the keys of GPTNeoForCausalLM folders: transformer.{wte,wpe}.weight,
// transformer.h.{i}.{ln_1,ln_2}.*, transformer.h.{i}.attn.attention.{q,k,v}_proj.weight (no biases),
// ....attn.attention.out_proj.{weight,bias}, ....mlp.{c_fc,c_proj}.*, transformer.ln_f.*; the head is tied to wte.
// The function is transformers' GPTNeoForCausalLM (4.57): learned positions, layers alternating global causal
// attention and local attention over the last window_size tokens (attention_types), scores NOT scaled by
// 1/sqrt(head_dim), pre-LN blocks. GPTNeoForCausalLM implements the model protocol (causal_lm.h);
// `model.name: gpt_neo`. Not thread-safe.
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
#include "tessera/models/blocks/self_attention.h"
#include "tessera/models/causal_lm.h"
#include "tessera/models/parallel_plan.h"

namespace tessera::models {

// HF's GPTNeoConfig keys and defaults (those of GPT-Neo 1.3B).
struct GPTNeoOptions {
  int64_t vocab_size = 50257;
  int64_t max_position_embeddings = 2048;
  int64_t hidden_size = 2048;
  int64_t num_layers = 24;
  // Per layer, "global" or "local": attention_types ([[["global", "local"], 12]]) expanded as transformers does
  // (each pattern repeated its count of times), or the config's attention_layers when it gives them.
  std::vector<std::string> attention_layers;
  int64_t num_heads = 16;
  int64_t intermediate_size = 0;  // resolved: 4 * hidden_size when not given
  int64_t window_size = 256;
  std::string activation_function = "gelu_new";
  double resid_dropout = 0.0;
  double embed_dropout = 0.0;
  double attention_dropout = 0.0;
  double layer_norm_epsilon = 1e-5;
  double initializer_range = 0.02;
  std::optional<int64_t> bos_token_id = 50256, eos_token_id = 50256, pad_token_id;
  std::string init_device = "cpu";  // cpu | cuda | meta

  int64_t head_dim() const { return hidden_size / num_heads; }
  // attention_types as given (for config.json): runs of equal patterns, compressed back.
  nlohmann::ordered_json attention_types() const;
};

// Reads a `model:` section with name gpt_neo (HF's GPTNeoConfig keys); errors name the key path and line.
GPTNeoOptions parse_gpt_neo_options(config::Section& s);
// config.json (model_type gpt_neo) -> options; throws Error("hf") naming `where` for what the family does not
// compute.
GPTNeoOptions gpt_neo_options_from_hf_config(const nlohmann::json& config, const std::string& where);
nlohmann::ordered_json gpt_neo_hf_config(const GPTNeoOptions& o, at::ScalarType dtype);

// transformers' GPTNeoAttention: a wrapper whose one child is `attention` (hence attn.attention.* names).
class GPTNeoAttentionImpl : public torch::nn::Module {
 public:
  GPTNeoAttentionImpl(const GPTNeoOptions& o, const at::TensorOptions& t);

  SelfAttention attention{nullptr};  // unscaled scores
};
TORCH_MODULE(GPTNeoAttention);

class GPTNeoMLPImpl : public torch::nn::Module {
 public:
  GPTNeoMLPImpl(const GPTNeoOptions& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x);

  Linear c_fc{nullptr}, c_proj{nullptr};

 private:
  std::string act_;
  double dropout_;
};
TORCH_MODULE(GPTNeoMLP);

class GPTNeoBlockImpl : public torch::nn::Module {
 public:
  GPTNeoBlockImpl(const GPTNeoOptions& o, bool local, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const GlobalLocalInputs& in, LayerCache* cache = nullptr);

  Norm ln_1{nullptr};
  GPTNeoAttention attn{nullptr};
  Norm ln_2{nullptr};
  GPTNeoMLP mlp{nullptr};

 private:
  bool local_;
  double resid_dropout_;
};
TORCH_MODULE(GPTNeoBlock);

class GPTNeoModelImpl : public torch::nn::Module {
 public:
  GPTNeoModelImpl(const GPTNeoOptions& o, const at::TensorOptions& t);

  Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList h{nullptr};
  Norm ln_f{nullptr};
};
TORCH_MODULE(GPTNeoModel);

// Units: 0 = the root (embeddings, final norm and tied head), 1..num_layers = the blocks.
class GPTNeoForCausalLMImpl : public DecoderLM<GPTNeoBlockImpl, GlobalLocalInputs>, public TensorParallelModel {
 public:
  explicit GPTNeoForCausalLMImpl(const GPTNeoOptions& o);
  const GPTNeoOptions& options() const { return o_; }

  void init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select = nullptr) override;
  std::shared_ptr<CausalLM> rebuild(const std::string& device, std::optional<uint64_t> seed) const override;
  // 6 N (less the position table) + 12 L d S (local layers attend over at most window_size keys).
  double flops_per_token(int64_t seq_len) const override;
  int64_t vocab_size() const override { return o_.vocab_size; }
  int64_t max_seq_len() const override { return o_.max_position_embeddings; }
  std::string describe() const override;
  std::string family() const override { return "gpt_neo"; }
  bool has_hf_format() const override { return true; }
  nlohmann::ordered_json hf_config(at::ScalarType dtype) const override { return gpt_neo_hf_config(o_, dtype); }
  std::optional<std::string> tied_embedding_name() const override { return "transformer.wte.weight"; }
  // Heads, the MLP's hidden units and the vocabulary split.
  TensorParallelPlan tensor_parallel_plan(int64_t degree) const override;

  GPTNeoModel transformer{nullptr};

 protected:
  const torch::nn::ModuleList& decoder_layers() const override { return transformer->h; }
  EmbeddingImpl& token_embedding() override { return *transformer->wte; }
  at::Tensor embed(const at::Tensor& ids, const DecoderCall& call) override;  // tokens + learned positions
  // The global layers' causal inputs and the local layers' windowed ones (the window counts absolute positions in the
  // row, padding included, as transformers' banded mask).
  GlobalLocalInputs attention_inputs(const DecoderCall& call) override {
    return {causal_attention_inputs(call.ids, call.fo, call.past, call.key_mask, call.dtype),
            causal_attention_inputs(call.ids, call.fo, call.past, call.key_mask, call.dtype, o_.window_size)};
  }
  at::Tensor head(const at::Tensor& h) override { return transformer->wte->attend(transformer->ln_f(h)); }

 private:
  GPTNeoOptions o_;
};
TORCH_MODULE(GPTNeoForCausalLM);

// Builds the model on options.init_device; on a real device initialised as HF's GPTNeoPreTrainedModel does (normal
// with std initializer_range for Linear and Embedding weights, zero biases, LayerNorms weight 1 and bias 0), each
// module from its own generator seeded from `seed` and the module's name.
GPTNeoForCausalLM build_gpt_neo(const GPTNeoOptions& options, uint64_t seed = 17);

}  // namespace tessera::models
