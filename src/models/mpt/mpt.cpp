// MPT modules: attention, FFN, block, transformer body and the causal-LM head; mask and rotary tables built per call.
#include "models/mpt/mpt.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "tessera/util/error.h"

namespace tessera::models {
namespace {

constexpr float kMasked = std::numeric_limits<float>::lowest();  // LLM Foundry fills with finfo.min, not -inf

}  // namespace

GroupedQueryAttentionImpl::GroupedQueryAttentionImpl(const MPTOptions& o, const at::TensorOptions& t) : o_(o) {
  const int64_t hd = o.head_dim(), h = o.n_heads, kv = o.attn.kv_n_heads;
  if (o.attn.fused_qkv) {
    Wqkv = register_module("Wqkv", Linear(o.d_model, (h + 2 * kv) * hd, o.wqkv_bias(), t));
  } else {
    Wq = register_module("Wq", Linear(o.d_model, h * hd, o.wqkv_bias(), t));
    Wk = register_module("Wk", Linear(o.d_model, kv * hd, o.wqkv_bias(), t));
    Wv = register_module("Wv", Linear(o.d_model, kv * hd, o.wqkv_bias(), t));
  }
  if (o.attn.qk_ln || o.attn.qk_gn) {
    // As LLM Foundry builds them: its default norm (LPLayerNorm, eps 1e-5, a bias unless no_bias), whatever the
    // model's norm_type and norm_eps (its attention class is not given them).
    constexpr NormType kQk = NormType::kLowPrecisionLayerNorm;
    q_ln = register_module("q_ln", Norm(o.attn.qk_gn ? hd : h * hd, kQk, 1e-5, !o.no_bias, t));
    k_ln = register_module("k_ln", Norm(o.attn.qk_gn ? hd : kv * hd, kQk, 1e-5, !o.no_bias, t));
  }
  out_proj = register_module("out_proj", Linear(h * hd, o.d_model, !o.no_bias, t));
  out_proj->is_residual = true;
  scale_ = o.attn.softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(hd)));
}

at::Tensor GroupedQueryAttentionImpl::forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache) {
  // Head counts and the sequence length are read from the projections' outputs: under tensor parallelism they hold
  // this rank's heads (and, under sequence parallelism, the whole sequence of a sharded x).
  const int64_t hd = o_.head_dim(), whole = (o_.n_heads + 2 * o_.attn.kv_n_heads) * hd;
  at::Tensor q, k, v;
  if (Wqkv) {
    at::Tensor qkv = Wqkv(x);  // (B, S, (H + 2 KV) hd): [Q | K | V], head-major
    if (o_.attn.clip_qkv) qkv = qkv.clamp(-*o_.attn.clip_qkv, *o_.attn.clip_qkv);
    const int64_t h = heads_in(o_.n_heads, qkv.size(2), whole), kv = heads_in(o_.attn.kv_n_heads, qkv.size(2), whole);
    q = qkv.narrow(2, 0, h * hd);
    k = qkv.narrow(2, h * hd, kv * hd);
    v = qkv.narrow(2, (h + kv) * hd, kv * hd);
  } else {
    q = Wq(x);
    k = Wk(x);
    v = Wv(x);
    if (o_.attn.clip_qkv) {
      q = q.clamp(-*o_.attn.clip_qkv, *o_.attn.clip_qkv);
      k = k.clamp(-*o_.attn.clip_qkv, *o_.attn.clip_qkv);
      v = v.clamp(-*o_.attn.clip_qkv, *o_.attn.clip_qkv);
    }
  }
  const int64_t b = q.size(0), s = q.size(1);
  if (q_ln) {
    const auto dtype = q.scalar_type();
    if (o_.attn.qk_gn) {
      q = q_ln(q.reshape({b, s, -1, hd})).to(dtype).reshape({b, s, -1});
      k = k_ln(k.reshape({b, s, -1, hd})).to(dtype).reshape({b, s, -1});
    } else {
      q = q_ln(q).to(dtype);
      k = k_ln(k).to(dtype);
    }
  }
  q = q.reshape({b, s, -1, hd});
  k = k.reshape({b, s, -1, hd});
  v = v.reshape({b, s, -1, hd});
  if (in.rope_cos.defined()) {
    q = apply_rotary(q, in.rope_cos, in.rope_sin);
    k = apply_rotary(k, in.rope_cos, in.rope_sin);
  }
  q = q.transpose(1, 2);  // (B, H, S, hd)
  k = k.transpose(1, 2);  // (B, KV, S, hd)
  v = v.transpose(1, 2);
  append_to_cache(cache, k, v);
  const at::Tensor context = attend(q, k, v, in, scale_, is_training() ? o_.attn.attn_pdrop : 0.0, is_training())
                                 .transpose(1, 2)
                                 .reshape({b, s, -1});  // (B, S, H hd)
  return out_proj(context);
}

