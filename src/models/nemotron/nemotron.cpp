// The Nemotron family: options (recipe and config.json), LayerNorm1P blocks over the shared attention with partial
// rotary and a squared-ReLU MLP, initialisation, the tensor-parallel plan.
#include "models/nemotron/nemotron.h"

#include <fmt/format.h>

#include "tessera/config/value.h"
#include "tessera/models/family_keys.h"
#include "tessera/models/family_support.h"

namespace tessera::models {

// ---- Options --------------------------------------------------------------------------------------------------------

int64_t NemotronOptions::rotary_dims() const {
  return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
}

// NemotronConfig's keys.
const FamilyKeys<NemotronOptions>& nemotron_keys() {
  using O = NemotronOptions;
  static const FamilyKeys<O> keys =
      FamilyKeys<O>({"nemotron"}, [](const std::string&) { return "NemotronForCausalLM"; })
          .field("vocab_size", &O::vocab_size, positive())
          .field("hidden_size", &O::hidden_size, positive())
          .field("intermediate_size", &O::intermediate_size, positive())
          .field("num_hidden_layers", &O::num_hidden_layers, positive())
          .field("num_attention_heads", &O::num_attention_heads, positive())
          .resolved(
              "head_dim", &O::head_dim, [](const O& o) { return o.hidden_size / o.num_attention_heads; }, positive())
          .resolved(
              "num_key_value_heads", &O::num_key_value_heads, [](const O& o) { return o.num_attention_heads; },
              positive())
          .divides("num_key_value_heads", &O::num_key_value_heads, "num_attention_heads", &O::num_attention_heads)
          .field("hidden_act", &O::hidden_act, hf_activation_check())
          .field("max_position_embeddings", &O::max_position_embeddings, positive())
          .field("initializer_range", &O::initializer_range)
          .field("norm_eps", &O::norm_eps, positive_real())
          .token_ids()
          .pad_token_below_vocab()
          .field("tie_word_embeddings", &O::tie_word_embeddings)
          .field("rope_theta", &O::rope_theta, positive_real())
          .partial_rotary_factor(&O::partial_rotary_factor, [](const O& o) { return o.head_dim; })
          .field("attention_bias", &O::attention_bias)
          .field("attention_dropout", &O::attention_dropout, probability())
          .field("mlp_bias", &O::mlp_bias);
  return keys;
}

NemotronOptions parse_nemotron_options(config::Section& s) {
  NemotronOptions o;
  nemotron_keys().read(s, o);
  return o;
}

NemotronOptions nemotron_options_from_hf_config(const nlohmann::json& raw, const std::string& where) {
  return nemotron_keys().from_hf(raw, where, &parse_nemotron_options);
}

nlohmann::ordered_json nemotron_hf_config(const NemotronOptions& o, at::ScalarType dtype) {
  return nemotron_keys().hf_config(o, "nemotron", dtype);
}

// ---- Modules --------------------------------------------------------------------------------------------------------

NemotronMLPImpl::NemotronMLPImpl(const NemotronOptions& o, const at::TensorOptions& t) : act_(o.hidden_act) {
  up_proj = register_module("up_proj", Linear(o.hidden_size, o.intermediate_size, o.mlp_bias, t));
  down_proj = register_module("down_proj", Linear(o.intermediate_size, o.hidden_size, o.mlp_bias, t));
}

at::Tensor NemotronMLPImpl::forward(const at::Tensor& x) {
  return down_proj(hf_activation(act_, up_proj(x)));
}

NemotronDecoderLayerImpl::NemotronDecoderLayerImpl(const NemotronOptions& o, const at::TensorOptions& t) {
  // Rotary on the first rotary_dims() features of each head: the tables are that wide (attention_inputs()).
  self_attn = register_module("self_attn", SelfAttention(SelfAttentionOptions{.hidden_size = o.hidden_size,
                                                                              .heads = o.num_attention_heads,
                                                                              .kv_heads = o.num_key_value_heads,
                                                                              .head_dim = o.head_dim,
                                                                              .qkv_bias = o.attention_bias,
                                                                              .out_bias = o.attention_bias,
                                                                              .dropout = o.attention_dropout},
                                                         t));
  mlp = register_module("mlp", NemotronMLP(o, t));
  auto norm = [&] { return Norm(o.hidden_size, NormType::kLayerNorm1P, o.norm_eps, true, t); };
  input_layernorm = register_module("input_layernorm", norm());
  post_attention_layernorm = register_module("post_attention_layernorm", norm());
}

at::Tensor NemotronDecoderLayerImpl::forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache) {
  const at::Tensor h = x + self_attn(input_layernorm(x), in, cache);
  return h + mlp(post_attention_layernorm(h));
}

