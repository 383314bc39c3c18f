// The Gemma 2 and Gemma 3 (text) families as LibTorch modules with Hugging Face's module names, so named_parameters()
// gives the keys of Gemma2ForCausalLM / Gemma3ForCausalLM folders: model.embed_tokens.weight,
// model.layers.{i}.self_attn.{q,k,v,o}_proj.weight (+ q_norm / k_norm in Gemma 3),
// ....mlp.{gate,up,down}_proj.weight, ....{input,post_attention,pre_feedforward,post_feedforward}_layernorm.weight,
// model.norm.weight, lm_head.weight (untied only). The function is transformers' (4.57): RMSNorm scaling by
// (1 + weight) in float32, embeddings scaled by sqrt(hidden_size), GeGLU MLP, queries scaled by
// query_pre_attn_scalar^-1/2, sliding-window and full layers (layer_types), attention and final logit soft-capping,
// norms before and after attention and MLP; Gemma 3 adds q/k norms and a separate rope base for its sliding layers.
// GemmaForCausalLM implements the model protocol (causal_lm.h); `model.name: gemma2` or `gemma3_text`.
// Not thread-safe.
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

// HF's Gemma2Config / Gemma3TextConfig keys; defaults are those of the model_type's config class (Gemma 2 2B's,
// Gemma 3 4B's text model).
struct GemmaOptions {
  std::string model_type = "gemma2";  // gemma2 | gemma3_text
  int64_t vocab_size = 256000;
  int64_t hidden_size = 2304;
  int64_t intermediate_size = 9216;
  int64_t num_hidden_layers = 26;
  int64_t num_attention_heads = 8;
  int64_t num_key_value_heads = 4;
  int64_t head_dim = 256;
  std::string hidden_activation = "gelu_pytorch_tanh";
  int64_t max_position_embeddings = 8192;
  double initializer_range = 0.02;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = true;
  double rope_theta = 10000.0;
  double rope_local_base_freq = 10000.0;  // Gemma 3: the sliding layers' rope base (Gemma 2: rope_theta)
  double rope_linear_factor = 1.0;        // rope_scaling {rope_type: linear, factor} of the full layers; 1 = none
  bool attention_bias = false;
  double attention_dropout = 0.0;
  double query_pre_attn_scalar = 256;
  int64_t sliding_window = 4096;
  std::vector<std::string> layer_types;  // per layer: "sliding_attention" | "full_attention"
  std::optional<double> final_logit_softcapping = 30.0;
  std::optional<double> attn_logit_softcapping = 50.0;
  std::optional<int64_t> bos_token_id = 2, eos_token_id = 1, pad_token_id = 0;
  std::string init_device = "cpu";  // cpu | cuda | meta

  bool gemma3() const { return model_type == "gemma3_text"; }
  bool sliding(int64_t layer) const { return layer_types[static_cast<size_t>(layer)] == "sliding_attention"; }
};

// Reads a `model:` section with name gemma2 or gemma3_text (the config class's keys); errors name the key path and
// line, including what Tessera's Gemma does not compute.
GemmaOptions parse_gemma_options(config::Section& s, const std::string& model_type);
// config.json (model_type gemma2 or gemma3_text) -> options; throws Error("hf") naming `where` for what the family
// does not compute.
GemmaOptions gemma_options_from_hf_config(const nlohmann::json& config, const std::string& where);
nlohmann::ordered_json gemma_hf_config(const GemmaOptions& o, at::ScalarType dtype);

class GemmaDecoderLayerImpl : public torch::nn::Module {
 public:
  GemmaDecoderLayerImpl(const GemmaOptions& o, int64_t layer, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const GlobalLocalInputs& in, LayerCache* cache = nullptr);

  SelfAttention self_attn{nullptr};
  GatedMLP mlp{nullptr};
  Norm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  Norm pre_feedforward_layernorm{nullptr}, post_feedforward_layernorm{nullptr};

 private:
  bool sliding_;
};
TORCH_MODULE(GemmaDecoderLayer);

class GemmaModelImpl : public torch::nn::Module {
 public:
  GemmaModelImpl(const GemmaOptions& o, const at::TensorOptions& t);

  Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  Norm norm{nullptr};
};
TORCH_MODULE(GemmaModel);

// Units: 0 = the root (embedding, final norm and head), 1..num_hidden_layers = the decoder layers.
class GemmaForCausalLMImpl : public DecoderLM<GemmaDecoderLayerImpl, GlobalLocalInputs>, public TensorParallelModel {
 public:
  explicit GemmaForCausalLMImpl(const GemmaOptions& o);
  const GemmaOptions& options() const { return o_; }

  void init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select = nullptr) override;
  std::shared_ptr<CausalLM> rebuild(const std::string& device, std::optional<uint64_t> seed) const override;
  // 6 N (less an untied input embedding) + 12 (heads x head_dim) x keys per layer (sliding layers: at most the
  // window).
  double flops_per_token(int64_t seq_len) const override;
  int64_t vocab_size() const override { return o_.vocab_size; }
  int64_t max_seq_len() const override { return o_.max_position_embeddings; }
  std::string describe() const override;
  std::string family() const override { return o_.model_type; }
  bool has_hf_format() const override { return true; }
  nlohmann::ordered_json hf_config(at::ScalarType dtype) const override { return gemma_hf_config(o_, dtype); }
  std::optional<std::string> tied_embedding_name() const override;
  // Heads (Gemma 3's q/k norms over this rank's heads), the MLP's hidden units and the vocabulary split.
  TensorParallelPlan tensor_parallel_plan(int64_t degree) const override;

  GemmaModel model{nullptr};
  Linear lm_head{nullptr};  // only when tie_word_embeddings is false

 protected:
  const torch::nn::ModuleList& decoder_layers() const override { return model->layers; }
  EmbeddingImpl& token_embedding() override { return *model->embed_tokens; }
  at::Tensor embed(const at::Tensor& ids, const DecoderCall& call) override;  // scaled by sqrt(hidden_size)
  // Full and sliding layers' inputs, each with its rotary base; the attention logits' soft-cap.
  GlobalLocalInputs attention_inputs(const DecoderCall& call) override;
  at::Tensor head(const at::Tensor& h) override;  // the final logits' soft-cap

 private:
  GemmaOptions o_;
  at::Tensor inv_freq_global_, inv_freq_local_;  // (head_dim / 2,) float32 on the CPU
};
TORCH_MODULE(GemmaForCausalLM);

// Builds the model on options.init_device; on a real device initialised as transformers' Gemma2PreTrainedModel /
// Gemma3PreTrainedModel do (normal with std initializer_range for Linear and Embedding weights, the pad_token_id
// embedding row zeroed, zero biases, RMSNorm weights 0), each module from its own generator.
GemmaForCausalLM build_gemma(const GemmaOptions& options, uint64_t seed = 17);

}  // namespace tessera::models
