// The GLM-4 family: options (recipe and config.json), sandwich-norm layers over the shared attention with interleaved
// partial rotary and a fused SwiGLU MLP, initialisation, the tensor-parallel plan.
#include "models/glm4/glm4.h"

#include <fmt/format.h>

#include "tessera/config/value.h"
#include "tessera/models/family_keys.h"
#include "tessera/models/family_support.h"

namespace tessera::models {

// ---- Options --------------------------------------------------------------------------------------------------------

int64_t Glm4Options::rotary_dims() const {
  return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
}

// Glm4Config's keys.
const FamilyKeys<Glm4Options>& glm4_keys() {
  using O = Glm4Options;
  static const FamilyKeys<O> keys =
      FamilyKeys<O>({"glm4"}, [](const std::string&) { return "Glm4ForCausalLM"; })
          .field("vocab_size", &O::vocab_size, positive())
          .field("hidden_size", &O::hidden_size, positive())
          .field("intermediate_size", &O::intermediate_size, positive())
          .field("num_hidden_layers", &O::num_hidden_layers, positive())
          .field("num_attention_heads", &O::num_attention_heads, positive())
          .field("num_key_value_heads", &O::num_key_value_heads, positive())
          .divides("num_key_value_heads", &O::num_key_value_heads, "num_attention_heads", &O::num_attention_heads)
          .field("head_dim", &O::head_dim, positive())
          .partial_rotary_factor(&O::partial_rotary_factor, [](const O& o) { return o.head_dim; })
          .field("hidden_act", &O::hidden_act, hf_activation_check())
          .field("attention_dropout", &O::attention_dropout, probability())
          .field("max_position_embeddings", &O::max_position_embeddings, positive())
          .field("initializer_range", &O::initializer_range)
          .field("rms_norm_eps", &O::rms_norm_eps, positive_real())
          .field("tie_word_embeddings", &O::tie_word_embeddings)
          .field("rope_theta", &O::rope_theta, positive_real())
          .token_ids()
          .pad_token_below_vocab()
          .field("attention_bias", &O::attention_bias);
  return keys;
}

Glm4Options parse_glm4_options(config::Section& s) {
  Glm4Options o;
  glm4_keys().read(s, o);
  return o;
}

Glm4Options glm4_options_from_hf_config(const nlohmann::json& raw, const std::string& where) {
  return glm4_keys().from_hf(raw, where, &parse_glm4_options);
}

nlohmann::ordered_json glm4_hf_config(const Glm4Options& o, at::ScalarType dtype) {
  return glm4_keys().hf_config(o, "glm4", dtype);
}

// ---- Modules --------------------------------------------------------------------------------------------------------

Glm4MLPImpl::Glm4MLPImpl(const Glm4Options& o, const at::TensorOptions& t) : act_(o.hidden_act) {
  gate_up_proj = register_module("gate_up_proj", Linear(o.hidden_size, 2 * o.intermediate_size, false, t));
  down_proj = register_module("down_proj", Linear(o.intermediate_size, o.hidden_size, false, t));
}

at::Tensor Glm4MLPImpl::forward(const at::Tensor& x) {
  // Halves of this rank's share under tensor parallelism (the plan splits each half).
  const auto halves = gate_up_proj(x).chunk(2, -1);
  return down_proj(halves[1] * hf_activation(act_, halves[0]));
}

Glm4DecoderLayerImpl::Glm4DecoderLayerImpl(const Glm4Options& o, const at::TensorOptions& t) {
  self_attn = register_module("self_attn", SelfAttention(SelfAttentionOptions{.hidden_size = o.hidden_size,
                                                                              .heads = o.num_attention_heads,
                                                                              .kv_heads = o.num_key_value_heads,
                                                                              .head_dim = o.head_dim,
                                                                              .qkv_bias = o.attention_bias,
                                                                              .dropout = o.attention_dropout,
                                                                              .interleaved_rotary = true},
                                                         t));
  mlp = register_module("mlp", Glm4MLP(o, t));
  auto norm = [&] { return Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t); };
  input_layernorm = register_module("input_layernorm", norm());
  post_attention_layernorm = register_module("post_attention_layernorm", norm());
  post_self_attn_layernorm = register_module("post_self_attn_layernorm", norm());
  post_mlp_layernorm = register_module("post_mlp_layernorm", norm());
}

