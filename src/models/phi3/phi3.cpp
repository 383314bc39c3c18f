// The Phi-3 family: options (recipe and config.json), modules with fused q/k/v and gate/up projections, partial
// rotary with longrope scaling, initialisation.
#include "models/phi3/phi3.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

#include "tessera/config/value.h"
#include "tessera/models/family_keys.h"
#include "tessera/models/family_support.h"
#include "tessera/util/error.h"

namespace tessera::models {
namespace {

// transformers' _compute_longrope_parameters: 1 / (factor_i * theta^(2i / dim)), float32.
at::Tensor longrope_inv_freq(const std::vector<double>& factors, int64_t dim, double theta) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor ext = at::tensor(std::vector<float>(factors.begin(), factors.end()), f32);
  return 1.0 / (ext * at::pow(theta, at::arange(0, dim, 2, f32) / static_cast<double>(dim)));
}

}  // namespace

// ---- Options --------------------------------------------------------------------------------------------------------

double Phi3Options::rope_attention_factor() const {
  if (!longrope()) return 1.0;
  const double factor =
      static_cast<double>(max_position_embeddings) / static_cast<double>(original_max_position_embeddings);
  if (factor <= 1.0) return 1.0;
  return std::sqrt(1 + std::log(factor) / std::log(static_cast<double>(original_max_position_embeddings)));
}

// Phi3Config's keys. Published configs also carry attention_bias, which transformers' Phi-3 does not read.
const FamilyKeys<Phi3Options>& phi3_keys() {
  using O = Phi3Options;
  static const FamilyKeys<O> keys =
      FamilyKeys<O>({"phi3"}, [](const std::string&) { return "Phi3ForCausalLM"; })
          .field("vocab_size", &O::vocab_size, positive())
          .field("hidden_size", &O::hidden_size, positive())
          .field("intermediate_size", &O::intermediate_size, positive())
          .field("num_hidden_layers", &O::num_hidden_layers, positive())
          .field("num_attention_heads", &O::num_attention_heads, positive())
          .resolved(
              "num_key_value_heads", &O::num_key_value_heads, [](const O& o) { return o.num_attention_heads; },
              positive())
          .divides("num_key_value_heads", &O::num_key_value_heads, "num_attention_heads", &O::num_attention_heads)
          .divides("num_attention_heads", &O::num_attention_heads, "hidden_size", &O::hidden_size)
          .field("resid_pdrop", &O::resid_pdrop, probability())
          .field("embd_pdrop", &O::embd_pdrop)
          .field("attention_dropout", &O::attention_dropout, probability())
          .field("hidden_act", &O::hidden_act, hf_activation_check())
          .field("max_position_embeddings", &O::max_position_embeddings, positive())
          // Phi3Config's default is 4096 (from_hf() sets it); a recipe's is max_position_embeddings.
          .resolved(
              "original_max_position_embeddings", &O::original_max_position_embeddings,
              [](const O& o) { return o.max_position_embeddings; }, positive())
          .field("initializer_range", &O::initializer_range)
          .field("rms_norm_eps", &O::rms_norm_eps)
          .field("tie_word_embeddings", &O::tie_word_embeddings)
          .field("rope_theta", &O::rope_theta)
          .custom(
              "partial_rotary_factor",
              [](config::Section& s, O& o) {
                o.partial_rotary_factor = s.get_double("partial_rotary_factor", o.partial_rotary_factor);
                s.check(o.partial_rotary_factor > 0 && o.partial_rotary_factor <= 1 && o.rotary_ndims() % 2 == 0 &&
                            o.rotary_ndims() > 0,
                        "partial_rotary_factor",
                        fmt::format("must be in (0, 1] and give an even number of rotary dimensions (int(head_dim {} "
                                    "x {}) = {})",
                                    o.head_dim(), o.partial_rotary_factor, o.rotary_ndims()));
              },
              [](const O& o) { return nlohmann::ordered_json(o.partial_rotary_factor); })
          .custom(
              "rope_scaling",
              [](config::Section& s, O& o) {
                if (!s.has("rope_scaling")) return;
                // Phi3Config's own validation: exactly type (longrope; su and yarn are its older names),
                // short_factor and long_factor, each of rotary_ndims / 2 numbers.
                config::Section r = s.section("rope_scaling");
                const std::string type = r.get_optional_string("type").value_or(r.get_string("rope_type", ""));
                r.check(type == "longrope" || type == "su" || type == "yarn", "type",
                        "expected longrope (or its older names su and yarn), the only scaling Phi-3 defines, got \"" +
                            type + "\"");
                const size_t n = static_cast<size_t>(o.rotary_ndims() / 2);
                o.short_factor = r.get_doubles("short_factor", {}, n);
                o.long_factor = r.get_doubles("long_factor", {}, n);
                r.check(o.short_factor.size() == n, "short_factor", fmt::format("needs {} numbers", n));
                r.check(o.long_factor.size() == n, "long_factor", fmt::format("needs {} numbers", n));
                r.finish();
              },
              [](const O& o) {
                if (!o.longrope()) return nlohmann::ordered_json(nullptr);
                return nlohmann::ordered_json{
                    {"type", "longrope"}, {"short_factor", o.short_factor}, {"long_factor", o.long_factor}};
              })
          .field("sliding_window", &O::sliding_window, positive_or_none<int64_t>())
          .token_ids()
          .pad_token_below_vocab()
          .hf_accepts({"attention_bias"}, [](const nlohmann::json&, nlohmann::json& cfg) {
            // Phi3Config's default, which longrope's attention factor and its choice of factors depend on (a
            // recipe's default is max_position_embeddings).
            if (!cfg.contains("original_max_position_embeddings")) cfg["original_max_position_embeddings"] = 4096;
          });
  return keys;
}

