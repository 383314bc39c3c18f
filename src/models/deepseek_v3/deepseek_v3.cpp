// The DeepSeek-V3 family: options (recipe and config.json, YaRN rope_scaling), multi-head latent attention, the dense
// and mixture-of-experts layers, initialisation.
#include "models/deepseek_v3/deepseek_v3.h"

#include <fmt/format.h>

#include <cmath>

#include "tessera/config/value.h"
#include "tessera/models/family_keys.h"
#include "tessera/models/family_support.h"

namespace tessera::models {

// ---- Options --------------------------------------------------------------------------------------------------------

int64_t DeepseekV3Options::sparse_layers() const {
  return std::max<int64_t>(0, num_hidden_layers - first_k_dense_replace);
}

SparseMoeOptions DeepseekV3Options::moe() const {
  SparseMoeOptions m;
  m.num_experts = n_routed_experts;
  m.top_k = num_experts_per_tok;
  m.hidden_size = hidden_size;
  m.ffn_hidden = moe_intermediate_size;
  m.shared_ffn_hidden = moe_intermediate_size * n_shared_experts;
  m.qwen_names = true;  // experts.{e}.{gate,up,down}_proj
  m.norm_topk_prob = norm_topk_prob;
  m.deepseek_router = true;
  m.n_group = n_group;
  m.topk_group = topk_group;
  m.routed_scaling_factor = routed_scaling_factor;
  return m;
}

// DeepseekV3Config's keys. The published configs also carry keys of DeepSeek's own code that transformers' class does
// not read (its router is always sigmoid and group-limited; ep_size, aux_loss_alpha and seq_aux tune training there).
const FamilyKeys<DeepseekV3Options>& deepseek_v3_keys() {
  using O = DeepseekV3Options;
  static const FamilyKeys<O> keys =
      FamilyKeys<O>({"deepseek_v3"}, [](const std::string&) { return "DeepseekV3ForCausalLM"; })
          .field("vocab_size", &O::vocab_size, positive())
          .field("hidden_size", &O::hidden_size, positive())
          .field("intermediate_size", &O::intermediate_size, positive())
          .field("moe_intermediate_size", &O::moe_intermediate_size, positive())
          .field("num_hidden_layers", &O::num_hidden_layers, positive())
          .field("num_attention_heads", &O::num_attention_heads, positive())
          .resolved("num_key_value_heads", &O::num_key_value_heads, [](const O& o) { return o.num_attention_heads; })
          .field("n_shared_experts", &O::n_shared_experts, positive())
          .field("n_routed_experts", &O::n_routed_experts, positive())
          .field("routed_scaling_factor", &O::routed_scaling_factor, positive_real())
          .field("kv_lora_rank", &O::kv_lora_rank, positive())
          .field("q_lora_rank", &O::q_lora_rank, positive_or_none<int64_t>())
          .field("qk_rope_head_dim", &O::qk_rope_head_dim, KeyCheck<int64_t>([](const int64_t& v) {
                   return v > 0 && v % 2 == 0 ? "" : std::string("must be even and positive (rotary pairs)");
                 }))
          .field("v_head_dim", &O::v_head_dim, positive())
          .field("qk_nope_head_dim", &O::qk_nope_head_dim, positive())
          .field("n_group", &O::n_group, positive())
          .field("topk_group", &O::topk_group, positive())
          .field("num_experts_per_tok", &O::num_experts_per_tok, positive())
          .field("first_k_dense_replace", &O::first_k_dense_replace)
          .field("norm_topk_prob", &O::norm_topk_prob)
          .field("hidden_act", &O::hidden_act, KeyCheck<std::string>([](const std::string& v) {
                   return v == "silu" ? "" : std::string("the experts compute SwiGLU: only silu, got " + v);
                 }))
          .field("max_position_embeddings", &O::max_position_embeddings, positive())
          .field("initializer_range", &O::initializer_range)
          .field("rms_norm_eps", &O::rms_norm_eps, positive_real())
          .field("tie_word_embeddings", &O::tie_word_embeddings)
          .field("rope_theta", &O::rope_theta, positive_real())
          .yarn_rope_scaling(&O::yarn)
          .field("rope_interleave", &O::rope_interleave)
          .field("attention_bias", &O::attention_bias)
          .field("attention_dropout", &O::attention_dropout, probability())
          .token_ids()
          .pad_token_below_vocab()
          .finally([](config::Section& s, O& o) {
            s.check(o.num_key_value_heads == o.num_attention_heads, "num_key_value_heads",
                    fmt::format("must be num_attention_heads ({}): latent attention gives every head its own keys "
                                "(transformers' grouping of them would not match the queries)",
                                o.num_attention_heads));
            s.check(o.first_k_dense_replace >= 0 && o.first_k_dense_replace <= o.num_hidden_layers,
                    "first_k_dense_replace", fmt::format("must lie in [0, {}]", o.num_hidden_layers));
            s.check(o.n_routed_experts % o.n_group == 0 && o.n_routed_experts / o.n_group >= 2, "n_group",
                    fmt::format("must split the {} routed experts into groups of at least 2 (each group is scored by "
                                "its two best experts)",
                                o.n_routed_experts));
            s.check(o.topk_group <= o.n_group, "topk_group", fmt::format("must be at most n_group ({})", o.n_group));
            s.check(o.num_experts_per_tok <= o.topk_group * (o.n_routed_experts / o.n_group), "num_experts_per_tok",
                    fmt::format("must be at most the experts of topk_group groups ({})",
                                o.topk_group * (o.n_routed_experts / o.n_group)));
          })
          // head_dim and qk_head_dim: DeepseekV3Config derives them (qk_rope_head_dim, qk_nope + qk_rope) and
          // overwrites what config.json says; pretraining_tp is one transformers no longer reads; transformers builds
          // none of the num_nextn_predict_layers multi-token-prediction layers (a folder's weights for them are
          // refused as unexpected tensors); transformers 5's output_router_logits only returns the routers' logits
          // (it adds no loss).
          .hf_accepts({"head_dim", "qk_head_dim", "pretraining_tp", "num_nextn_predict_layers", "output_router_logits",
                       "scoring_func", "topk_method", "moe_layer_freq", "ep_size", "aux_loss_alpha", "seq_aux"});
  return keys;
}

// ---- Modules --------------------------------------------------------------------------------------------------------

DeepseekV3AttentionImpl::DeepseekV3AttentionImpl(const DeepseekV3Options& o, const at::TensorOptions& t)
    : nope_(o.qk_nope_head_dim),
      rope_(o.qk_rope_head_dim),
      v_(o.v_head_dim),
      rank_(o.kv_lora_rank),
      scale_(1.0 / std::sqrt(static_cast<double>(o.qk_head_dim()))),
      dropout_(o.attention_dropout),
      interleave_(o.rope_interleave) {
  const int64_t h = o.num_attention_heads;
  if (o.q_lora_rank) {
    q_a_proj = register_module("q_a_proj", Linear(o.hidden_size, *o.q_lora_rank, o.attention_bias, t));
    // DeepseekV3RMSNorm(q_lora_rank): its own eps, 1e-6, not rms_norm_eps.
    q_a_layernorm = register_module("q_a_layernorm", Norm(*o.q_lora_rank, NormType::kRMSNorm, 1e-6, false, t));
    q_b_proj = register_module("q_b_proj", Linear(*o.q_lora_rank, h * o.qk_head_dim(), false, t));
  } else {
    q_proj = register_module("q_proj", Linear(o.hidden_size, h * o.qk_head_dim(), false, t));
  }
  kv_a_proj_with_mqa = register_module("kv_a_proj_with_mqa", Linear(o.hidden_size, rank_ + rope_, o.attention_bias, t));
  kv_a_layernorm = register_module("kv_a_layernorm", Norm(rank_, NormType::kRMSNorm, 1e-6, false, t));
  kv_b_proj = register_module("kv_b_proj", Linear(rank_, h * (nope_ + v_), false, t));
  o_proj = register_module("o_proj", Linear(h * v_, o.hidden_size, o.attention_bias, t));
  // With YaRN, transformers scales the softmax by mscale(factor, mscale_all_dim)^2 besides the tables' factor.
  if (o.yarn && o.yarn->mscale_all_dim && *o.yarn->mscale_all_dim != 0) {
    const double m = yarn_mscale(o.yarn->factor, *o.yarn->mscale_all_dim);
    scale_ *= m * m;
  }
}

at::Tensor DeepseekV3AttentionImpl::forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache) {
  const int64_t b = x.size(0), s = x.size(1);
  const at::Tensor q_all = q_proj ? q_proj(x) : q_b_proj(q_a_layernorm(q_a_proj(x)));
  const auto q = q_all.view({b, s, -1, nope_ + rope_}).split({nope_, rope_}, -1);  // (B, s, H, ·): heads from the
                                                                                   // projection (this rank's)
  const auto latent = kv_a_proj_with_mqa(x).split({rank_, rope_}, -1);
  const auto kv = kv_b_proj(kv_a_layernorm(latent[0])).view({b, s, -1, nope_ + v_}).split({nope_, v_}, -1);
  // The rotary part: each head's for the queries, one shared by every head for the keys. transformers' interleaved
  // form permutes both to rotate-half order before rotating; rotating the pairs in place gives the same dot products.
  auto rotate = [&](const at::Tensor& t) {
    return interleave_ ? apply_rotary_interleaved(t, in.rope_cos, in.rope_sin)
                       : apply_rotary(t, in.rope_cos, in.rope_sin);
  };
  const at::Tensor q_rot = rotate(q[1]);
  const at::Tensor k_rot = rotate(latent[1].view({b, s, 1, rope_})).expand({b, s, kv[0].size(2), rope_});
  const at::Tensor query = at::cat({q[0], q_rot}, -1).transpose(1, 2);
  at::Tensor key = at::cat({kv[0], k_rot}, -1).transpose(1, 2);
  at::Tensor value = kv[1].transpose(1, 2);
  append_to_cache(cache, key, value);
  const at::Tensor out = attend(query, key, value, in, scale_, dropout_, is_training());  // (B, H, s, v_head_dim)
  return o_proj(out.transpose(1, 2).reshape({b, s, -1}));
}