at::Tensor Glm4DecoderLayerImpl::forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache) {
  const at::Tensor h = x + post_self_attn_layernorm(self_attn(input_layernorm(x), in, cache));
  return h + post_mlp_layernorm(mlp(post_attention_layernorm(h)));
}

Glm4ModelImpl::Glm4ModelImpl(const Glm4Options& o, const at::TensorOptions& t) {
  embed_tokens = register_module("embed_tokens", Embedding(o.vocab_size, o.hidden_size, t));
  if (o.pad_token_id) embed_tokens->padding_idx = *o.pad_token_id;  // nn.Embedding(..., padding_idx)
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.num_hidden_layers; ++i) layers->push_back(Glm4DecoderLayer(o, t));
  norm = register_module("norm", Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t));
}

Glm4ForCausalLMImpl::Glm4ForCausalLMImpl(const Glm4Options& o)
    : DecoderLM("model.layers."), o_(o), inv_freq_(rotary_inv_freq(o.rotary_dims(), o.rope_theta)) {
  const at::TensorOptions t = at::TensorOptions().dtype(at::kFloat).device(at::Device(o.init_device));
  model = register_module("model", Glm4Model(o, t));
  if (!o.tie_word_embeddings) lm_head = register_module("lm_head", Linear(o.hidden_size, o.vocab_size, false, t));
}

AttentionInputs Glm4ForCausalLMImpl::attention_inputs(const DecoderCall& call) {
  AttentionInputs in = causal_attention_inputs(call.ids, call.fo, call.past, call.key_mask, call.dtype);
  set_rope_tables(in, call.positions, inv_freq_);  // in float32, as transformers computes them
  return in;
}

double Glm4ForCausalLMImpl::flops_per_token(int64_t seq_len) const {
  int64_t n = num_params();
  if (!o_.tie_word_embeddings) n -= o_.vocab_size * o_.hidden_size;
  return 6.0 * static_cast<double>(n) + 12.0 * static_cast<double>(o_.num_hidden_layers) *
                                            static_cast<double>(o_.num_attention_heads * o_.head_dim) *
                                            static_cast<double>(seq_len);
}

void Glm4ForCausalLMImpl::init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select) {
  init_like_transformers(*this, seed, o_.initializer_range, select, std::nullopt);  // zeroes the padding_idx row
}

std::shared_ptr<CausalLM> Glm4ForCausalLMImpl::rebuild(const std::string& device, std::optional<uint64_t> seed) const {
  Glm4Options o = o_;
  o.init_device = device;
  return seed ? build_glm4(o, *seed).ptr() : Glm4ForCausalLM(o).ptr();
}

std::string Glm4ForCausalLMImpl::describe() const {
  return fmt::format(
      "glm4: hidden {}, heads {} (kv {}, head_dim {}, interleaved rotary on {}), layers {}, "
      "intermediate {}, vocab {}",
      o_.hidden_size, o_.num_attention_heads, o_.num_key_value_heads, o_.head_dim, o_.rotary_dims(),
      o_.num_hidden_layers, o_.intermediate_size, o_.vocab_size);
}

std::optional<std::string> Glm4ForCausalLMImpl::tied_embedding_name() const {
  if (!o_.tie_word_embeddings) return std::nullopt;
  return "model.embed_tokens.weight";
}

Glm4ForCausalLM build_glm4(const Glm4Options& options, uint64_t seed) {
  return build_initialised<Glm4ForCausalLM>(options, seed);
}

TensorParallelPlan Glm4ForCausalLMImpl::tensor_parallel_plan(int64_t degree) const {
  check_tensor_parallel_split(degree, "GLM-4", o_.num_attention_heads, o_.num_key_value_heads, o_.intermediate_size);
  TensorParallelPlan plan;
  plan.vocabulary(o_.vocab_size, degree, lm_head ? "lm_head" : "", "model.embed_tokens");
  for (int64_t i = 0; i < o_.num_hidden_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    plan.layer(p, {"input_layernorm", "post_self_attn_layernorm", "post_attention_layernorm", "post_mlp_layernorm"},
               {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}, {"self_attn.o_proj", "mlp.down_proj"});
    plan.column(p + "mlp.gate_up_proj", {o_.intermediate_size, o_.intermediate_size});
  }
  return plan;
}

}  // namespace tessera::models
