// The SmolLM3 family (Hugging Face's SmolLM3) as LibTorch modules with Hugging Face's module names, so
// named_parameters() gives the keys of SmolLM3ForCausalLM folders (Llama's: model.embed_tokens.weight,
// model.layers.{i}.self_attn.{q,k,v,o}_proj.*, ....mlp.{gate,up,down}_proj.*, ....{input,post_attention}_layernorm
// .weight, model.norm.weight, lm_head.weight when untied). The function is transformers' SmolLM3ForCausalLM (4.57): a
// Llama-shaped decoder whose layers with no_rope_layers[i] == 0 use no rotary embedding at all (NoPE; by default
// every no_rope_layer_interval-th layer), and whose layers of layer type sliding_attention attend through a sliding
// window when use_sliding_window is set. SmolLM3ForCausalLM implements the model protocol (causal_lm.h);
// `model.name: smollm3`. Not thread-safe.
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
#include "tessera/models/blocks/hf_decoder.h"
#include "tessera/models/blocks/layers.h"
#include "tessera/models/blocks/self_attention.h"
#include "tessera/models/family_keys.h"

namespace tessera::models {

// transformers' SmolLM3Config keys and defaults.
struct SmolLM3Options {
  int64_t vocab_size = 128256;
  int64_t hidden_size = 2048;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 36;
  int64_t num_attention_heads = 16;
  int64_t num_key_value_heads = 4;
  std::string hidden_act = "silu";
  int64_t max_position_embeddings = 32768;
  double initializer_range = 0.02;
  double rms_norm_eps = 1e-6;
  std::optional<int64_t> bos_token_id = 128000, eos_token_id = 128001, pad_token_id = 128004;
  bool tie_word_embeddings = true;  // PretrainedConfig's default: SmolLM3Config does not set it
  double rope_theta = 2000000.0;
  double rope_factor = 1.0;  // rope_scaling of the linear kind; 1: none
  bool use_sliding_window = false;
  std::optional<int64_t> sliding_window;
  std::vector<int64_t> no_rope_layers;  // resolved: 1 (rotary) except every no_rope_layer_interval-th layer
  int64_t no_rope_layer_interval = 4;
  std::vector<std::string> layer_types;  // resolved: sliding_attention for NoPE layers with a window, else full
  bool attention_bias = false;
  double attention_dropout = 0.0;
  bool mlp_bias = false;
  std::string init_device = "cpu";  // cpu | cuda | meta

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  bool rotary(int64_t layer) const { return no_rope_layers[static_cast<size_t>(layer)] != 0; }
  bool sliding(int64_t layer) const {
    return use_sliding_window && sliding_window && layer_types[static_cast<size_t>(layer)] == "sliding_attention";
  }
};

// SmolLM3Config's keys: the recipe reader, the config.json reader and writer.
const FamilyKeys<SmolLM3Options>& smollm3_keys();

// Reads the call's full-attention inputs (`global`) or windowed ones (`local`), without the rotary tables in a NoPE
// layer.
class SmolLM3DecoderLayerImpl : public torch::nn::Module {
 public:
  SmolLM3DecoderLayerImpl(const SmolLM3Options& o, int64_t layer, const at::TensorOptions& t);
  at::Tensor forward(const at::Tensor& x, const GlobalLocalInputs& in, LayerCache* cache = nullptr);

  SelfAttention self_attn{nullptr};
  GatedMLP mlp{nullptr};
  Norm input_layernorm{nullptr}, post_attention_layernorm{nullptr};

 private:
  bool rotary_, sliding_;
};
TORCH_MODULE(SmolLM3DecoderLayer);

// Units: 0 = the root (embedding, final norm and head), 1..num_hidden_layers = the decoder layers. Full and windowed
// causal masks, each with the rotary tables (NoPE layers drop them); Llama's tensor-parallel plan.
class SmolLM3ForCausalLMImpl
    : public HfDecoderLM<SmolLM3ForCausalLMImpl, SmolLM3Options, SmolLM3DecoderLayerImpl, GlobalLocalInputs> {
 public:
  explicit SmolLM3ForCausalLMImpl(const SmolLM3Options& o);

 protected:
  bool windowed(int64_t i) const override { return o_.sliding(i); }
  std::string describe_more() const override;
};
TORCH_MODULE(SmolLM3ForCausalLM);

}  // namespace tessera::models