FFNImpl::FFNImpl(const MPTOptions& o, const at::TensorOptions& t) : act_(o.ffn.ffn_act_fn) {
  const int64_t f = o.ffn_hidden();
  up_proj = register_module("up_proj", Linear(o.d_model, f, !o.no_bias, t));
  if (o.ffn.type == FfnType::kGLU) gate_proj = register_module("gate_proj", Linear(o.d_model, f, !o.no_bias, t));
  down_proj = register_module("down_proj", Linear(f, o.d_model, !o.no_bias, t));
  down_proj->is_residual = true;
}

at::Tensor FFNImpl::forward(const at::Tensor& x) {
  const at::Tensor up = up_proj(x);
  const at::Tensor hidden = gate_proj ? hf_activation(act_, gate_proj(x)) * up : hf_activation(act_, up);
  return down_proj(hidden);
}

MPTBlockImpl::MPTBlockImpl(const MPTOptions& o, const at::TensorOptions& t, std::shared_ptr<AuxLossScale> aux_scale,
                           std::shared_ptr<HfRouterLoss> hf_loss)
    : resid_pdrop_(o.resid_pdrop) {
  norm_1 = register_module("norm_1", Norm(o.d_model, o.norm_type, o.norm_eps, !o.no_bias, t));
  attn = register_module("attn", GroupedQueryAttention(o, t));
  norm_2 = register_module("norm_2", Norm(o.d_model, o.norm_type, o.norm_eps, !o.no_bias, t));
  if (o.ffn.moe) {
    moe = register_module(
        "ffn", MoE(o.moe_layer(), t, aux_scale ? aux_scale : std::make_shared<AuxLossScale>(), std::move(hf_loss)));
  } else {
    ffn = register_module("ffn", FFN(o, t));
  }
}

at::Tensor MPTBlockImpl::forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache) {
  at::Tensor h = x + at::dropout(attn(norm_1(x), in, cache), resid_pdrop_, is_training());
  const at::Tensor normed = norm_2(h);
  return h + at::dropout(moe ? moe(normed) : ffn(normed), resid_pdrop_, is_training());
}

MPTModelImpl::MPTModelImpl(const MPTOptions& o, const at::TensorOptions& t, std::shared_ptr<AuxLossScale> aux_scale,
                           std::shared_ptr<HfRouterLoss> hf_loss)
    : o_(o) {
  wte = register_module("wte", Embedding(o.vocab_size, o.d_model, t));
  if (o.learned_pos_emb) wpe = register_module("wpe", Embedding(o.max_seq_len, o.d_model, t));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.n_layers; ++i) blocks->push_back(MPTBlock(o, t, aux_scale, hf_loss));
  norm_f = register_module("norm_f", Norm(o.d_model, o.norm_type, o.norm_eps, !o.no_bias, t));
  if (o.attn.alibi) slopes_ = alibi_slopes(o.n_heads, o.attn.alibi_bias_max);
}

const at::Tensor& MPTModelImpl::structural_mask(int64_t past, int64_t s_q, const at::Device& device) {
  if (mask_cache_.defined() && mask_key_.past == past && mask_key_.s_q == s_q && mask_key_.device == device) {
    return mask_cache_;
  }
  const int64_t s_k = past + s_q;
  const auto opts = at::TensorOptions().device(device);
  const at::Tensor qpos = at::arange(past, s_k, opts.dtype(at::kLong)).unsqueeze(1);  // (s_q, 1)
  const at::Tensor kpos = at::arange(0, s_k, opts.dtype(at::kLong)).unsqueeze(0);     // (1, s_k)
  at::Tensor blocked = kpos > qpos;                                                   // causal
  if (o_.attn.sliding_window_size > 0) blocked = blocked | (kpos < qpos - o_.attn.sliding_window_size);
  at::Tensor mask = at::zeros({1, 1, s_q, s_k}, opts.dtype(at::kFloat));
  if (o_.attn.alibi) {
    // LLM Foundry's causal form: slope_h * (j - (s_k - 1)), the same for every query row.
    const at::Tensor rel = (at::arange(0, s_k, opts.dtype(at::kFloat)) - static_cast<double>(s_k - 1));
    mask = mask + slopes_.to(device).view({1, -1, 1, 1}) * rel.view({1, 1, 1, s_k});
  }
  mask = mask.masked_fill(blocked.view({1, 1, s_q, s_k}), kMasked);
  mask_key_ = {past, s_q, device};
  mask_cache_ = mask;
  return mask_cache_;
}