NemotronModelImpl::NemotronModelImpl(const NemotronOptions& o, const at::TensorOptions& t) {
  embed_tokens = register_module("embed_tokens", Embedding(o.vocab_size, o.hidden_size, t));
  if (o.pad_token_id) embed_tokens->padding_idx = *o.pad_token_id;  // nn.Embedding(..., padding_idx)
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.num_hidden_layers; ++i) layers->push_back(NemotronDecoderLayer(o, t));
  norm = register_module("norm", Norm(o.hidden_size, NormType::kLayerNorm1P, o.norm_eps, true, t));
}

NemotronForCausalLMImpl::NemotronForCausalLMImpl(const NemotronOptions& o)
    : DecoderLM("model.layers."), o_(o), inv_freq_(rotary_inv_freq(o.rotary_dims(), o.rope_theta)) {
  const at::TensorOptions t = at::TensorOptions().dtype(at::kFloat).device(at::Device(o.init_device));
  model = register_module("model", NemotronModel(o, t));
  if (!o.tie_word_embeddings) lm_head = register_module("lm_head", Linear(o.hidden_size, o.vocab_size, false, t));
}

AttentionInputs NemotronForCausalLMImpl::attention_inputs(const DecoderCall& call) {
  AttentionInputs in = causal_attention_inputs(call.ids, call.fo, call.past, call.key_mask, call.dtype);
  set_rope_tables(in, call.positions, inv_freq_);  // in float32, as transformers computes them
  return in;
}

double NemotronForCausalLMImpl::flops_per_token(int64_t seq_len) const {
  int64_t n = num_params();
  if (!o_.tie_word_embeddings) n -= o_.vocab_size * o_.hidden_size;
  return 6.0 * static_cast<double>(n) + 12.0 * static_cast<double>(o_.num_hidden_layers) *
                                            static_cast<double>(o_.num_attention_heads * o_.head_dim) *
                                            static_cast<double>(seq_len);
}

void NemotronForCausalLMImpl::init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select) {
  init_like_transformers(*this, seed, o_.initializer_range, select, std::nullopt);  // zeroes the padding_idx row
}

std::shared_ptr<CausalLM> NemotronForCausalLMImpl::rebuild(const std::string& device,
                                                           std::optional<uint64_t> seed) const {
  NemotronOptions o = o_;
  o.init_device = device;
  return seed ? build_nemotron(o, *seed).ptr() : NemotronForCausalLM(o).ptr();
}

std::string NemotronForCausalLMImpl::describe() const {
  return fmt::format(
      "nemotron: hidden {}, heads {} (kv {}, head_dim {}, rotary on {}), layers {}, intermediate {} "
      "({}), vocab {}",
      o_.hidden_size, o_.num_attention_heads, o_.num_key_value_heads, o_.head_dim, o_.rotary_dims(),
      o_.num_hidden_layers, o_.intermediate_size, o_.hidden_act, o_.vocab_size);
}

std::optional<std::string> NemotronForCausalLMImpl::tied_embedding_name() const {
  if (!o_.tie_word_embeddings) return std::nullopt;
  return "model.embed_tokens.weight";
}

NemotronForCausalLM build_nemotron(const NemotronOptions& options, uint64_t seed) {
  return build_initialised<NemotronForCausalLM>(options, seed);
}

TensorParallelPlan NemotronForCausalLMImpl::tensor_parallel_plan(int64_t degree) const {
  check_tensor_parallel_split(degree, "Nemotron", o_.num_attention_heads, o_.num_key_value_heads, o_.intermediate_size);
  TensorParallelPlan plan;
  plan.vocabulary(o_.vocab_size, degree, lm_head ? "lm_head" : "", "model.embed_tokens");
  for (int64_t i = 0; i < o_.num_hidden_layers; ++i) {
    plan.layer(fmt::format("model.layers.{}.", i), {"input_layernorm", "post_attention_layernorm"},
               {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.up_proj"},
               {"self_attn.o_proj", "mlp.down_proj"});
  }
  return plan;
}

}  // namespace tessera::models
