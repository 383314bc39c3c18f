// The OPT family (Meta's OPT 125M ... 66B) as LibTorch modules with Hugging Face's module names, so named_parameters()
// gives the keys of OPTForCausalLM folders: model.decoder.embed_tokens.weight (vocab x word_embed_proj_dim),
// model.decoder.embed_positions.weight (max_position_embeddings + 2 rows: positions are offset by 2),
// model.decoder.project_in/project_out.weight (when word_embed_proj_dim differs from hidden_size),
// model.decoder.layers.{i}.self_attn.{q,k,v,out}_proj.*, ....self_attn_layer_norm.*, ....fc1.*, ....fc2.*,
// ....final_layer_norm.*, model.decoder.final_layer_norm.* (pre-LN models), lm_head.weight (untied only). The
// function is transformers' OPTForCausalLM (4.57): learned positions counted over the real tokens, pre-LN or post-LN
// blocks (do_layer_norm_before), ReLU MLP, biases on or off. OPTForCausalLM implements the model protocol
// (causal_lm.h); `model.name: opt`. Not thread-safe.
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

// HF's OPTConfig keys and defaults (those of OPT-125M).
struct OPTOptions {
  int64_t vocab_size = 50272;
  int64_t hidden_size = 768;
  int64_t num_hidden_layers = 12;
  int64_t ffn_dim = 3072;
  int64_t max_position_embeddings = 2048;
  bool do_layer_norm_before = true;
  bool remove_final_layer_norm = false;  // config key _remove_final_layer_norm
  int64_t word_embed_proj_dim = 0;       // resolved: hidden_size when not given
  double dropout = 0.1;
  double attention_dropout = 0.0;
  int64_t num_attention_heads = 12;
  std::string activation_function = "relu";
  double init_std = 0.02;
  bool enable_bias = true;
  bool tie_word_embeddings = true;
  std::optional<int64_t> bos_token_id = 2, eos_token_id = 2, pad_token_id = 1;
  std::string init_device = "cpu";  // cpu | cuda | meta

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  bool projects() const { return word_embed_proj_dim != hidden_size; }
  bool final_norm() const { return do_layer_norm_before && !remove_final_layer_norm; }
};

// Reads a `model:` section with name opt (HF's OPTConfig keys); errors name the key path and line, including what
// Tessera's OPT does not compute (layerdrop, LayerNorms without affine parameters).
OPTOptions parse_opt_options(config::Section& s);
// config.json (model_type opt) -> options; throws Error("hf") naming `where` for what the family does not compute.
OPTOptions opt_options_from_hf_config(const nlohmann::json& config, const std::string& where);
nlohmann::ordered_json opt_hf_config(const OPTOptions& o, at::ScalarType dtype);

class OPTDecoderLayerImpl : public torch::nn::Module {
 public:
  OPTDecoderLayerImpl(const OPTOptions& o, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache = nullptr);

  SelfAttention self_attn{nullptr};
  Norm self_attn_layer_norm{nullptr};
  Linear fc1{nullptr}, fc2{nullptr};
  Norm final_layer_norm{nullptr};

 private:
  OPTOptions o_;
};
TORCH_MODULE(OPTDecoderLayer);

class OPTDecoderImpl : public torch::nn::Module {
 public:
  OPTDecoderImpl(const OPTOptions& o, const at::TensorOptions& t);

  Embedding embed_tokens{nullptr};
  Embedding embed_positions{nullptr};  // row p + 2 holds position p
  Linear project_in{nullptr}, project_out{nullptr};
  Norm final_layer_norm{nullptr};
  torch::nn::ModuleList layers{nullptr};
};
TORCH_MODULE(OPTDecoder);

class OPTModelImpl : public torch::nn::Module {
 public:
  OPTModelImpl(const OPTOptions& o, const at::TensorOptions& t);

  OPTDecoder decoder{nullptr};
};
TORCH_MODULE(OPTModel);

// Units: 0 = the root (embeddings, projections, final norm and head), 1..num_hidden_layers = the decoder layers.
class OPTForCausalLMImpl : public DecoderLM<OPTDecoderLayerImpl>, public TensorParallelModel {
 public:
  explicit OPTForCausalLMImpl(const OPTOptions& o);
  const OPTOptions& options() const { return o_; }

  void init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select = nullptr) override;
  std::shared_ptr<CausalLM> rebuild(const std::string& device, std::optional<uint64_t> seed) const override;
  // 6 N (less the embeddings) + 12 L d S.
  double flops_per_token(int64_t seq_len) const override;
  int64_t vocab_size() const override { return o_.vocab_size; }
  int64_t max_seq_len() const override { return o_.max_position_embeddings; }
  std::string describe() const override;
  std::string family() const override { return "opt"; }
  bool has_hf_format() const override { return true; }
  nlohmann::ordered_json hf_config(at::ScalarType dtype) const override { return opt_hf_config(o_, dtype); }
  std::optional<std::string> tied_embedding_name() const override;
  // Heads, the MLP's hidden units and the vocabulary split.
  TensorParallelPlan tensor_parallel_plan(int64_t degree) const override;

  OPTModel model{nullptr};
  Linear lm_head{nullptr};  // only when tie_word_embeddings is false

 protected:
  const torch::nn::ModuleList& decoder_layers() const override { return model->decoder->layers; }
  EmbeddingImpl& token_embedding() override { return *model->decoder->embed_tokens; }
  // Tokens (projected in when word_embed_proj_dim differs) plus learned positions, offset by 2 as transformers'.
  at::Tensor embed(const at::Tensor& ids, const DecoderCall& call) override;
  AttentionInputs attention_inputs(const DecoderCall& call) override {
    return causal_attention_inputs(call.ids, call.fo, call.past, call.key_mask, call.dtype);
  }
  at::Tensor head(const at::Tensor& h) override;

 private:
  OPTOptions o_;
};
TORCH_MODULE(OPTForCausalLM);

// Builds the model on options.init_device; on a real device initialised as HF's OPTPreTrainedModel does (normal with
// std init_std for Linear and Embedding weights, the pad_token_id row of embed_tokens zeroed, zero biases, LayerNorms
// weight 1 and bias 0), each module from its own generator seeded from `seed` and the module's name.
OPTForCausalLM build_opt(const OPTOptions& options, uint64_t seed = 17);

}  // namespace tessera::models