AttentionInputs MPTModelImpl::attention_inputs(const at::Tensor& ids, const ForwardOptions& fo, int64_t past,
                                               const at::Tensor& key_mask) {
  AttentionInputs in;
  in.past = past;
  in.reference = fo.reference_attention;
  const int64_t s_q = ids.size(1), s_k = past + s_q;
  const bool padding = key_mask.defined() && !key_mask.all().item<bool>();
  const bool seq_ids = o_.attn.attn_uses_sequence_id && fo.sequence_id.has_value();
  const bool structural = o_.attn.alibi || o_.attn.sliding_window_size > 0 || (past > 0 && s_q > 1);
  if (!structural && !padding && !seq_ids) {
    in.is_causal = past == 0;  // a single new token after the cache attends to everything
  } else {
    at::Tensor mask = structural_mask(past, s_q, ids.device());
    if (padding) {
      mask = mask.masked_fill(key_mask.logical_not().view({ids.size(0), 1, 1, s_k}), kMasked);
    }
    if (seq_ids) {
      TORCH_CHECK(past == 0, "sequence_id cannot be combined with a KV cache");
      const at::Tensor& sid = *fo.sequence_id;
      const at::Tensor other = sid.unsqueeze(2) != sid.unsqueeze(1);  // (B, S, S)
      mask = mask.masked_fill(other.unsqueeze(1), kMasked);
    }
    in.mask = mask.to(compute_dtype(wte->weight));
  }
  if (o_.attn.rope) {
    const int64_t half = o_.head_dim() / 2;
    const auto fopts = at::TensorOptions().device(ids.device()).dtype(at::kFloat);
    const at::Tensor inv_freq =
        1.0 / at::pow(o_.attn.rope_theta, at::arange(0, 2 * half, 2, fopts) / static_cast<double>(2 * half));
    at::Tensor freqs = at::outer(at::arange(past, s_k, fopts), inv_freq);  // (s_q, half), positions in fp32
    if (o_.hf_layout == "dbrx" && padding) {
      // transformers' DBRX takes the positions generate() derives from the mask (real tokens only); LLM Foundry's
      // `dail` rotary counts every position from the cache's length.
      const at::Tensor pos = positions_after_padding(key_mask, past, s_q, ids.options());
      freqs = pos.to(at::kFloat).unsqueeze(-1) * inv_freq.view({1, 1, -1});  // (B, s_q, half)
    }
    in.rope_cos = freqs.cos();
    in.rope_sin = freqs.sin();
  }
  return in;
}

at::Tensor MPTModelImpl::embed(const at::Tensor& input_ids, const at::Tensor& key_mask, int64_t past) {
  const int64_t s = input_ids.size(1);
  if (past + s > o_.max_seq_len && o_.learned_pos_emb) {
    throw Error("model", fmt::format("sequence of {} tokens exceeds max_seq_len {}", past + s, o_.max_seq_len));
  }
  at::Tensor x = wte(input_ids);
  // Left padding: positions count real tokens only (LLM Foundry's fix).
  if (wpe) x = x + wpe(positions_after_padding(key_mask, past, s, input_ids.options()));
  if (o_.embedding_fraction < 1.0) {
    x = x * o_.embedding_fraction + x.detach() * (1.0 - o_.embedding_fraction);
  }
  return at::dropout(x, o_.emb_pdrop, is_training());
}

MPTForCausalLMImpl::MPTForCausalLMImpl(const MPTOptions& o) : DecoderLM("transformer.blocks."), o_(o) {
  const at::TensorOptions t = at::TensorOptions().dtype(at::kFloat).device(at::Device(o.init_device));
  if (o.ffn.moe) {
    hf_loss_->coef = o.ffn.moe->output_router_logits ? o.ffn.moe->loss_weight : 0.0;
    hf_loss_->sparse_layers = o.n_layers;
  }
  transformer = register_module("transformer", MPTModel(o, t, aux_scale_, hf_loss_));
  if (!o.tie_word_embeddings) lm_head = register_module("lm_head", Linear(o.d_model, o.vocab_size, false, t));
}

