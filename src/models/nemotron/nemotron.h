// The Nemotron family (NVIDIA's Nemotron-3 / Nemotron-4 / Minitron) as LibTorch modules with Hugging Face's module
// names, so named_parameters() gives the keys of NemotronForCausalLM folders: model.embed_tokens.weight,
// model.layers.{i}.input_layernorm.*, ....self_attn.{q,k,v,o}_proj.*, ....post_attention_layernorm.*,
// ....mlp.{up,down}_proj.*, model.norm.*, lm_head.weight (untied only). The function is transformers'
// NemotronForCausalLM (4.57): LayerNorm1P (a LayerNorm scaled by 1 + weight) before the attention and the MLP,
// grouped-query attention with an explicit head_dim and rotary embeddings on the first partial_rotary_factor of each
// head, an ungated MLP with squared ReLU (relu2). NemotronForCausalLM implements the model protocol (causal_lm.h);
// `model.name: nemotron`. Not thread-safe.
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

// transformers' NemotronConfig keys and defaults.
struct NemotronOptions {
  int64_t vocab_size = 256000;
  int64_t hidden_size = 6144;
  int64_t intermediate_size = 24576;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 48;
  int64_t head_dim = 0;             // resolved: hidden_size / num_attention_heads when not given
  int64_t num_key_value_heads = 0;  // resolved: num_attention_heads when not given
  std::string hidden_act = "relu2";
  int64_t max_position_embeddings = 4096;
  double initializer_range = 0.0134;
  double norm_eps = 1e-5;
  std::optional<int64_t> bos_token_id = 2, eos_token_id = 3, pad_token_id;
  bool tie_word_embeddings = false;
  double rope_theta = 10000.0;
  double partial_rotary_factor = 0.5;
  bool attention_bias = false;
  double attention_dropout = 0.0;
  bool mlp_bias = false;
  std::string init_device = "cpu";  // cpu | cuda | meta

  // int(head_dim * partial_rotary_factor): the features of each head that rotate.
  int64_t rotary_dims() const;
};

// Reads a `model:` section with name nemotron (NemotronConfig's keys); errors name the key path and line.
NemotronOptions parse_nemotron_options(config::Section& s);
// config.json (model_type nemotron) -> options; throws Error("hf") naming `where` for what the family does not
// compute.
NemotronOptions nemotron_options_from_hf_config(const nlohmann::json& config, const std::string& where);
nlohmann::ordered_json nemotron_hf_config(const NemotronOptions& o, at::ScalarType dtype);

// down_proj(act(up_proj(x))), no gate.
class NemotronMLPImpl : public torch::nn::Module {
 public:
  NemotronMLPImpl(const NemotronOptions& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x);

  Linear up_proj{nullptr}, down_proj{nullptr};

 private:
  std::string act_;
};
TORCH_MODULE(NemotronMLP);

class NemotronDecoderLayerImpl : public torch::nn::Module {
 public:
  NemotronDecoderLayerImpl(const NemotronOptions& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  SelfAttention self_attn{nullptr};
  NemotronMLP mlp{nullptr};
  Norm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(NemotronDecoderLayer);

class NemotronModelImpl : public torch::nn::Module {
 public:
  NemotronModelImpl(const NemotronOptions& o, const at::TensorOptions& t);

  Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  Norm norm{nullptr};
};
TORCH_MODULE(NemotronModel);

// Units: 0 = the root (embedding, final norm and head), 1..num_hidden_layers = the decoder layers.
class NemotronForCausalLMImpl : public DecoderLM<NemotronDecoderLayerImpl>, public TensorParallelModel {
 public:
  explicit NemotronForCausalLMImpl(const NemotronOptions& o);
  const NemotronOptions& options() const { return o_; }

  void init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select = nullptr) override;
  std::shared_ptr<CausalLM> rebuild(const std::string& device, std::optional<uint64_t> seed) const override;
  // 6 N (less an untied input embedding, a lookup) + 12 L (heads x head_dim) S.
  double flops_per_token(int64_t seq_len) const override;
  int64_t vocab_size() const override { return o_.vocab_size; }
  int64_t max_seq_len() const override { return o_.max_position_embeddings; }
  std::string describe() const override;
  std::string family() const override { return "nemotron"; }
  bool has_hf_format() const override { return true; }
  nlohmann::ordered_json hf_config(at::ScalarType dtype) const override { return nemotron_hf_config(o_, dtype); }
  std::optional<std::string> tied_embedding_name() const override;
  // Heads, the MLP's hidden units and the vocabulary (where it divides); the layers' norms on sequence shards.
  TensorParallelPlan tensor_parallel_plan(int64_t degree) const override;

  NemotronModel model{nullptr};
  Linear lm_head{nullptr};  // only when tie_word_embeddings is false

 protected:
  const torch::nn::ModuleList& decoder_layers() const override { return model->layers; }
  EmbeddingImpl& token_embedding() override { return *model->embed_tokens; }
  AttentionInputs attention_inputs(const DecoderCall& call) override;  // causal masks, partial rotary tables
  at::Tensor head(const at::Tensor& h) override { return head_logits(model->norm(h), lm_head); }

 private:
  NemotronOptions o_;
  at::Tensor inv_freq_;  // (rotary_dims / 2,) float32, on the CPU
};
TORCH_MODULE(NemotronForCausalLM);

// Builds the model on options.init_device; on a real device initialised as transformers' NemotronPreTrainedModel does
// (normal with std initializer_range for Linear and Embedding weights, the pad_token_id embedding row zeroed, zero
// biases, LayerNorm1P weight 1 and bias 0), each module from its own generator seeded from `seed` and the module's
// name.
NemotronForCausalLM build_nemotron(const NemotronOptions& options, uint64_t seed = 17);

}  // namespace tessera::models