DeepseekV3DecoderLayerImpl::DeepseekV3DecoderLayerImpl(const DeepseekV3Options& o, const at::TensorOptions& t,
                                                       int64_t index) {
  self_attn = register_module("self_attn", DeepseekV3Attention(o, t));
  if (o.sparse(index)) {
    moe = register_module("mlp", SparseMoeBlock(o.moe(), t, nullptr, std::make_shared<AuxLossScale>()));
  } else {
    mlp = register_module("mlp", GatedMLP(o.hidden_size, o.intermediate_size, o.hidden_act, false, t));
  }
  input_layernorm =
      register_module("input_layernorm", Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t));
  post_attention_layernorm =
      register_module("post_attention_layernorm", Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t));
}

at::Tensor DeepseekV3DecoderLayerImpl::forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache) {
  const at::Tensor h = x + self_attn(input_layernorm(x), in, cache);
  const at::Tensor normed = post_attention_layernorm(h);
  return h + (moe ? moe(normed) : mlp(normed));
}

DeepseekV3ForCausalLMImpl::DeepseekV3ForCausalLMImpl(const DeepseekV3Options& o) : HfDecoderLM(o, deepseek_v3_keys()) {
  const at::TensorOptions t = tensor_options();
  build_backbone([&](int64_t i) { return DeepseekV3DecoderLayer(o, t, i); },
                 Norm(o.hidden_size, NormType::kRMSNorm, o.rms_norm_eps, false, t));
  inv_freq_ = o.yarn ? yarn_inv_freq(o.qk_rope_head_dim, o.rope_theta, *o.yarn)
                     : rotary_inv_freq(o.qk_rope_head_dim, o.rope_theta);
  rope_scale_ = o.yarn ? yarn_attention_factor(*o.yarn) : 1.0;
}

