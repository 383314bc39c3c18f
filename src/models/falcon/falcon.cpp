// The Falcon family: options (recipe and config.json), modules, masks, rotary tables and ALiBi biases,
// initialisation.
#include "models/falcon/falcon.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "tessera/config/value.h"
#include "tessera/models/family_keys.h"
#include "tessera/models/family_support.h"
#include "tessera/util/error.h"

namespace tessera::models {
namespace {

constexpr float kFalconMasked = std::numeric_limits<float>::lowest();  // transformers' finfo(dtype).min

}  // namespace

// ---- Options --------------------------------------------------------------------------------------------------------

int64_t FalconOptions::kv_heads() const {
  if (new_decoder_architecture) return num_kv_heads;
  return multi_query ? 1 : num_attention_heads;
}

int64_t FalconOptions::ln_count() const {
  if (!parallel_attn) return 2;
  return num_ln_in_parallel_attn.value_or(new_decoder_architecture ? 2 : 1);
}

// FalconConfig's keys (n_embed, its alias of hidden_size, is read by from_hf()). The RW models' configs also carry
// apply_residual_connection_post_layernorm, which transformers does not read, and transformers 5 writes
// num_key_value_heads, which it derives from num_kv_heads and multi_query.
const FamilyKeys<FalconOptions>& falcon_keys() {
  using O = FalconOptions;
  static const FamilyKeys<O> keys =
      FamilyKeys<O>({"falcon"}, [](const std::string&) { return "FalconForCausalLM"; })
          .field("vocab_size", &O::vocab_size, positive())
          .field("hidden_size", &O::hidden_size, positive())
          .field("num_hidden_layers", &O::num_hidden_layers, positive())
          .field("num_attention_heads", &O::num_attention_heads, positive())
          .divides("num_attention_heads", &O::num_attention_heads, "hidden_size", &O::hidden_size)
          .resolved("num_kv_heads", &O::num_kv_heads, [](const O& o) { return o.num_attention_heads; })
          .field("new_decoder_architecture", &O::new_decoder_architecture)
          .field("multi_query", &O::multi_query)
          .field("parallel_attn", &O::parallel_attn)
          .field("num_ln_in_parallel_attn", &O::num_ln_in_parallel_attn,
                 KeyCheck<std::optional<int64_t>>([](const std::optional<int64_t>& n) {
                   return !n || *n == 1 || *n == 2 ? "" : std::string("must be 1 or 2");
                 }))
          .field("bias", &O::bias)
          .field("alibi", &O::alibi)
          .field("layer_norm_epsilon", &O::layer_norm_epsilon)
          .field("rope_theta", &O::rope_theta)
          .linear_rope_scaling(&O::rope_linear_factor, "Falcon")
          .field("max_position_embeddings", &O::max_position_embeddings, positive())
          .resolved(
              "ffn_hidden_size", &O::intermediate_size, [](const O& o) { return 4 * o.hidden_size; }, positive())
          .field("activation", &O::activation, KeyCheck<std::string>([](const std::string& a) {
                   return a == "gelu" || a == "gelu_new" || a == "gelu_pytorch_tanh" || a == "relu" || a == "silu"
                              ? ""
                              : fmt::format("expected gelu, gelu_new, gelu_pytorch_tanh, relu or silu, got \"{}\"", a);
                 }))
          .field("hidden_dropout", &O::hidden_dropout, probability())
          .field("attention_dropout", &O::attention_dropout, probability())
          .field("initializer_range", &O::initializer_range)
          .field("tie_word_embeddings", &O::tie_word_embeddings)
          .token_ids()
          .finally([](config::Section& s, O& o) {
            s.check(o.alibi || o.head_dim() % 2 == 0, "num_attention_heads",
                    fmt::format("gives an odd head_dim ({}), which rotary embeddings cannot rotate", o.head_dim()));
            if (o.new_decoder_architecture) {
              s.check(o.num_kv_heads > 0 && o.num_attention_heads % o.num_kv_heads == 0, "num_kv_heads",
                      fmt::format("must divide num_attention_heads ({})", o.num_attention_heads));
              s.check(o.parallel_attn, "parallel_attn",
                      "the new decoder architecture runs attention and MLP in parallel: transformers' "
                      "FalconDecoderLayer has no "
                      "sequential form of it");
            } else {
              s.check(!(o.parallel_attn && o.num_ln_in_parallel_attn == 2), "num_ln_in_parallel_attn",
                      "2 needs new_decoder_architecture: true (transformers' other parallel block has one "
                      "input_layernorm)");
              s.check(o.multi_query || o.num_kv_heads == o.num_attention_heads, "num_kv_heads",
                      fmt::format(
                          "without multi_query or the new decoder architecture every query head has its own K/V head: "
                          "num_kv_heads must be num_attention_heads ({}), got {}",
                          o.num_attention_heads, o.num_kv_heads));
            }
          })
          .hf_accepts({"n_embed", "apply_residual_connection_post_layernorm", "num_key_value_heads"},
                      [](const nlohmann::json& config, nlohmann::json& cfg) {
                        if (config.contains("n_embed") && !config["n_embed"].is_null())
                          cfg["hidden_size"] = config["n_embed"];
                      });
  return keys;
}

std::optional<double> FalconForCausalLMImpl::activation_bytes(int64_t batch, int64_t seq_len, int bytes_per_value,
                                                              bool activation_checkpointing) const {
  const FalconOptions& o = o_;
  const double tokens = static_cast<double>(batch) * static_cast<double>(seq_len);
  const double d = static_cast<double>(o.hidden_size), f = static_cast<double>(o.intermediate_size);
  const double qkv = static_cast<double>((o.num_attention_heads + 2 * o.kv_heads()) * o.head_dim());
  const double p = bytes_per_value;
  const double norms = static_cast<double>(o.ln_count()) * d;
  const double block = tokens * (d + norms + qkv + d + (o.parallel_attn ? 0 : d) + 2 * f) * p;
  const double layers = static_cast<double>(o.num_hidden_layers);
  const double stored = activation_checkpointing ? layers * tokens * d * p + block : layers * block;
  return stored + tokens * static_cast<double>(o.vocab_size) * (p + 4);
}

at::Tensor falcon_alibi_slopes(int64_t n_heads) {
  // As transformers' build_alibi_tensor computes them: a float32 base raised to int32 powers.
  const int64_t closest = int64_t{1} << static_cast<int64_t>(std::floor(std::log2(static_cast<double>(n_heads))));
  const double log_closest = std::log2(static_cast<double>(closest));
  const at::Tensor base = at::scalar_tensor(std::pow(2.0, -std::pow(2.0, -(log_closest - 3))), at::kFloat);
  at::Tensor slopes = at::pow(base, at::arange(1, 1 + closest, at::TensorOptions().dtype(at::kInt)));
  if (closest != n_heads) {
    const at::Tensor extra_base = at::scalar_tensor(std::pow(2.0, -std::pow(2.0, -(log_closest + 1 - 3))), at::kFloat);
    const int64_t remaining = std::min(closest, n_heads - closest);
    const at::Tensor powers = at::arange(1, 1 + 2 * remaining, 2, at::TensorOptions().dtype(at::kInt));
    slopes = at::cat({slopes, at::pow(extra_base, powers)});
  }
  return slopes;
}

// ---- Modules --------------------------------------------------------------------------------------------------------

FalconAttentionImpl::FalconAttentionImpl(const FalconOptions& o, const at::TensorOptions& t) : o_(o) {
  const int64_t d = o.hidden_size, hd = o.head_dim();
  const int64_t out = (o.num_attention_heads + 2 * o.kv_heads()) * hd;
  query_key_value = register_module("query_key_value", Linear(d, out, o.bias, t));
  dense = register_module("dense", Linear(d, d, o.bias, t));
}

at::Tensor FalconAttentionImpl::forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache) {
  // Head counts and the sequence length come from the fused projection's output (under tensor parallelism this
  // rank's whole K/V groups or heads).
  const int64_t hd = o_.head_dim(), h = o_.num_attention_heads, kv = o_.kv_heads();
  const at::Tensor qkv = query_key_value(x);
  const int64_t b = qkv.size(0), s = qkv.size(1);
  at::Tensor q, k, v;  // (B, S, heads, hd)
  if (o_.new_decoder_architecture) {
    // Per K/V group: its h / kv query heads, then its key, then its value.
    const int64_t rep = h / kv;
    const at::Tensor g = qkv.view({b, s, -1, rep + 2, hd});
    q = g.narrow(3, 0, rep).reshape({b, s, -1, hd});
    k = g.select(3, rep);
    v = g.select(3, rep + 1);
  } else if (o_.multi_query) {
    const at::Tensor g = qkv.view({b, s, h + 2, hd});  // [Q heads | K | V]
    q = g.narrow(2, 0, h);
    k = g.narrow(2, h, 1);
    v = g.narrow(2, h + 1, 1);
  } else {
    const at::Tensor g = qkv.view({b, s, -1, 3, hd});  // per head: q, k, v
    q = g.select(3, 0);
    k = g.select(3, 1);
    v = g.select(3, 2);
  }
  if (in.rope_cos.defined()) {
    q = apply_rotary(q, in.rope_cos, in.rope_sin);
    k = apply_rotary(k, in.rope_cos, in.rope_sin);
  }
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  v = v.transpose(1, 2);
  append_to_cache(cache, k, v);
  // transformers drops attention probabilities only on the ALiBi path.
  const double dropout = is_training() && o_.alibi ? o_.attention_dropout : 0.0;
  const at::Tensor context = attend(q, k, v, in, 1.0 / std::sqrt(static_cast<double>(hd)), dropout, is_training());
  return dense(context.transpose(1, 2).reshape({b, s, -1}));
}

