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
          .field("n_embd", &O::hidden_size, positive())
          .field("n_layer", &O::num_hidden_layers, positive())
          .field("n_head", &O::num_attention_heads, positive())
          .divides("n_head", &O::num_attention_heads, "n_embd", &O::hidden_size)
          .resolved(
              "n_inner", &O::intermediate_size, [](const O& o) { return 4 * o.hidden_size; }, positive())
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

// ---- Modules --------------------------------------------------------------------------------------------------------

GPTBigCodeAttentionImpl::GPTBigCodeAttentionImpl(const GPTBigCodeOptions& o, const at::TensorOptions& t) : o_(o) {
  c_attn = register_module("c_attn", Linear(o.hidden_size, o.hidden_size + 2 * o.kv_heads() * o.head_dim(), true, t));
  c_proj = register_module("c_proj", Linear(o.hidden_size, o.hidden_size, true, t));
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
  c_fc = register_module("c_fc", Linear(o.hidden_size, o.intermediate_size, true, t));
  c_proj = register_module("c_proj", Linear(o.intermediate_size, o.hidden_size, true, t));
}

at::Tensor GPTBigCodeMLPImpl::forward(const at::Tensor& x) {
  return at::dropout(c_proj(hf_activation(act_, c_fc(x))), dropout_, is_training());
}

GPTBigCodeBlockImpl::GPTBigCodeBlockImpl(const GPTBigCodeOptions& o, const at::TensorOptions& t) {
  ln_1 = register_module("ln_1", Norm(o.hidden_size, NormType::kLayerNorm, o.layer_norm_epsilon, true, t));
  attn = register_module("attn", GPTBigCodeAttention(o, t));
  ln_2 = register_module("ln_2", Norm(o.hidden_size, NormType::kLayerNorm, o.layer_norm_epsilon, true, t));
  mlp = register_module("mlp", GPTBigCodeMLP(o, t));
}

at::Tensor GPTBigCodeBlockImpl::forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache) {
  const at::Tensor h = x + attn(ln_1(x), in, cache);
  return h + mlp(ln_2(h));
}

GPTBigCodeForCausalLMImpl::GPTBigCodeForCausalLMImpl(const GPTBigCodeOptions& o)
    : HfDecoderLM(o, gpt_bigcode_keys(), HfDecoderLayout::gpt2()) {
  const at::TensorOptions t = tensor_options();
  build_backbone([&](int64_t) { return GPTBigCodeBlock(o, t); },
                 Norm(o.hidden_size, NormType::kLayerNorm, o.layer_norm_epsilon, true, t));
}

at::Tensor GPTBigCodeForCausalLMImpl::embed(const at::Tensor& ids, const DecoderCall& call) {
  return at::dropout(HfDecoderLM::embed(ids, call), o_.embd_pdrop, is_training());
}

void GPTBigCodeForCausalLMImpl::init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select) {
  HfDecoderLM::init_weights(seed, select);
  // GPTBigCodePreTrainedModel._init_weights: the attention's and the MLP's c_proj weight at std / sqrt(2 n_layer),
  // each from its module's own generator (its bias stays 0).
  const double std = o_.initializer_range / std::sqrt(2.0 * static_cast<double>(o_.num_hidden_layers));
  at::NoGradGuard no_grad;
  for (const auto& item : named_modules()) {
    if (!item.key().ends_with(".c_proj") || (select && !select(item.key()))) continue;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(module_seed(seed, item.key()));
    normal_from(item.value()->as<LinearImpl>()->weight, 0.0, std, gen);
  }
}

void GPTBigCodeForCausalLMImpl::check_tensor_parallel(int64_t degree) const {
  if (o_.multi_query) {
    refuse_tensor_parallel(degree, "GPT-BigCode's multi-query attention has one key/value head, which does not split");
  }
  HfDecoderLM::check_tensor_parallel(degree);
}

void GPTBigCodeForCausalLMImpl::plan_layer(TensorParallelPlan& plan, const std::string& p, int64_t /*i*/) const {
  plan.layer(p, {"ln_1", "ln_2"}, {"attn.c_attn", "mlp.c_fc"}, {"attn.c_proj", "mlp.c_proj"});
}

std::string GPTBigCodeForCausalLMImpl::describe_more() const {
  return fmt::format(", {}, positions {}", o_.multi_query ? "multi-query" : "multi-head", o_.max_position_embeddings);
}

}  // namespace tessera::models