// ---- Modules --------------------------------------------------------------------------------------------------------

Phi3AttentionImpl::Phi3AttentionImpl(const Phi3Options& o, const at::TensorOptions& t) : o_(o) {
  const int64_t d = o.hidden_size, hd = o.head_dim(), h = o.num_attention_heads, kv = o.num_key_value_heads;
  o_proj = register_module("o_proj", Linear(h * hd, d, false, t));
  qkv_proj = register_module("qkv_proj", Linear(d, (h + 2 * kv) * hd, false, t));
}

at::Tensor Phi3AttentionImpl::forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache) {
  const int64_t hd = o_.head_dim(), r = o_.rotary_ndims();
  const at::Tensor qkv = qkv_proj(x);  // [q heads | k heads | v heads]
  // The heads and the sequence length come from the fused projection's output (this rank's heads under tensor
  // parallelism).
  const int64_t b = qkv.size(0), s = qkv.size(1), whole = (o_.num_attention_heads + 2 * o_.num_key_value_heads) * hd;
  const int64_t h = heads_in(o_.num_attention_heads, qkv.size(-1), whole);
  const int64_t kv = heads_in(o_.num_key_value_heads, qkv.size(-1), whole);
  at::Tensor q = qkv.narrow(-1, 0, h * hd).view({b, s, h, hd});
  at::Tensor k = qkv.narrow(-1, h * hd, kv * hd).view({b, s, kv, hd});
  at::Tensor v = qkv.narrow(-1, (h + kv) * hd, kv * hd).view({b, s, kv, hd}).transpose(1, 2);
  auto rotate = [&](const at::Tensor& t) {
    const at::Tensor rotated = apply_rotary(t.narrow(3, 0, r), in.rope_cos, in.rope_sin);
    return r == hd ? rotated : at::cat({rotated, t.narrow(3, r, hd - r)}, 3);
  };
  q = rotate(q).transpose(1, 2);
  k = rotate(k).transpose(1, 2);
  append_to_cache(cache, k, v);
  const double dropout = is_training() ? o_.attention_dropout : 0.0;
  const at::Tensor context = attend(q, k, v, in, 1.0 / std::sqrt(static_cast<double>(hd)), dropout, is_training());
  return o_proj(context.transpose(1, 2).reshape({b, s, h * hd}));
}

Phi3DecoderLayerImpl::Phi3DecoderLayerImpl(const Phi3Options& o, const at::TensorOptions& t)
    : resid_pdrop_(o.resid_pdrop) {
  self_attn = register_module("self_attn", Phi3Attention(o, t));
  mlp = register_module("mlp", GatedMLP(o.hidden_size, o.intermediate_size, o.hidden_act, false, t, true));
  input_layernorm =
      register_module("input_layernorm", Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t));
  post_attention_layernorm =
      register_module("post_attention_layernorm", Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t));
}

at::Tensor Phi3DecoderLayerImpl::forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache) {
  const bool training = is_training();
  const at::Tensor h = x + at::dropout(self_attn(input_layernorm(x), in, cache), resid_pdrop_, training);
  return h + at::dropout(mlp(post_attention_layernorm(h)), resid_pdrop_, training);
}

Phi3ForCausalLMImpl::Phi3ForCausalLMImpl(const Phi3Options& o) : HfDecoderLM(o, phi3_keys()) {
  const at::TensorOptions t = tensor_options();
  build_backbone([&](int64_t) { return Phi3DecoderLayer(o, t); },
                 Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t));
  if (o.longrope()) {
    inv_freq_ = longrope_inv_freq(o.short_factor, o.rotary_ndims(), o.rope_theta);
    inv_freq_long_ = longrope_inv_freq(o.long_factor, o.rotary_ndims(), o.rope_theta);
  } else {
    inv_freq_ = rotary_inv_freq(o.rotary_ndims(), o.rope_theta);
  }
  window_ = o.sliding_window.value_or(0);
  rope_scale_ = o.rope_attention_factor();
}

AttentionInputs Phi3ForCausalLMImpl::attention_inputs(const DecoderCall& call) {
  // longrope: the long factors once this call's positions go past the original context (transformers decides per
  // forward call from max(position_ids) + 1), the short ones otherwise; cos and sin scaled by the attention factor.
  const bool long_context =
      o_.longrope() && call.positions.max().item<int64_t>() + 1 > o_.original_max_position_embeddings;
  return rotary_causal_inputs(call, long_context ? inv_freq_long_ : inv_freq_, window_, rope_scale_);
}

std::string Phi3ForCausalLMImpl::describe_more() const {
  return fmt::format(", rotary {} dims{}{}", o_.rotary_ndims(),
                     o_.longrope() ? fmt::format(", longrope from {}", o_.original_max_position_embeddings) : "",
                     o_.sliding_window ? fmt::format(", sliding window {}", *o_.sliding_window) : "");
}

void Phi3ForCausalLMImpl::plan_layer(TensorParallelPlan& plan, const std::string& p, int64_t) const {
  const int64_t h = o_.num_attention_heads, kv = o_.num_key_value_heads, hd = o_.head_dim(), f = o_.intermediate_size;
  plan.sequence_norm(p + "input_layernorm");
  plan.sequence_norm(p + "post_attention_layernorm");
  plan.column(p + "self_attn.qkv_proj", {h * hd, kv * hd, kv * hd});
  plan.row(p + "self_attn.o_proj");
  plan.column(p + "mlp.gate_up_proj", {f, f});
  plan.row(p + "mlp.down_proj");
}

}  // namespace tessera::models
