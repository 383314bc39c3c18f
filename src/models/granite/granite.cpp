// The Granite family: options (recipe and config.json), a Llama-shaped decoder with Granite's embedding, attention,
// residual and logits multipliers, initialisation, the tensor-parallel plan.
#include "models/granite/granite.h"

#include <fmt/format.h>

#include "tessera/config/value.h"
#include "tessera/models/family_keys.h"
#include "tessera/models/family_support.h"

namespace tessera::models {

// ---- Options --------------------------------------------------------------------------------------------------------

// GraniteConfig's keys.
const FamilyKeys<GraniteOptions>& granite_keys() {
  using O = GraniteOptions;
  static const FamilyKeys<O> keys =
      FamilyKeys<O>({"granite"}, [](const std::string&) { return "GraniteForCausalLM"; })
          .field("vocab_size", &O::vocab_size, positive())
          .field("hidden_size", &O::hidden_size, positive())
          .field("intermediate_size", &O::intermediate_size, positive())
          .field("num_hidden_layers", &O::num_hidden_layers, positive())
          .field("num_attention_heads", &O::num_attention_heads, positive())
          .divides("num_attention_heads", &O::num_attention_heads, "hidden_size", &O::hidden_size)
          .resolved(
              "num_key_value_heads", &O::num_key_value_heads, [](const O& o) { return o.num_attention_heads; },
              positive())
          .divides("num_key_value_heads", &O::num_key_value_heads, "num_attention_heads", &O::num_attention_heads)
          .field("hidden_act", &O::hidden_act, hf_activation_check())
          .field("max_position_embeddings", &O::max_position_embeddings, positive())
          .field("initializer_range", &O::initializer_range)
          .field("rms_norm_eps", &O::rms_norm_eps, positive_real())
          .token_ids()
          .pad_token_below_vocab()
          .field("tie_word_embeddings", &O::tie_word_embeddings)
          .field("rope_theta", &O::rope_theta, positive_real())
          .linear_rope_scaling(&O::rope_factor, "Granite")
          .field("attention_bias", &O::attention_bias)
          .field("attention_dropout", &O::attention_dropout, probability())
          .field("mlp_bias", &O::mlp_bias)
          .field("embedding_multiplier", &O::embedding_multiplier)
          .field("logits_scaling", &O::logits_scaling, positive_real())
          .field("residual_multiplier", &O::residual_multiplier)
          .field("attention_multiplier", &O::attention_multiplier, positive_real());
  return keys;
}

GraniteOptions parse_granite_options(config::Section& s) {
  GraniteOptions o;
  granite_keys().read(s, o);
  return o;
}

GraniteOptions granite_options_from_hf_config(const nlohmann::json& raw, const std::string& where) {
  return granite_keys().from_hf(raw, where, &parse_granite_options);
}

nlohmann::ordered_json granite_hf_config(const GraniteOptions& o, at::ScalarType dtype) {
  return granite_keys().hf_config(o, "granite", dtype);
}

// ---- Modules --------------------------------------------------------------------------------------------------------

GraniteDecoderLayerImpl::GraniteDecoderLayerImpl(const GraniteOptions& o, const at::TensorOptions& t)
    : residual_multiplier_(o.residual_multiplier) {
  self_attn = register_module("self_attn", SelfAttention(SelfAttentionOptions{.hidden_size = o.hidden_size,
                                                                              .heads = o.num_attention_heads,
                                                                              .kv_heads = o.num_key_value_heads,
                                                                              .qkv_bias = o.attention_bias,
                                                                              .out_bias = o.attention_bias,
                                                                              .scale = o.attention_multiplier,
                                                                              .dropout = o.attention_dropout},
                                                         t));
  mlp = register_module("mlp", GatedMLP(o.hidden_size, o.intermediate_size, o.hidden_act, o.mlp_bias, t));
  auto norm = [&] { return Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t); };
  input_layernorm = register_module("input_layernorm", norm());
  post_attention_layernorm = register_module("post_attention_layernorm", norm());
}

at::Tensor GraniteDecoderLayerImpl::forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache) {
  const at::Tensor h = x + self_attn(input_layernorm(x), in, cache) * residual_multiplier_;
  return h + mlp(post_attention_layernorm(h)) * residual_multiplier_;
}

