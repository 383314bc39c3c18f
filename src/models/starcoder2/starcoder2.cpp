// The StarCoder2 family: options (recipe and config.json), LayerNorm blocks over the shared attention with biases and
// a GELU MLP, initialisation, the tensor-parallel plan.
#include "models/starcoder2/starcoder2.h"

#include <fmt/format.h>

#include <algorithm>

#include "tessera/config/value.h"
#include "tessera/models/family_keys.h"
#include "tessera/models/family_support.h"

namespace tessera::models {

// ---- Options --------------------------------------------------------------------------------------------------------

// Starcoder2Config's keys.
const FamilyKeys<Starcoder2Options>& starcoder2_keys() {
  using O = Starcoder2Options;
  static const FamilyKeys<O> keys =
      FamilyKeys<O>({"starcoder2"}, [](const std::string&) { return "Starcoder2ForCausalLM"; })
          .field("vocab_size", &O::vocab_size, positive())
          .field("hidden_size", &O::hidden_size, positive())
          .field("intermediate_size", &O::intermediate_size, positive())
          .field("num_hidden_layers", &O::num_hidden_layers, positive())
          .field("num_attention_heads", &O::num_attention_heads, positive())
          .divides("num_attention_heads", &O::num_attention_heads, "hidden_size", &O::hidden_size)
          .field("num_key_value_heads", &O::num_key_value_heads, positive())
          .divides("num_key_value_heads", &O::num_key_value_heads, "num_attention_heads", &O::num_attention_heads)
          .field("hidden_act", &O::hidden_act, hf_activation_check())
          .field("max_position_embeddings", &O::max_position_embeddings, positive())
          .field("initializer_range", &O::initializer_range)
          .field("norm_epsilon", &O::norm_epsilon, positive_real())
          .token_ids()
          .pad_token_below_vocab()
          .field("tie_word_embeddings", &O::tie_word_embeddings)
          .field("rope_theta", &O::rope_theta, positive_real())
          .linear_rope_scaling(&O::rope_factor, "StarCoder2")
          .field("sliding_window", &O::sliding_window, positive_or_none<int64_t>())
          .field("attention_dropout", &O::attention_dropout, probability())
          .field("residual_dropout", &O::residual_dropout, probability())
          .field("embedding_dropout", &O::embedding_dropout, probability())
          .field("use_bias", &O::use_bias);
  return keys;
}

Starcoder2Options parse_starcoder2_options(config::Section& s) {
  Starcoder2Options o;
  starcoder2_keys().read(s, o);
  return o;
}

Starcoder2Options starcoder2_options_from_hf_config(const nlohmann::json& raw, const std::string& where) {
  // The published configs also carry mlp_type, norm_type and layer_norm_epsilon, which transformers' StarCoder2
  // classes do not read (norm_epsilon is the one they do).
  return starcoder2_keys().from_hf(raw, where, &parse_starcoder2_options,
                                   {"mlp_type", "norm_type", "layer_norm_epsilon"});
}

nlohmann::ordered_json starcoder2_hf_config(const Starcoder2Options& o, at::ScalarType dtype) {
  return starcoder2_keys().hf_config(o, "starcoder2", dtype);
}

// ---- Modules --------------------------------------------------------------------------------------------------------

Starcoder2MLPImpl::Starcoder2MLPImpl(const Starcoder2Options& o, const at::TensorOptions& t)
    : act_(o.hidden_act), dropout_(o.residual_dropout) {
  c_fc = register_module("c_fc", Linear(o.hidden_size, o.intermediate_size, o.use_bias, t));
  c_proj = register_module("c_proj", Linear(o.intermediate_size, o.hidden_size, o.use_bias, t));
}

at::Tensor Starcoder2MLPImpl::forward(const at::Tensor& x) {
  return at::dropout(c_proj(hf_activation(act_, c_fc(x))), dropout_, is_training());
}

Starcoder2DecoderLayerImpl::Starcoder2DecoderLayerImpl(const Starcoder2Options& o, const at::TensorOptions& t)
    : residual_dropout_(o.residual_dropout) {
  self_attn = register_module("self_attn", SelfAttention(SelfAttentionOptions{.hidden_size = o.hidden_size,
                                                                              .heads = o.num_attention_heads,
                                                                              .kv_heads = o.num_key_value_heads,
                                                                              .qkv_bias = o.use_bias,
                                                                              .out_bias = o.use_bias,
                                                                              .dropout = o.attention_dropout},
                                                         t));
  mlp = register_module("mlp", Starcoder2MLP(o, t));
  auto norm = [&] { return Norm(o.hidden_size, NormType::kLayerNorm, o.norm_epsilon, true, t); };
  input_layernorm = register_module("input_layernorm", norm());
  post_attention_layernorm = register_module("post_attention_layernorm", norm());
}

at::Tensor Starcoder2DecoderLayerImpl::forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache) {
  const at::Tensor h = x + at::dropout(self_attn(input_layernorm(x), in, cache), residual_dropout_, is_training());
  return h + mlp(post_attention_layernorm(h));
}