void DeepseekV3ForCausalLMImpl::init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select) {
  HfDecoderLM::init_weights(seed, select);
  at::NoGradGuard no_grad;
  for (const auto& item : named_parameters()) {
    if (!item.key().ends_with(".e_score_correction_bias")) continue;
    const std::string module = item.key().substr(0, item.key().rfind('.'));
    if (!select || select(module)) item.value().zero_();
  }
}

double DeepseekV3ForCausalLMImpl::flops_per_token(int64_t seq_len) const {
  int64_t n = num_active_params();
  if (!o_.tie_word_embeddings) n -= o_.vocab_size * o_.hidden_size;
  return 6.0 * static_cast<double>(n) +
         6.0 * static_cast<double>(o_.num_hidden_layers) * static_cast<double>(o_.num_attention_heads) *
             static_cast<double>(o_.qk_head_dim() + o_.v_head_dim) * static_cast<double>(seq_len);
}

int64_t DeepseekV3ForCausalLMImpl::num_active_params() const {
  const SparseMoeOptions m = o_.moe();
  return num_params() - o_.sparse_layers() * (m.num_experts - m.top_k) * 3 * m.hidden_size * m.ffn_hidden;
}

void DeepseekV3ForCausalLMImpl::begin_forward(const DecoderCall&) {
  for (const auto& layer : *model->layers) {
    if (auto& moe = layer->as<DeepseekV3DecoderLayerImpl>()->moe) moe->records.clear();
  }
}

std::vector<std::pair<std::string, at::Tensor>> DeepseekV3ForCausalLMImpl::expert_token_counts() const {
  return expert_counts_by_layer(o_.num_hidden_layers, [this](int64_t i) -> const std::vector<at::Tensor>* {
    const auto& moe = model->layers->ptr(i)->as<DeepseekV3DecoderLayerImpl>()->moe;
    return moe ? &moe->records : nullptr;
  });
}

void DeepseekV3ForCausalLMImpl::check_tensor_parallel(int64_t degree) const {
  refuse_tensor_parallel(degree,
                         "DeepSeek-V3's latent attention projections (q_a_proj, kv_a_proj_with_mqa) and its experts do "
                         "not split over a tensor-parallel group; use expert and context parallelism");
}

std::string DeepseekV3ForCausalLMImpl::describe_more() const {
  return fmt::format(
      ", latent attention (kv rank {}, q rank {}, head dims {}+{} / v {}), {} of {} experts (+{} shared, "
      "{} groups) in {} layers{}",
      o_.kv_lora_rank, o_.q_lora_rank ? std::to_string(*o_.q_lora_rank) : "none", o_.qk_nope_head_dim,
      o_.qk_rope_head_dim, o_.v_head_dim, o_.num_experts_per_tok, o_.n_routed_experts, o_.n_shared_experts, o_.n_group,
      o_.sparse_layers(), o_.yarn ? fmt::format(", yarn x{}", o_.yarn->factor) : "");
}

}  // namespace tessera::models