GraniteModelImpl::GraniteModelImpl(const GraniteOptions& o, const at::TensorOptions& t) {
  embed_tokens = register_module("embed_tokens", Embedding(o.vocab_size, o.hidden_size, t));
  if (o.pad_token_id) embed_tokens->padding_idx = *o.pad_token_id;  // nn.Embedding(..., padding_idx)
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.num_hidden_layers; ++i) layers->push_back(GraniteDecoderLayer(o, t));
  norm = register_module("norm", Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t));
}

GraniteForCausalLMImpl::GraniteForCausalLMImpl(const GraniteOptions& o)
    : DecoderLM("model.layers."), o_(o), inv_freq_(rotary_inv_freq(o.head_dim(), o.rope_theta) / o.rope_factor) {
  const at::TensorOptions t = at::TensorOptions().dtype(at::kFloat).device(at::Device(o.init_device));
  model = register_module("model", GraniteModel(o, t));
  if (!o.tie_word_embeddings) lm_head = register_module("lm_head", Linear(o.hidden_size, o.vocab_size, false, t));
}

at::Tensor GraniteForCausalLMImpl::embed(const at::Tensor& ids, const DecoderCall& call) {
  (void)call;
  return model->embed_tokens(ids) * o_.embedding_multiplier;
}

AttentionInputs GraniteForCausalLMImpl::attention_inputs(const DecoderCall& call) {
  AttentionInputs in = causal_attention_inputs(call.ids, call.fo, call.past, call.key_mask, call.dtype);
  set_rope_tables(in, call.positions, inv_freq_);  // in float32, as transformers computes them
  return in;
}

at::Tensor GraniteForCausalLMImpl::head(const at::Tensor& h) {
  return head_logits(model->norm(h), lm_head) / o_.logits_scaling;
}

double GraniteForCausalLMImpl::flops_per_token(int64_t seq_len) const {
  int64_t n = num_params();
  if (!o_.tie_word_embeddings) n -= o_.vocab_size * o_.hidden_size;
  return 6.0 * static_cast<double>(n) + 12.0 * static_cast<double>(o_.num_hidden_layers) *
                                            static_cast<double>(o_.hidden_size) * static_cast<double>(seq_len);
}

void GraniteForCausalLMImpl::init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select) {
  init_like_transformers(*this, seed, o_.initializer_range, select, std::nullopt);  // zeroes the padding_idx row
}

std::shared_ptr<CausalLM> GraniteForCausalLMImpl::rebuild(const std::string& device,
                                                          std::optional<uint64_t> seed) const {
  GraniteOptions o = o_;
  o.init_device = device;
  return seed ? build_granite(o, *seed).ptr() : GraniteForCausalLM(o).ptr();
}

std::string GraniteForCausalLMImpl::describe() const {
  return fmt::format(
      "granite: hidden {}, heads {} (kv {}, head_dim {}), layers {}, intermediate {}, vocab {}, "
      "multipliers: embedding {}, attention {}, residual {}, logits / {}",
      o_.hidden_size, o_.num_attention_heads, o_.num_key_value_heads, o_.head_dim(), o_.num_hidden_layers,
      o_.intermediate_size, o_.vocab_size, o_.embedding_multiplier, o_.attention_multiplier, o_.residual_multiplier,
      o_.logits_scaling);
}

std::optional<std::string> GraniteForCausalLMImpl::tied_embedding_name() const {
  if (!o_.tie_word_embeddings) return std::nullopt;
  return "model.embed_tokens.weight";
}

GraniteForCausalLM build_granite(const GraniteOptions& options, uint64_t seed) {
  return build_initialised<GraniteForCausalLM>(options, seed);
}

TensorParallelPlan GraniteForCausalLMImpl::tensor_parallel_plan(int64_t degree) const {
  check_tensor_parallel_split(degree, "Granite", o_.num_attention_heads, o_.num_key_value_heads, o_.intermediate_size);
  TensorParallelPlan plan;
  plan.vocabulary(o_.vocab_size, degree, lm_head ? "lm_head" : "", "model.embed_tokens");
  for (int64_t i = 0; i < o_.num_hidden_layers; ++i) {
    plan.layer(fmt::format("model.layers.{}.", i), {"input_layernorm", "post_attention_layernorm"},
               {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"},
               {"self_attn.o_proj", "mlp.down_proj"});
  }
  return plan;
}

}  // namespace tessera::models
