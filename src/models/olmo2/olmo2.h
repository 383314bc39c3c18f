// The OLMo 2 family (AI2's OLMo-2 1B ... 32B, and OLMo 3 as `model_type: olmo3`) as LibTorch modules with Hugging
// Face's module names, so named_parameters() gives the keys of Olmo2ForCausalLM folders: model.embed_tokens.weight,
// model.layers.{i}.self_attn.{q,k,v,o}_proj.*, ....self_attn.{q,k}_norm.weight, ....post_attention_layernorm.weight,
// ....mlp.{gate,up,down}_proj.weight, ....post_feedforward_layernorm.weight, model.norm.weight, lm_head.weight (untied
// only). The function is transformers' Olmo2ForCausalLM (4.57): RMSNorms after the attention and after the MLP,
// inside the residual (x + norm(attn(x)), h + norm(mlp(h))), q/k RMSNorms over the whole projection before the heads
// are split, rotary embeddings, grouped-query attention, a gated MLP. OLMo 3 (transformers' Olmo3ForCausalLM) is the
// same model with sliding-window layers (layer_types; by default three of every four) whose rotary embeddings ignore
// rope_scaling. Olmo2ForCausalLM implements the model protocol (causal_lm.h); `model.name: olmo2` (with
// `model_type: olmo3` for OLMo 3). Not thread-safe.
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

// transformers' Olmo2Config keys and defaults (Olmo3Config adds sliding_window and layer_types).
struct Olmo2Options {
  std::string model_type = "olmo2";  // olmo2 | olmo3: the config.json written back
  int64_t vocab_size = 50304;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 0;  // resolved: num_attention_heads when not given
  std::string hidden_act = "silu";
  int64_t max_position_embeddings = 2048;
  double initializer_range = 0.02;
  std::optional<int64_t> bos_token_id, eos_token_id = 50279, pad_token_id = 1;
  bool tie_word_embeddings = false;
  double rope_theta = 10000.0;
  double rope_factor = 1.0;  // rope_scaling of the linear kind; 1: none
  bool attention_bias = false;
  double attention_dropout = 0.0;
  double rms_norm_eps = 1e-5;
  int64_t sliding_window = 4096;         // OLMo 3's sliding_attention layers
  std::vector<std::string> layer_types;  // OLMo 3; resolved: sliding_attention except every fourth layer
  std::string init_device = "cpu";       // cpu | cuda | meta

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  bool sliding(int64_t layer) const {
    return model_type == "olmo3" && layer_types[static_cast<size_t>(layer)] == "sliding_attention";
  }
};

// Reads a `model:` section with name olmo2 (Olmo2Config's keys, or Olmo3Config's with model_type olmo3); errors name
// the key path and line.
Olmo2Options parse_olmo2_options(config::Section& s);
// config.json (model_type olmo2 or olmo3) -> options; throws Error("hf") naming `where` for what the family does not
// compute.
Olmo2Options olmo2_options_from_hf_config(const nlohmann::json& config, const std::string& where);
nlohmann::ordered_json olmo2_hf_config(const Olmo2Options& o, at::ScalarType dtype);

// Reads the call's full-attention inputs (`global`) or, in an OLMo 3 sliding layer, the windowed ones (`local`).
class Olmo2DecoderLayerImpl : public torch::nn::Module {
 public:
  Olmo2DecoderLayerImpl(const Olmo2Options& o, int64_t layer, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const GlobalLocalInputs& in, LayerCache* cache = nullptr);

  SelfAttention self_attn{nullptr};
  GatedMLP mlp{nullptr};
  Norm post_attention_layernorm{nullptr}, post_feedforward_layernorm{nullptr};

 private:
  bool sliding_;
};
TORCH_MODULE(Olmo2DecoderLayer);

class Olmo2ModelImpl : public torch::nn::Module {
 public:
  Olmo2ModelImpl(const Olmo2Options& o, const at::TensorOptions& t);

  Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  Norm norm{nullptr};
};
TORCH_MODULE(Olmo2Model);

// Units: 0 = the root (embedding, final norm and head), 1..num_hidden_layers = the decoder layers.
class Olmo2ForCausalLMImpl : public DecoderLM<Olmo2DecoderLayerImpl, GlobalLocalInputs>, public TensorParallelModel {
 public:
  explicit Olmo2ForCausalLMImpl(const Olmo2Options& o);
  const Olmo2Options& options() const { return o_; }

  void init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select = nullptr) override;
  std::shared_ptr<CausalLM> rebuild(const std::string& device, std::optional<uint64_t> seed) const override;
  // 6 N (less an untied input embedding, a lookup) + 12 (heads x head_dim) x keys per layer (sliding layers: at most
  // the window).
  double flops_per_token(int64_t seq_len) const override;
  int64_t vocab_size() const override { return o_.vocab_size; }
  int64_t max_seq_len() const override { return o_.max_position_embeddings; }
  std::string describe() const override;
  std::string family() const override { return o_.model_type; }
  bool has_hf_format() const override { return true; }
  nlohmann::ordered_json hf_config(at::ScalarType dtype) const override { return olmo2_hf_config(o_, dtype); }
  std::optional<std::string> tied_embedding_name() const override;
  // Heads (the q/k norms split with their projections' features), the MLP's hidden units and the vocabulary split;
  // the post-norms on sequence shards.
  TensorParallelPlan tensor_parallel_plan(int64_t degree) const override;

  Olmo2Model model{nullptr};
  Linear lm_head{nullptr};  // only when tie_word_embeddings is false

 protected:
  const torch::nn::ModuleList& decoder_layers() const override { return model->layers; }
  EmbeddingImpl& token_embedding() override { return *model->embed_tokens; }
  // Causal masks with the rotary tables (rope_scaling applied), and for OLMo 3's sliding layers windowed masks with
  // unscaled tables.
  GlobalLocalInputs attention_inputs(const DecoderCall& call) override;
  at::Tensor head(const at::Tensor& h) override { return head_logits(model->norm(h), lm_head); }

 private:
  Olmo2Options o_;
  at::Tensor inv_freq_;           // (head_dim / 2,) float32, on the CPU
  at::Tensor inv_freq_unscaled_;  // OLMo 3's sliding layers' (rope_scaling does not apply)
};
TORCH_MODULE(Olmo2ForCausalLM);

// Builds the model on options.init_device; on a real device initialised as transformers' Olmo2PreTrainedModel does
// (normal with std initializer_range for Linear and Embedding weights, the pad_token_id embedding row zeroed, zero
// biases, norms 1), each module from its own generator seeded from `seed` and the module's name.
Olmo2ForCausalLM build_olmo2(const Olmo2Options& options, uint64_t seed = 17);

}  // namespace tessera::models