Starcoder2ModelImpl::Starcoder2ModelImpl(const Starcoder2Options& o, const at::TensorOptions& t) {
  embed_tokens = register_module("embed_tokens", Embedding(o.vocab_size, o.hidden_size, t));
  if (o.pad_token_id) embed_tokens->padding_idx = *o.pad_token_id;  // nn.Embedding(..., padding_idx)
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.num_hidden_layers; ++i) layers->push_back(Starcoder2DecoderLayer(o, t));
  norm = register_module("norm", Norm(o.hidden_size, NormType::kLayerNorm, o.norm_epsilon, true, t));
}

Starcoder2ForCausalLMImpl::Starcoder2ForCausalLMImpl(const Starcoder2Options& o)
    : DecoderLM("model.layers."), o_(o), inv_freq_(rotary_inv_freq(o.head_dim(), o.rope_theta) / o.rope_factor) {
  const at::TensorOptions t = at::TensorOptions().dtype(at::kFloat).device(at::Device(o.init_device));
  model = register_module("model", Starcoder2Model(o, t));
  if (!o.tie_word_embeddings) lm_head = register_module("lm_head", Linear(o.hidden_size, o.vocab_size, false, t));
}

at::Tensor Starcoder2ForCausalLMImpl::embed(const at::Tensor& ids, const DecoderCall& call) {
  (void)call;
  return at::dropout(model->embed_tokens(ids), o_.embedding_dropout, is_training());
}

AttentionInputs Starcoder2ForCausalLMImpl::attention_inputs(const DecoderCall& call) {
  AttentionInputs in =
      causal_attention_inputs(call.ids, call.fo, call.past, call.key_mask, call.dtype, o_.sliding_window.value_or(0));
  set_rope_tables(in, call.positions, inv_freq_);  // in float32, as transformers computes them
  return in;
}

double Starcoder2ForCausalLMImpl::flops_per_token(int64_t seq_len) const {
  int64_t n = num_params();
  if (!o_.tie_word_embeddings) n -= o_.vocab_size * o_.hidden_size;
  const int64_t keys = o_.sliding_window ? std::min(seq_len, *o_.sliding_window) : seq_len;
  return 6.0 * static_cast<double>(n) + 12.0 * static_cast<double>(o_.num_hidden_layers) *
                                            static_cast<double>(o_.hidden_size) * static_cast<double>(keys);
}

void Starcoder2ForCausalLMImpl::init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select) {
  init_like_transformers(*this, seed, o_.initializer_range, select, std::nullopt);  // zeroes the padding_idx row
}

std::shared_ptr<CausalLM> Starcoder2ForCausalLMImpl::rebuild(const std::string& device,
                                                             std::optional<uint64_t> seed) const {
  Starcoder2Options o = o_;
  o.init_device = device;
  return seed ? build_starcoder2(o, *seed).ptr() : Starcoder2ForCausalLM(o).ptr();
}

std::string Starcoder2ForCausalLMImpl::describe() const {
  return fmt::format(
      "starcoder2: hidden {}, heads {} (kv {}, head_dim {}), layers {}, intermediate {}, vocab {}, "
      "rope theta {}{}",
      o_.hidden_size, o_.num_attention_heads, o_.num_key_value_heads, o_.head_dim(), o_.num_hidden_layers,
      o_.intermediate_size, o_.vocab_size, o_.rope_theta,
      o_.sliding_window ? fmt::format(", sliding window {}", *o_.sliding_window) : "");
}

std::optional<std::string> Starcoder2ForCausalLMImpl::tied_embedding_name() const {
  if (!o_.tie_word_embeddings) return std::nullopt;
  return "model.embed_tokens.weight";
}

Starcoder2ForCausalLM build_starcoder2(const Starcoder2Options& options, uint64_t seed) {
  return build_initialised<Starcoder2ForCausalLM>(options, seed);
}

TensorParallelPlan Starcoder2ForCausalLMImpl::tensor_parallel_plan(int64_t degree) const {
  check_tensor_parallel_split(degree, "StarCoder2", o_.num_attention_heads, o_.num_key_value_heads,
                              o_.intermediate_size);
  TensorParallelPlan plan;
  plan.vocabulary(o_.vocab_size, degree, lm_head ? "lm_head" : "", "model.embed_tokens");
  for (int64_t i = 0; i < o_.num_hidden_layers; ++i) {
    plan.layer(fmt::format("model.layers.{}.", i), {"input_layernorm", "post_attention_layernorm"},
               {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.c_fc"},
               {"self_attn.o_proj", "mlp.c_proj"});
  }
  return plan;
}

}  // namespace tessera::models