FalconMLPImpl::FalconMLPImpl(const FalconOptions& o, const at::TensorOptions& t) : activation_(o.activation) {
  dense_h_to_4h = register_module("dense_h_to_4h", Linear(o.hidden_size, o.intermediate_size, o.bias, t));
  dense_4h_to_h = register_module("dense_4h_to_h", Linear(o.intermediate_size, o.hidden_size, o.bias, t));
}

at::Tensor FalconMLPImpl::forward(const at::Tensor& x) {
  return dense_4h_to_h(hf_activation(activation_, dense_h_to_4h(x)));
}

FalconDecoderLayerImpl::FalconDecoderLayerImpl(const FalconOptions& o, const at::TensorOptions& t) : o_(o) {
  self_attention = register_module("self_attention", FalconAttention(o, t));
  mlp = register_module("mlp", FalconMLP(o, t));
  auto norm = [&](const char* name) {
    return register_module(name, Norm(o.hidden_size, NormType::kLayerNorm, o.layer_norm_epsilon, true, t));
  };
  if (!o.parallel_attn) {
    post_attention_layernorm = norm("post_attention_layernorm");
    input_layernorm = norm("input_layernorm");
  } else if (o.two_parallel_norms()) {
    ln_attn = norm("ln_attn");
    ln_mlp = norm("ln_mlp");
  } else {
    input_layernorm = norm("input_layernorm");
  }
}

