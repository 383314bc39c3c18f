// The GPT-BigCode family: options (recipe and config.json), GPT-2 blocks with multi-query or head-major multi-head
// fused attention, learned positions, initialisation, the tensor-parallel plan.
#include "models/gpt_bigcode/gpt_bigcode.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <cmath>

#include "tessera/config/value.h"
#include "tessera/models/family_keys.h"
#include "tessera/models/family_support.h"

namespace tessera::models {

// ---- Options --------------------------------------------------------------------------------------------------------

// GPTBigCodeConfig's keys.
const FamilyKeys<GPTBigCodeOptions>& gpt_bigcode_keys() {
  using O = GPTBigCodeOptions;
  static const FamilyKeys<O> keys =
      FamilyKeys<O>({"gpt_bigcode"}, [](const std::string&) { return "GPTBigCodeForCausalLM"; })
          .field("vocab_size", &O::vocab_size, positive())
          .field("n_positions", &O::max_position_embeddings, positive())
          .field("n_embd", &O::n_embd, positive())
          .field("n_layer", &O::n_layer, positive())
          .field("n_head", &O::n_head, positive())
          .divides("n_head", &O::n_head, "n_embd", &O::n_embd)
          .resolved(
              "n_inner", &O::n_inner, [](const O& o) { return 4 * o.n_embd; }, positive())
          .field("activation_function", &O::activation_function, hf_activation_check())
          .field("resid_pdrop", &O::resid_pdrop, probability())
          .field("embd_pdrop", &O::embd_pdrop, probability())
          .field("attn_pdrop", &O::attn_pdrop, probability())
          .field("layer_norm_epsilon", &O::layer_norm_epsilon, positive_real())
          .field("initializer_range", &O::initializer_range)
          .field("scale_attn_weights", &O::scale_attn_weights)
          .field("attention_softmax_in_fp32", &O::attention_softmax_in_fp32)
          .field("scale_attention_softmax_in_fp32", &O::scale_attention_softmax_in_fp32)
          .field("multi_query", &O::multi_query)
          // GPTBigCodeConfig derives it (1 with multi_query, n_head without) and writes it; a config that says
          // otherwise was not written by it.
          .custom(
              "num_key_value_heads",
              [](config::Section& s, O& o) {
                const int64_t kv = s.get_int("num_key_value_heads", o.kv_heads());
                s.check(kv == o.kv_heads(), "num_key_value_heads",
                        fmt::format("is {} with multi_query {} (transformers derives it)", o.kv_heads(),
                                    o.multi_query ? "true" : "false"));
              },
              [](const O& o) { return nlohmann::ordered_json(o.kv_heads()); })
          .field("tie_word_embeddings", &O::tie_word_embeddings)
          .token_ids()
          .pad_token_below_vocab();
  return keys;
}

GPTBigCodeOptions parse_gpt_bigcode_options(config::Section& s) {
  GPTBigCodeOptions o;
  gpt_bigcode_keys().read(s, o);
  return o;
}

GPTBigCodeOptions gpt_bigcode_options_from_hf_config(const nlohmann::json& raw, const std::string& where) {
  return gpt_bigcode_keys().from_hf(raw, where, &parse_gpt_bigcode_options);
}

nlohmann::ordered_json gpt_bigcode_hf_config(const GPTBigCodeOptions& o, at::ScalarType dtype) {
  return gpt_bigcode_keys().hf_config(o, "gpt_bigcode", dtype);
}

// ---- Modules --------------------------------------------------------------------------------------------------------

GPTBigCodeAttentionImpl::GPTBigCodeAttentionImpl(const GPTBigCodeOptions& o, const at::TensorOptions& t) : o_(o) {
  c_attn = register_module("c_attn", Linear(o.n_embd, o.n_embd + 2 * o.kv_heads() * o.head_dim(), true, t));
  c_proj = register_module("c_proj", Linear(o.n_embd, o.n_embd, true, t));
}

at::Tensor GPTBigCodeAttentionImpl::forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache) {
  // The heads and the sequence length come from c_attn's output (this rank's heads under tensor parallelism).
  const int64_t hd = o_.head_dim();
  const at::Tensor qkv = c_attn(x);
  const int64_t b = qkv.size(0), s = qkv.size(1);
  at::Tensor q, k, v;
  if (o_.multi_query) {  // [queries (n_embd) | key (head_dim) | value (head_dim)]
    const int64_t width = qkv.size(2) - 2 * hd;
    q = qkv.narrow(2, 0, width).view({b, s, -1, hd}).transpose(1, 2);
    k = qkv.narrow(2, width, hd).view({b, s, 1, hd}).transpose(1, 2);
    v = qkv.narrow(2, width + hd, hd).view({b, s, 1, hd}).transpose(1, 2);
  } else {  // head-major: each head's query, key and value together
    const at::Tensor heads = qkv.view({b, s, -1, 3 * hd}).transpose(1, 2);
    q = heads.narrow(3, 0, hd);
    k = heads.narrow(3, hd, hd);
    v = heads.narrow(3, 2 * hd, hd);
  }
  append_to_cache(cache, k, v);
  const double scale = o_.scale_attn_weights ? 1.0 / std::sqrt(static_cast<double>(hd)) : 1.0;
  const at::Tensor context = attend(q, k, v, in, scale, is_training() ? o_.attn_pdrop : 0.0, is_training());
  return at::dropout(c_proj(context.transpose(1, 2).reshape({b, s, -1})), o_.resid_pdrop, is_training());
}

GPTBigCodeMLPImpl::GPTBigCodeMLPImpl(const GPTBigCodeOptions& o, const at::TensorOptions& t)
    : act_(o.activation_function), dropout_(o.resid_pdrop) {
  c_fc = register_module("c_fc", Linear(o.n_embd, o.n_inner, true, t));
  c_proj = register_module("c_proj", Linear(o.n_inner, o.n_embd, true, t));
}

