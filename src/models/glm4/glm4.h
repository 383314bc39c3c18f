// The GLM-4 family (Zhipu's GLM-4-0414: `model_type: glm4`) as LibTorch modules with Hugging Face's module names, so
// named_parameters() gives the keys of Glm4ForCausalLM folders: model.embed_tokens.weight,
// model.layers.{i}.self_attn.{q,k,v}_proj.{weight,bias}, ....self_attn.o_proj.weight, ....mlp.gate_up_proj.weight,
// ....mlp.down_proj.weight, ....{input,post_self_attn,post_attention,post_mlp}_layernorm.weight, model.norm.weight,
// lm_head.weight (untied only). The function is transformers' Glm4ForCausalLM (4.57): RMSNorms before and after both
// the attention and the MLP (x + post_self_attn_norm(attn(input_norm(x))), h +
// post_mlp_norm(mlp(post_attention_norm(h)))), grouped-query attention with biases on q/k/v, rotary on the first
// partial_rotary_factor of each head in the interleaved layout (pairs 2i, 2i + 1), a SwiGLU MLP with one fused
// gate_up_proj. Glm4ForCausalLM implements the model protocol (causal_lm.h); `model.name: glm4`. Not thread-safe.
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

// transformers' Glm4Config keys and defaults (GLM-4-9B-0414's shape).
struct Glm4Options {
  int64_t vocab_size = 151552;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 13696;
  int64_t num_hidden_layers = 40;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 2;
  double partial_rotary_factor = 0.5;
  int64_t head_dim = 128;
  std::string hidden_act = "silu";
  double attention_dropout = 0.0;
  int64_t max_position_embeddings = 131072;
  double initializer_range = 0.02;
  double rms_norm_eps = 0.00000015625;
  bool tie_word_embeddings = false;
  double rope_theta = 10000.0;
  std::optional<int64_t> bos_token_id, eos_token_id = 151329, pad_token_id = 151329;
  bool attention_bias = true;       // q, k and v; o_proj has none
  std::string init_device = "cpu";  // cpu | cuda | meta

  // int(head_dim * partial_rotary_factor): the features of each head that rotate.
  int64_t rotary_dims() const;
};

// Reads a `model:` section with name glm4 (Glm4Config's keys); errors name the key path and line.
Glm4Options parse_glm4_options(config::Section& s);
// config.json (model_type glm4) -> options; throws Error("hf") naming `where` for what the family does not compute.
Glm4Options glm4_options_from_hf_config(const nlohmann::json& config, const std::string& where);
nlohmann::ordered_json glm4_hf_config(const Glm4Options& o, at::ScalarType dtype);

// down_proj(up * act(gate)), gate and up the halves of one gate_up_proj.
class Glm4MLPImpl : public torch::nn::Module {
 public:
  Glm4MLPImpl(const Glm4Options& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x);

  Linear gate_up_proj{nullptr}, down_proj{nullptr};

 private:
  std::string act_;
};
TORCH_MODULE(Glm4MLP);

class Glm4DecoderLayerImpl : public torch::nn::Module {
 public:
  Glm4DecoderLayerImpl(const Glm4Options& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  SelfAttention self_attn{nullptr};
  Glm4MLP mlp{nullptr};
  Norm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  Norm post_self_attn_layernorm{nullptr}, post_mlp_layernorm{nullptr};
};
TORCH_MODULE(Glm4DecoderLayer);

class Glm4ModelImpl : public torch::nn::Module {
 public:
  Glm4ModelImpl(const Glm4Options& o, const at::TensorOptions& t);

  Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  Norm norm{nullptr};
};
TORCH_MODULE(Glm4Model);

// Units: 0 = the root (embedding, final norm and head), 1..num_hidden_layers = the decoder layers.
class Glm4ForCausalLMImpl : public DecoderLM<Glm4DecoderLayerImpl>, public TensorParallelModel {
 public:
  explicit Glm4ForCausalLMImpl(const Glm4Options& o);
  const Glm4Options& options() const { return o_; }

  void init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select = nullptr) override;
  std::shared_ptr<CausalLM> rebuild(const std::string& device, std::optional<uint64_t> seed) const override;
  // 6 N (less an untied input embedding, a lookup) + 12 L (heads x head_dim) S.
  double flops_per_token(int64_t seq_len) const override;
  int64_t vocab_size() const override { return o_.vocab_size; }
  int64_t max_seq_len() const override { return o_.max_position_embeddings; }
  std::string describe() const override;
  std::string family() const override { return "glm4"; }
  bool has_hf_format() const override { return true; }
  nlohmann::ordered_json hf_config(at::ScalarType dtype) const override { return glm4_hf_config(o_, dtype); }
  std::optional<std::string> tied_embedding_name() const override;
  // Heads, the fused gate_up_proj in its two blocks, the vocabulary (where it divides); the four norms on sequence
  // shards.
  TensorParallelPlan tensor_parallel_plan(int64_t degree) const override;

  Glm4Model model{nullptr};
  Linear lm_head{nullptr};  // only when tie_word_embeddings is false

 protected:
  const torch::nn::ModuleList& decoder_layers() const override { return model->layers; }
  EmbeddingImpl& token_embedding() override { return *model->embed_tokens; }
  AttentionInputs attention_inputs(const DecoderCall& call) override;  // causal masks, partial rotary tables
  at::Tensor head(const at::Tensor& h) override { return head_logits(model->norm(h), lm_head); }

 private:
  Glm4Options o_;
  at::Tensor inv_freq_;  // (rotary_dims / 2,) float32, on the CPU
};
TORCH_MODULE(Glm4ForCausalLM);

// Builds the model on options.init_device; on a real device initialised as transformers' Glm4PreTrainedModel does
// (normal with std initializer_range for Linear and Embedding weights, the pad_token_id embedding row zeroed, zero
// biases, norms 1), each module from its own generator seeded from `seed` and the module's name.
Glm4ForCausalLM build_glm4(const Glm4Options& options, uint64_t seed = 17);

}  // namespace tessera::models