at::Tensor FalconDecoderLayerImpl::forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache) {
  const bool training = is_training();
  if (!o_.parallel_attn) {
    const at::Tensor attn = self_attention(input_layernorm(x), in, cache);
    // transformers' dropout_add(attention_output, residual, config.attention_dropout).
    const at::Tensor residual = at::dropout(attn, o_.attention_dropout, training) + x;
    return at::dropout(mlp(post_attention_layernorm(residual)), o_.hidden_dropout, training) + residual;
  }
  at::Tensor attn, mlp_out;
  if (ln_attn) {
    attn = self_attention(ln_attn(x), in, cache);
    mlp_out = mlp(ln_mlp(x));
  } else {
    const at::Tensor normed = input_layernorm(x);
    attn = self_attention(normed, in, cache);
    mlp_out = mlp(normed);
  }
  return at::dropout(mlp_out + attn, o_.hidden_dropout, training) + x;
}

FalconForCausalLMImpl::FalconForCausalLMImpl(const FalconOptions& o)
    : HfDecoderLM(
          o, falcon_keys(),
          {.root = "transformer", .embed = "word_embeddings", .layers = "h", .norm = "ln_f", .padding_idx = false}) {
  const at::TensorOptions t = tensor_options();
  build_backbone([&](int64_t) { return FalconDecoderLayer(o, t); },
                 Norm(o.hidden_size, NormType::kLayerNorm, o.layer_norm_epsilon, true, t));
  if (o.alibi) {
    slopes_ = falcon_alibi_slopes(o.num_attention_heads);
  } else {
    inv_freq_ = rotary_inv_freq(head_dim(), o.rope_theta) / o.rope_linear_factor;
  }
}