at::Tensor GPTBigCodeMLPImpl::forward(const at::Tensor& x) {
  return at::dropout(c_proj(hf_activation(act_, c_fc(x))), dropout_, is_training());
}

GPTBigCodeBlockImpl::GPTBigCodeBlockImpl(const GPTBigCodeOptions& o, const at::TensorOptions& t) {
  ln_1 = register_module("ln_1", Norm(o.n_embd, NormType::kLayerNorm, o.layer_norm_epsilon, true, t));
  attn = register_module("attn", GPTBigCodeAttention(o, t));
  ln_2 = register_module("ln_2", Norm(o.n_embd, NormType::kLayerNorm, o.layer_norm_epsilon, true, t));
  mlp = register_module("mlp", GPTBigCodeMLP(o, t));
}

at::Tensor GPTBigCodeBlockImpl::forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache) {
  const at::Tensor h = x + attn(ln_1(x), in, cache);
  return h + mlp(ln_2(h));
}

GPTBigCodeModelImpl::GPTBigCodeModelImpl(const GPTBigCodeOptions& o, const at::TensorOptions& t) {
  wte = register_module("wte", Embedding(o.vocab_size, o.n_embd, t));
  wpe = register_module("wpe", Embedding(o.max_position_embeddings, o.n_embd, t));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.n_layer; ++i) h->push_back(GPTBigCodeBlock(o, t));
  ln_f = register_module("ln_f", Norm(o.n_embd, NormType::kLayerNorm, o.layer_norm_epsilon, true, t));
}

GPTBigCodeForCausalLMImpl::GPTBigCodeForCausalLMImpl(const GPTBigCodeOptions& o) : DecoderLM("transformer.h."), o_(o) {
  const at::TensorOptions t = at::TensorOptions().dtype(at::kFloat).device(at::Device(o.init_device));
  transformer = register_module("transformer", GPTBigCodeModel(o, t));
  if (!o.tie_word_embeddings) lm_head = register_module("lm_head", Linear(o.n_embd, o.vocab_size, false, t));
}

at::Tensor GPTBigCodeForCausalLMImpl::embed(const at::Tensor& ids, const DecoderCall& call) {
  const at::Tensor x = transformer->wte(ids) + transformer->wpe(call.positions);
  return at::dropout(x, o_.embd_pdrop, is_training());
}

double GPTBigCodeForCausalLMImpl::flops_per_token(int64_t seq_len) const {
  int64_t n = num_params() - o_.max_position_embeddings * o_.n_embd;
  if (!o_.tie_word_embeddings) n -= o_.vocab_size * o_.n_embd;
  return 6.0 * static_cast<double>(n) +
         12.0 * static_cast<double>(o_.n_layer) * static_cast<double>(o_.n_embd) * static_cast<double>(seq_len);
}

void GPTBigCodeForCausalLMImpl::init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select) {
  init_like_transformers(*this, seed, o_.initializer_range, select, std::nullopt);
  // GPTBigCodePreTrainedModel._init_weights: the attention's and the MLP's c_proj weight at std / sqrt(2 n_layer),
  // each from its module's own generator (its bias stays 0).
  const double std = o_.initializer_range / std::sqrt(2.0 * static_cast<double>(o_.n_layer));
  at::NoGradGuard no_grad;
  for (const auto& item : named_modules()) {
    if (!item.key().ends_with(".c_proj") || (select && !select(item.key()))) continue;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(module_seed(seed, item.key()));
    normal_from(item.value()->as<LinearImpl>()->weight, 0.0, std, gen);
  }
}

std::shared_ptr<CausalLM> GPTBigCodeForCausalLMImpl::rebuild(const std::string& device,
                                                             std::optional<uint64_t> seed) const {
  GPTBigCodeOptions o = o_;
  o.init_device = device;
  return seed ? build_gpt_bigcode(o, *seed).ptr() : GPTBigCodeForCausalLM(o).ptr();
}

std::string GPTBigCodeForCausalLMImpl::describe() const {
  return fmt::format("gpt_bigcode: hidden {}, heads {} ({}), layers {}, inner {}, vocab {}, positions {}", o_.n_embd,
                     o_.n_head, o_.multi_query ? "multi-query" : "multi-head", o_.n_layer, o_.n_inner, o_.vocab_size,
                     o_.max_position_embeddings);
}

std::optional<std::string> GPTBigCodeForCausalLMImpl::tied_embedding_name() const {
  if (!o_.tie_word_embeddings) return std::nullopt;
  return "transformer.wte.weight";
}

GPTBigCodeForCausalLM build_gpt_bigcode(const GPTBigCodeOptions& options, uint64_t seed) {
  return build_initialised<GPTBigCodeForCausalLM>(options, seed);
}

TensorParallelPlan GPTBigCodeForCausalLMImpl::tensor_parallel_plan(int64_t degree) const {
  if (o_.multi_query) {
    refuse_tensor_parallel(degree, "GPT-BigCode's multi-query attention has one key/value head, which does not split");
  }
  check_tensor_parallel_split(degree, "GPT-BigCode", o_.n_head, o_.n_head, o_.n_inner);
  TensorParallelPlan plan;
  plan.vocabulary(o_.vocab_size, degree, lm_head ? "lm_head" : "", "transformer.wte");
  for (int64_t i = 0; i < o_.n_layer; ++i) {
    plan.layer(fmt::format("transformer.h.{}.", i), {"ln_1", "ln_2"}, {"attn.c_attn", "mlp.c_fc"},
               {"attn.c_proj", "mlp.c_proj"});
  }
  return plan;
}

}  // namespace tessera::models