at::Tensor MPTForCausalLMImpl::embed(const at::Tensor& ids, const DecoderCall& call) {
  return transformer->embed(ids, call.key_mask, call.past);
}

at::Tensor MPTForCausalLMImpl::head(const at::Tensor& h) {
  at::Tensor logits = head_logits(transformer->norm_f(h), lm_head);
  if (o_.logit_scale) logits = logits * *o_.logit_scale;
  return logits;
}

void MPTForCausalLMImpl::begin_forward(const DecoderCall& call) {
  transformers_loss_ = o_.ffn.moe && o_.hf_layout == "dbrx" && is_training();
  if (!o_.ffn.moe) return;
  for (const auto& b : *transformer->blocks) b->as<MPTBlockImpl>()->moe->records.clear();
  hf_aux_ = at::Tensor();
  if (transformers_loss_) {
    hf_loss_->start(o_.ffn.moe->num_experts, call.key_mask.defined() ? call.key_mask.reshape({-1}) : at::Tensor(),
                    call.ids.numel(), call.ids.device());
  }
}

void MPTForCausalLMImpl::end_forward() {
  if (transformers_loss_) hf_aux_ = hf_loss_->finish();
}

MPTForCausalLM build_mpt(const MPTOptions& options, uint64_t seed) {
  MPTForCausalLM model(options);
  if (options.init_device != "meta") {
    init_mpt_weights(model, seed);
  }
  return model;
}

MPTForCausalLM materialize(const MPTForCausalLM& meta_model, const at::Device& device, uint64_t seed) {
  MPTOptions o = meta_model->options();
  o.init_device = device.str();
  return build_mpt(o, seed);
}

void MPTForCausalLMImpl::init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select) {
  init_mpt_weights(*this, seed, select);
}

std::shared_ptr<CausalLM> MPTForCausalLMImpl::rebuild(const std::string& device, std::optional<uint64_t> seed) const {
  MPTOptions o = o_;
  o.init_device = device;
  return seed ? build_mpt(o, *seed).ptr() : MPTForCausalLM(o).ptr();
}

double MPTForCausalLMImpl::flops_per_token(int64_t seq_len) const {
  return mpt_flops_per_token(o_, seq_len);
}

std::optional<double> MPTForCausalLMImpl::activation_bytes(int64_t batch, int64_t seq_len, int bytes_per_value,
                                                           bool activation_checkpointing) const {
  return mpt_activation_bytes(o_, batch, seq_len, bytes_per_value, activation_checkpointing);
}

std::string MPTForCausalLMImpl::describe() const {
  const std::string ffn = o_.ffn.moe ? fmt::format("{} x {} experts (top {}, {})", o_.ffn_hidden(),
                                                   o_.ffn.moe->num_experts, o_.ffn.moe->top_k, o_.ffn.moe->ffn_type)
                                     : std::to_string(o_.ffn_hidden());
  return fmt::format("{}: d_model {}, n_heads {} (kv {}), n_layers {}, ffn {}, vocab {}, {}",
                     o_.hf_layout == "dbrx" ? "dbrx (as mpt_causal_lm)" : "mpt_causal_lm", o_.d_model, o_.n_heads,
                     o_.attn.kv_n_heads, o_.n_layers, ffn, o_.vocab_size,
                     o_.attn.alibi ? "alibi" : (o_.attn.rope ? "rope" : "learned positions"));
}

nlohmann::ordered_json MPTForCausalLMImpl::hf_config(at::ScalarType dtype) const {
  return o_.hf_layout == "dbrx" ? dbrx_hf_config(o_, dtype) : mpt_hf_config(o_, dtype);
}

HfFormat MPTForCausalLMImpl::hf_format(at::ScalarType dtype) const {
  return mpt_hf_format(o_, dtype, *this);
}

std::optional<std::string> MPTForCausalLMImpl::tied_embedding_name() const {
  if (!o_.tie_word_embeddings) return std::nullopt;
  return "transformer.wte.weight";
}

std::shared_ptr<CausalLM> MPTForCausalLMImpl::with_alibi(double alibi_bias_max, int64_t max_seq_len,
                                                         uint64_t seed) const {
  if (o_.attn.rope) throw ConfigError("algorithms", "alibi: the model uses rotary embeddings (attn_config.rope)");
  MPTOptions o = o_;
  o.attn.alibi = true;
  o.attn.alibi_bias_max = alibi_bias_max;
  o.learned_pos_emb = false;
  o.max_seq_len = max_seq_len;
  o.init_device = transformer->wte->weight.device().str();
  return build_mpt(o, seed).ptr();
}