AttentionInputs FalconForCausalLMImpl::attention_inputs(const DecoderCall& call) {
  if (!o_.alibi) return HfDecoderLM::attention_inputs(call);
  const at::Tensor& ids = call.ids;
  const ForwardOptions& fo = call.fo;
  AttentionInputs in;
  in.past = call.past;
  in.reference = fo.reference_attention;
  const int64_t b = ids.size(0), s_q = ids.size(1), s_k = call.past + s_q;
  const bool seq_ids = fo.sequence_id.has_value();
  const auto lopts = ids.options().dtype(at::kLong);
  const at::Tensor qpos = at::arange(call.past, s_k, lopts).unsqueeze(1), kpos = at::arange(0, s_k, lopts).unsqueeze(0);
  at::Tensor blocked = (kpos > qpos).view({1, 1, s_q, s_k});
  if (call.key_mask.defined()) blocked = blocked | call.key_mask.logical_not().view({b, 1, 1, s_k});
  if (seq_ids) {
    TORCH_CHECK(call.past == 0, "sequence_id cannot be combined with a KV cache");
    const at::Tensor& sid = *fo.sequence_id;
    blocked = blocked | (sid.unsqueeze(2) != sid.unsqueeze(1)).unsqueeze(1);
  }
  // ALiBi, as transformers: slope (in bf16) x the key's position among the row's real tokens, in bf16, then in the
  // model's dtype divided by sqrt(head_dim). Packed documents count positions from their own start.
  at::Tensor key_positions;
  if (seq_ids) {
    key_positions = document_positions(*fo.sequence_id);
  } else if (call.key_mask.defined()) {
    const at::Tensor real = call.key_mask.to(at::kLong);
    key_positions = (at::cumsum(real, 1) - 1) * real;
  } else {
    key_positions = at::arange(0, s_k, lopts).unsqueeze(0);
  }
  const at::Tensor slopes = slopes_.to(ids.device()).to(at::kBFloat16).unsqueeze(-1);  // (H, 1)
  const at::Tensor alibi = (slopes * key_positions.unsqueeze(1)).to(at::kFloat);       // (B or 1, H, s_k)
  in.mask = (alibi / std::sqrt(static_cast<double>(o_.head_dim())))
                .unsqueeze(2)
                .masked_fill(blocked, kFalconMasked)
                .to(call.dtype);
  return in;
}

std::string FalconForCausalLMImpl::describe_more() const {
  const std::string arch = o_.new_decoder_architecture ? "new decoder architecture"
                           : o_.parallel_attn          ? "parallel attention/MLP"
                                                       : "sequential attention/MLP";
  return fmt::format(", {}, {}{}", arch, o_.alibi ? "ALiBi" : fmt::format("rope theta {}", o_.rope_theta),
                     o_.bias ? ", biases" : "");
}

void FalconForCausalLMImpl::check_tensor_parallel(int64_t degree) const {
  if (o_.alibi) refuse_tensor_parallel(degree, "Falcon's ALiBi slopes are per head and are not split yet");
  if (o_.multi_query && !o_.new_decoder_architecture) {
    refuse_tensor_parallel(degree, "multi-query attention's one key/value head does not split");
  }
  // The fused query_key_value splits whole K/V groups (new_decoder_architecture) or whole heads.
  check_tensor_parallel_split(degree, "Falcon", o_.num_attention_heads,
                              o_.new_decoder_architecture ? o_.kv_heads() : o_.num_attention_heads,
                              o_.intermediate_size);
}

void FalconForCausalLMImpl::plan_layer(TensorParallelPlan& plan, const std::string& p, int64_t /*i*/) const {
  if (!o_.parallel_attn || !o_.two_parallel_norms()) plan.sequence_norm(p + "input_layernorm");
  if (!o_.parallel_attn) plan.sequence_norm(p + "post_attention_layernorm");
  if (o_.two_parallel_norms()) {
    plan.sequence_norm(p + "ln_attn");
    plan.sequence_norm(p + "ln_mlp");
  }
  plan.layer(p, {}, {"self_attention.query_key_value", "mlp.dense_h_to_4h"},
             {"self_attention.dense", "mlp.dense_4h_to_h"});
}

}  // namespace tessera::models