std::map<std::string, at::Tensor> MPTForCausalLMImpl::auxiliary_losses() const {
  std::map<std::string, at::Tensor> out;
  if (!o_.ffn.moe) return out;
  if (hf_aux_.defined()) out.emplace("aux_loss", hf_aux_);
  for (const auto& b : *transformer->blocks) {
    const auto& records = b->as<MPTBlockImpl>()->moe->records;
    if (records.empty()) continue;
    for (const auto& [name, t] : {std::pair{"lbl", records.front().lbl}, std::pair{"z_loss", records.front().zloss}}) {
      if (!t.defined()) continue;
      auto it = out.find(name);
      if (it == out.end()) {
        out.emplace(name, t.to(at::kFloat));
      } else {
        it->second = it->second + t.to(at::kFloat);
      }
    }
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> MPTForCausalLMImpl::expert_token_counts() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (!o_.ffn.moe) return out;
  int64_t i = 0;
  for (const auto& b : *transformer->blocks) {
    const auto& records = b->as<MPTBlockImpl>()->moe->records;
    if (!records.empty()) out.emplace_back(fmt::format("layer_{}", i), records.front().tokens_per_expert);
    ++i;
  }
  return out;
}

TensorParallelPlan MPTForCausalLMImpl::tensor_parallel_plan(int64_t degree) const {
  const int64_t h = o_.n_heads, kv = o_.attn.kv_n_heads, hd = o_.head_dim();
  if (h % degree != 0 || kv % degree != 0) {
    refuse_tensor_parallel(
        degree, fmt::format("MPT's {} query and {} key/value heads (attn_config.kv_n_heads) do not split into {} equal "
                            "shares",
                            h, kv, degree));
  }
  if (o_.ffn.moe)
    refuse_tensor_parallel(degree,
                           "the MoE layers' experts do not split over a tensor-parallel group (use moe_world_size)");
  if (o_.attn.qk_ln)
    refuse_tensor_parallel(degree, "attn_config.qk_ln normalises over every head at once (qk_gn, per head, splits)");
  if (o_.attn.alibi) refuse_tensor_parallel(degree, "attn_config.alibi is not split over heads yet");
  if (o_.ffn_hidden() % degree != 0) {
    refuse_tensor_parallel(
        degree, fmt::format("the MLP's {} hidden units do not split into {} equal shares", o_.ffn_hidden(), degree));
  }
  TensorParallelPlan plan;
  // The head along the vocabulary, where it divides (else the head stays whole): the embedding table with it when tied.
  if (o_.vocab_size % degree == 0) {
    if (lm_head) {
      plan.vocab_head("lm_head");
    } else {
      plan.vocab_embedding("transformer.wte");
    }
  }
  int64_t i = 0;
  for (const auto& b : *transformer->blocks) {
    const auto* block = b->as<MPTBlockImpl>();
    const std::string p = fmt::format("transformer.blocks.{}.", i++);
    plan.sequence_norm(p + "norm_1");
    plan.sequence_norm(p + "norm_2");
    const auto& a = *block->attn;
    if (a.Wqkv) {
      plan.column(p + "attn.Wqkv", {h * hd, kv * hd, kv * hd});
    } else {
      plan.column(p + "attn.Wq");
      plan.column(p + "attn.Wk");
      plan.column(p + "attn.Wv");
    }
    if (a.q_ln) {  // qk_gn: over each head's features
      plan.head_norm(p + "attn.q_ln");
      plan.head_norm(p + "attn.k_ln");
    }
    plan.row(p + "attn.out_proj");
    const auto& f = *block->ffn;
    plan.column(p + "ffn.up_proj");
    if (f.gate_proj) plan.column(p + "ffn.gate_proj");
    plan.row(p + "ffn.down_proj");
  }
  return plan;
}

void MPTForCausalLMImpl::record_low_precision_norms() {
  if (o_.norm_type == NormType::kLayerNorm) o_.norm_type = NormType::kLowPrecisionLayerNorm;
  if (o_.norm_type == NormType::kRMSNorm) o_.norm_type = NormType::kLowPrecisionRMSNorm;
}

}  // namespace tessera::models
