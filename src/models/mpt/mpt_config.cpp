// MPT options: parsing LLM Foundry's model schema, validation, parameter and FLOP counts.
#include "models/mpt/mpt_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace tessera::models {
namespace {

// `fc_type`: a string, or (as LLM Foundry's MPTConfig stores it, in the model and in ffn_config of its saved
// config.json) a mapping {name: ...}. Only torch's Linear is implemented.
void read_fc_type(config::Section& s) {
  const config::Value* fc = s.has("fc_type") ? s.raw("fc_type") : nullptr;
  std::string name = "torch";
  if (fc != nullptr && fc->is_map()) {
    config::Section fc_section(fc, s.key_path("fc_type"), s.context());
    name = fc_section.get_string("name", name);
    fc_section.finish();
  } else {
    name = s.get_string("fc_type", name);
  }
  if (name != "torch") s.not_supported("fc_type", name);
}

void parse_attention(config::Section& s, MPTOptions& o) {
  AttentionOptions& a = o.attn;
  a.attn_type = s.get_choice("attn_type", a.attn_type,
                             {"multihead_attention", "multiquery_attention", "grouped_query_attention"});
  a.attn_impl = s.get_choice("attn_impl", a.attn_impl, {"torch", "flash", "triton"});
  if (a.attn_impl == "triton") s.not_supported("attn_impl", "triton was removed from LLM Foundry; use flash or torch");
  a.attn_pdrop = s.get_double("attn_pdrop", a.attn_pdrop);
  s.check(a.attn_pdrop >= 0 && a.attn_pdrop <= 1, "attn_pdrop", "must lie in [0, 1]");
  a.qk_ln = s.get_bool("qk_ln", a.qk_ln);
  a.qk_gn = s.get_bool("qk_gn", a.qk_gn);
  s.check(!(a.qk_ln && a.qk_gn), "qk_gn", "qk_ln and qk_gn are mutually exclusive");
  a.clip_qkv = s.get_optional_double("clip_qkv");
  s.check(!a.clip_qkv || *a.clip_qkv > 0, "clip_qkv", "must be positive");
  a.softmax_scale = s.get_optional_double("softmax_scale");
  s.check(!a.softmax_scale || *a.softmax_scale > 0, "softmax_scale", "must be positive");
  a.attn_uses_sequence_id = s.get_bool("attn_uses_sequence_id", a.attn_uses_sequence_id);
  a.sliding_window_size = s.get_int("sliding_window_size", a.sliding_window_size);
  s.check(a.sliding_window_size == -1 || a.sliding_window_size > 0, "sliding_window_size", "must be -1 or positive");
  a.alibi = s.get_bool("alibi", a.alibi);
  a.alibi_bias_max = s.get_double("alibi_bias_max", a.alibi_bias_max);
  s.check(a.alibi_bias_max > 0, "alibi_bias_max", "must be positive");
  a.rope = s.get_bool("rope", a.rope);
  a.rope_theta = s.get_double("rope_theta", a.rope_theta);
  s.check(a.rope_theta > 0, "rope_theta", "must be positive");
  s.check(!(a.alibi && a.rope), "rope", "alibi and rope are mutually exclusive");
  const std::string rope_impl = s.get_choice("rope_impl", "dail", {"dail", "hf"});
  if (rope_impl != "dail") s.not_supported("rope_impl", "hf");
  if (auto cfg = s.section("rope_dail_config"); cfg.present()) {
    const std::string type = cfg.get_string("type", "original");
    if (type != "original") cfg.not_supported("type", type);
    cfg.get_bool("pos_idx_in_fp32", true);
    cfg.get_int("xpos_scale_base", 512);
    cfg.finish();
  }
  if (auto cfg = s.section("rope_hf_config"); cfg.present()) {
    // Only read with rope_impl: hf (not supported); LLM Foundry's saved configs carry its default, no scaling.
    const std::string type = cfg.get_string("type", "no_scaling");
    if (type != "no_scaling") cfg.not_supported("type", type);
    cfg.get_double("factor", 1.0);
    cfg.finish();
  }
  a.fused_qkv = s.get_bool("fused_qkv", a.fused_qkv);
  if (s.get_bool("nope", false)) s.not_supported("nope", "true");
  if (s.get_optional_double("attn_logit_softcapping")) s.not_supported("attn_logit_softcapping");

  if (a.attn_type == "multihead_attention") {
    a.kv_n_heads = s.get_int("kv_n_heads", o.n_heads);
    s.check(a.kv_n_heads == o.n_heads, "kv_n_heads", "multihead_attention uses kv_n_heads == n_heads");
  } else if (a.attn_type == "multiquery_attention") {
    a.kv_n_heads = s.get_int("kv_n_heads", 1);
    s.check(a.kv_n_heads == 1, "kv_n_heads", "multiquery_attention uses kv_n_heads == 1");
  } else {
    a.kv_n_heads = s.require_int("kv_n_heads");
    s.check(a.kv_n_heads > 0 && a.kv_n_heads <= o.n_heads && o.n_heads % a.kv_n_heads == 0, "kv_n_heads",
            fmt::format("must divide n_heads ({})", o.n_heads));
  }
  s.finish({"attn_temperature_tuning", "kv_dim", "flex_attn_mod_list", "flex_attn_config", "reuse_kv_layer_idx",
            "attn_logit_softcapping"});
}

// ffn_config of a mixture of experts: LLM Foundry's torch_dmoe keys and the MegaBlocks Arguments fields LLM Foundry
// passes through for mb_moe / mb_dmoe, with MegaBlocks' defaults.
void parse_moe(config::Section& s, MPTOptions& o, const std::string& type) {
  MoEFfnOptions m;
  m.ffn_type = type;
  m.num_experts = s.get_int("moe_num_experts", 1);
  s.check(m.num_experts >= 1, "moe_num_experts", "must be at least 1");
  m.top_k = s.get_int("moe_top_k", 1);
  s.check(m.top_k >= 1 && m.top_k <= m.num_experts, "moe_top_k",
          fmt::format("must lie in [1, moe_num_experts] ([1, {}])", m.num_experts));
  m.glu = s.get_choice("mlp_type", "mlp", {"mlp", "glu"}) == "glu";
  s.get_choice("mlp_impl", "sparse", {"sparse", "grouped"});  // MegaBlocks' kernels; the same function
  m.jitter_eps = s.get_optional_double("moe_jitter_eps");
  s.check(!m.jitter_eps || (*m.jitter_eps >= 0 && *m.jitter_eps < 1), "moe_jitter_eps", "must lie in [0, 1)");
  m.normalize_expert_weights = s.get_optional_double("moe_normalize_expert_weights");
  s.check(!m.normalize_expert_weights || *m.normalize_expert_weights > 0, "moe_normalize_expert_weights",
          "must be a positive p (1 or 2 are usual)");
  m.uniform_expert_assignment = s.get_bool("uniform_expert_assignment", false);
  m.capacity_factor = s.get_double("moe_capacity_factor", 1.0);
  s.check(m.capacity_factor >= 0, "moe_capacity_factor", "must not be negative");
  m.loss_weight = s.get_double("moe_loss_weight", type == "torch_dmoe" ? 0.0 : 0.1);
  s.check(m.loss_weight >= 0, "moe_loss_weight", "must not be negative");
  m.lbl_in_fp32 = s.get_bool("moe_lbl_in_fp32", false);
  m.zloss_weight = s.get_double("moe_zloss_weight", 0.0);
  s.check(m.zloss_weight >= 0, "moe_zloss_weight", "must not be negative");
  m.zloss_in_fp32 = s.get_bool("moe_zloss_in_fp32", false);
  m.memory_optimized_mlp = s.get_bool("memory_optimized_mlp", false);
  m.world_size = s.get_int("moe_world_size", 1);
  s.check(m.world_size >= 1 && m.num_experts % m.world_size == 0, "moe_world_size",
          fmt::format("must divide moe_num_experts ({}): each rank of an expert-parallel group holds as many experts",
                      m.num_experts));
  if (const config::Value* group = s.raw("lbl_process_group"); group && !group->is_null()) {
    s.not_supported("lbl_process_group", group->brief());
  }
  if (s.get_bool("moe_expert_model_parallelism", false)) s.not_supported("moe_expert_model_parallelism", "true");
  if (s.get_bool("moe_weight_parallelism", false)) s.not_supported("moe_weight_parallelism", "true");
  if (s.get_bool("shared_expert", false)) s.not_supported("shared_expert", "true");
  if (s.raw("device_mesh")) {
    s.not_supported("device_mesh", "(the sharding engine makes the expert-parallel groups from moe_world_size)");
  }
  s.get_bool("fp16", false);  // LLM Foundry sets both false: the trainer's precision decides
  s.get_bool("bf16", false);
  s.get_bool("return_bias", false);
  o.ffn.moe = m;
}

void parse_ffn(config::Section& s, MPTOptions& o) {
  const std::string type =
      s.get_choice("ffn_type", "mptmlp", {"mptmlp", "mptglu", "te_ln_mlp", "torch_dmoe", "mb_moe", "mb_dmoe"});
  if (type == "mptglu") {
    o.ffn.type = FfnType::kGLU;
  } else if (type == "torch_dmoe" || type == "mb_moe" || type == "mb_dmoe") {
    parse_moe(s, o, type);
  } else if (type != "mptmlp") {
    s.not_supported("ffn_type", type);
  }
  o.ffn.ffn_hidden_size = s.get_optional_int("ffn_hidden_size");
  s.check(!o.ffn.ffn_hidden_size || *o.ffn.ffn_hidden_size > 0, "ffn_hidden_size", "must be positive");
  // MegaBlocks' layers default to the tanh GELU (its Arguments.activation_fn); every other ffn_type to LLM Foundry's
  // exact GELU.
  if (type == "mb_moe" || type == "mb_dmoe") o.ffn.ffn_act_fn = "gelu_pytorch_tanh";
  if (const config::Value* act = s.raw("ffn_act_fn")) {
    config::Section act_section(act, s.key_path("ffn_act_fn"), s.context());
    // LLM Foundry's resolve_ffn_act_fn: torch.nn.functional.<name>(x, **rest); held as the activation's name in
    // transformers' ACT2FN, which computes the same function.
    const std::string name =
        act_section.get_choice("name", "gelu", {"gelu", "relu", "silu", "sigmoid", "tanh", "mish"});
    if (name == "gelu") {
      const std::string approximate = act_section.get_choice("approximate", "none", {"none", "tanh"});
      o.ffn.ffn_act_fn = approximate == "tanh" ? "gelu_pytorch_tanh" : "gelu";
    } else {
      o.ffn.ffn_act_fn = name;
    }
    act_section.finish();
  }
  read_fc_type(s);
  s.finish({"ffn_bias"});
}

void parse_init(config::Section& s, MPTOptions& o) {
  InitOptions& i = o.init;
  i.name = s.get_choice("name", i.name,
                        {"default_", "baseline_", "kaiming_uniform_", "kaiming_normal_", "neox_init_", "small_init_",
                         "xavier_uniform_", "xavier_normal_"});
  i.fan_mode = s.get_choice("fan_mode", i.fan_mode, {"fan_in", "fan_out"});
  i.init_nonlinearity = s.get_choice("init_nonlinearity", i.init_nonlinearity, {"relu", "leaky_relu", "linear"});
  i.init_div_is_residual = std::sqrt(2.0 * static_cast<double>(o.n_layers));
  if (const config::Value* div = s.raw("init_div_is_residual")) {
    if (auto b = div->as_bool()) {
      i.init_div_is_residual = *b ? std::sqrt(2.0 * static_cast<double>(o.n_layers)) : 1.0;
    } else if (auto d = div->as_double(); d && *d > 0) {
      i.init_div_is_residual = *d;
    } else {
      s.fail("init_div_is_residual", "expected true, false or a positive number, got " + div->brief());
    }
  }
  i.emb_init_std = s.get_optional_double("emb_init_std");
  i.emb_init_uniform_lim = s.get_optional_double("emb_init_uniform_lim");
  i.init_std = s.get_optional_double("init_std");
  i.init_gain = s.get_double("init_gain", i.init_gain);
  s.check(i.name != "baseline_" || i.init_std.has_value(), "init_std", "baseline_ init needs init_std");
  s.finish({"verbose"});
}

}  // namespace

int64_t MPTOptions::ffn_hidden() const {
  if (ffn.ffn_hidden_size) return *ffn.ffn_hidden_size;
  return static_cast<int64_t>(static_cast<double>(d_model) * expansion_ratio);
}

MoEOptions MPTOptions::moe_layer() const {
  const MoEFfnOptions& m = ffn.moe.value();
  MoEOptions l;
  l.num_experts = m.num_experts;
  l.top_k = m.top_k;
  l.hidden_size = d_model;
  l.ffn_hidden = ffn_hidden();
  l.glu = m.glu;
  l.activation = ffn.ffn_act_fn;
  l.jitter_eps = m.jitter_eps;
  l.normalize_expert_weights = m.normalize_expert_weights;
  l.uniform_expert_assignment = m.uniform_expert_assignment;
  if (m.ffn_type == "mb_moe") l.capacity_factor = m.capacity_factor;
  l.output_bias = m.ffn_type != "torch_dmoe" && !no_bias;  // torch_dmoe ignores bias; MegaBlocks adds one
  l.loss_weight = m.loss_weight;
  l.lbl_in_fp32 = m.lbl_in_fp32;
  l.zloss_weight = m.zloss_weight;
  l.zloss_in_fp32 = m.zloss_in_fp32;
  l.world_size = m.world_size;
  l.num_layers = n_layers;
  if (hf_layout == "dbrx") {
    l.router_fp32 = true;
    l.jitter_experts = true;
    l.transformers_loss = true;
    l.loss_weight = 0;  // transformers' loss instead (HfRouterLoss), weighted by moe_loss_weight
  }
  return l;
}

MPTOptions parse_mpt_options(config::Section& s) {
  MPTOptions o;
  o.d_model = s.get_int("d_model", o.d_model);
  o.n_heads = s.get_int("n_heads", o.n_heads);
  o.n_layers = s.get_int("n_layers", o.n_layers);
  s.check(o.d_model > 0, "d_model", "must be positive");
  s.check(o.n_heads > 0, "n_heads", "must be positive");
  s.check(o.n_layers > 0, "n_layers", "must be positive");
  s.check(o.d_model % o.n_heads == 0, "n_heads", fmt::format("must divide d_model ({})", o.d_model));
  if (const auto hd = s.get_optional_int("head_dim")) {  // LLM Foundry writes null for the default
    s.check(*hd == o.d_model / o.n_heads, "head_dim", "only head_dim == d_model / n_heads is supported");
  }
  o.expansion_ratio = s.get_double("expansion_ratio", o.expansion_ratio);
  s.check(o.expansion_ratio > 0, "expansion_ratio", "must be positive");
  const double hidden = static_cast<double>(o.d_model) * o.expansion_ratio;
  o.max_seq_len = s.get_int("max_seq_len", o.max_seq_len);
  s.check(o.max_seq_len > 0, "max_seq_len", "must be positive");
  o.vocab_size = s.get_int("vocab_size", o.vocab_size);
  s.check(o.vocab_size > 0, "vocab_size", "must be positive");
  o.resid_pdrop = s.get_double("resid_pdrop", o.resid_pdrop);
  s.check(o.resid_pdrop >= 0 && o.resid_pdrop <= 1, "resid_pdrop", "must lie in [0, 1]");
  o.emb_pdrop = s.get_double("emb_pdrop", o.emb_pdrop);
  s.check(o.emb_pdrop >= 0 && o.emb_pdrop <= 1, "emb_pdrop", "must lie in [0, 1]");
  o.learned_pos_emb = s.get_bool("learned_pos_emb", o.learned_pos_emb);
  o.no_bias = s.get_bool("no_bias", o.no_bias);
  if (s.has("attention_bias")) o.attention_bias = s.get_bool("attention_bias", true);
  const std::string norm =
      s.get_choice("norm_type", "low_precision_layernorm",
                   {"layernorm", "low_precision_layernorm", "rmsnorm", "low_precision_rmsnorm", "triton_rmsnorm"});
  if (norm == "layernorm") o.norm_type = NormType::kLayerNorm;
  if (norm == "rmsnorm") o.norm_type = NormType::kRMSNorm;
  if (norm == "low_precision_rmsnorm") o.norm_type = NormType::kLowPrecisionRMSNorm;
  if (norm == "triton_rmsnorm") s.not_supported("norm_type", norm);
  o.norm_eps = s.get_double("norm_eps", o.norm_eps);
  s.check(o.norm_eps > 0, "norm_eps", "must be positive");
  o.tie_word_embeddings = s.get_bool("tie_word_embeddings", o.tie_word_embeddings);
  if (const config::Value* ls = s.raw("logit_scale")) {
    if (ls->is_scalar() && ls->text() == "inv_sqrt_d_model") {
      o.logit_scale = 1.0 / std::sqrt(static_cast<double>(o.d_model));
    } else if (auto d = ls->as_double()) {
      o.logit_scale = *d;
    } else {
      s.fail("logit_scale", "expected a number or \"inv_sqrt_d_model\", got " + ls->brief());
    }
  }
  o.embedding_fraction = s.get_double("embedding_fraction", o.embedding_fraction);
  s.check(o.embedding_fraction > 0 && o.embedding_fraction <= 1, "embedding_fraction", "must lie in (0, 1]");
  o.init_device = s.get_choice("init_device", o.init_device, {"cpu", "meta", "mixed", "cuda"});
  if (o.init_device == "mixed") s.not_supported("init_device", "mixed");
  o.loss_fn = s.get_choice("loss_fn", o.loss_fn, {"fused_crossentropy", "torch_crossentropy"});
  read_fc_type(s);
  if (s.get_bool("use_cache", false)) s.not_supported("use_cache", "true (the KV cache is used by generation only)");
  if (!s.get_bool("use_pad_tok_in_ffn", true)) s.not_supported("use_pad_tok_in_ffn", "false");
  if (s.get_optional_double("final_logit_softcapping")) s.not_supported("final_logit_softcapping");

  auto attn = s.section("attn_config");
  parse_attention(attn, o);
  auto ffn = s.section("ffn_config");
  parse_ffn(ffn, o);
  if (!o.ffn.ffn_hidden_size) {
    s.check(hidden == std::floor(hidden), "expansion_ratio",
            fmt::format("d_model * expansion_ratio must be a whole number, got {}", hidden));
  }
  auto init = s.section("init_config");
  parse_init(init, o);
  if (o.attn.alibi || o.attn.rope) o.learned_pos_emb = false;  // as LLM Foundry (it warns)
  s.finish({"block_overrides", "pad_token_id", "pretrained", "pretrained_model_name_or_path", "config_overrides",
            "peft_config", "use_flash_attention_2", "z_loss", "use_train_metrics", "additional_train_metrics",
            "additional_eval_metrics", "shift_labels", "allow_embedding_resizing", "n_active_params"});
  return o;
}

int64_t mpt_block_params(const MPTOptions& o) {
  const int64_t d = o.d_model, hd = o.head_dim(), h = o.n_heads, kv = o.attn.kv_n_heads;
  const int64_t f = o.ffn_hidden();
  const int64_t bias = o.no_bias ? 0 : 1;
  const int64_t norm_bias = o.norm_has_bias() ? 1 : 0;
  const int64_t norm = d * (1 + norm_bias);  // weight (+ bias; RMSNorm has none)
  int64_t n = 0;
  n += norm;  // norm_1
  const int64_t qkv_out = (h + 2 * kv) * hd;
  n += d * qkv_out + (o.wqkv_bias() ? qkv_out : 0);  // attn.Wqkv (or Wq, Wk, Wv: the same count)
  // q_ln / k_ln are LayerNorms with a bias unless no_bias, whatever norm_type (as LLM Foundry builds them).
  if (o.attn.qk_ln) n += (h * hd + kv * hd) * (1 + bias);           // attn.q_ln over H*hd, attn.k_ln over KV*hd
  if (o.attn.qk_gn) n += 2 * hd * (1 + bias);                       // per-head norms
  n += h * hd * d + bias * d;                                       // attn.out_proj
  n += norm;                                                        // norm_2
  if (o.ffn.moe) return n + moe_params(o.moe_layer());              // router, experts (and their bias)
  const int64_t projections = o.ffn.type == FfnType::kGLU ? 2 : 1;  // up_proj (+ gate_proj)
  n += projections * (d * f + bias * f);
  n += f * d + bias * d;  // ffn.down_proj
  return n;
}

int64_t mpt_param_count(const MPTOptions& o) {
  const int64_t d = o.d_model;
  int64_t n = o.vocab_size * d;                   // transformer.wte
  if (o.learned_pos_emb) n += o.max_seq_len * d;  // transformer.wpe
  n += o.n_layers * mpt_block_params(o);
  n += d * (o.norm_has_bias() ? 2 : 1);               // transformer.norm_f
  if (!o.tie_word_embeddings) n += o.vocab_size * d;  // lm_head (no bias)
  return n;
}

int64_t mpt_active_param_count(const MPTOptions& o) {
  int64_t n = mpt_param_count(o);
  if (o.ffn.moe) {
    const MoEOptions l = o.moe_layer();
    n -= o.n_layers * (moe_params(l) - moe_active_params(l));
  }
  return n;
}

double init_div_is_residual(const MPTOptions& o) {
  return o.init.init_div_is_residual > 0 ? o.init.init_div_is_residual
                                         : std::sqrt(2.0 * static_cast<double>(o.n_layers));
}

double mpt_flops_per_token(const MPTOptions& o, int64_t seq_len) {
  double n = static_cast<double>(mpt_active_param_count(o));
  if (!o.tie_word_embeddings) n -= static_cast<double>(o.vocab_size * o.d_model);
  return 6.0 * n +
         12.0 * static_cast<double>(o.n_layers) * static_cast<double>(o.d_model) * static_cast<double>(seq_len);
}

int64_t mpt_largest_unit_params(const MPTOptions& o) {
  int64_t embedding = o.vocab_size * o.d_model + (o.learned_pos_emb ? o.max_seq_len * o.d_model : 0);
  return std::max(embedding, mpt_block_params(o));
}

double mpt_activation_bytes(const MPTOptions& o, int64_t batch, int64_t seq_len, int bytes_per_value,
                            bool activation_checkpointing) {
  const double tokens = static_cast<double>(batch) * static_cast<double>(seq_len);
  const double d = static_cast<double>(o.d_model);
  const double f = static_cast<double>(o.ffn_hidden());
  const double p = bytes_per_value;
  double values = 8 * d + 2 * f + (o.ffn.type == FfnType::kGLU ? f : 0);
  if (o.ffn.moe) {
    // Each token's top_k expert rows: its input copy (d), the hidden activations (2 F, 3 F with GLU) and output (d),
    // plus the router's logits and scores (2 E).
    const MoEOptions l = o.moe_layer();
    const double k = static_cast<double>(l.top_k);
    values = 8 * d + k * (2 * d + (l.glu ? 3 : 2) * f) + 2 * static_cast<double>(l.num_experts);
  }
  double masks = 0;
  if (o.attn.attn_pdrop > 0 || o.resid_pdrop > 0) masks = 2 * d;  // residual dropout masks (attention and ffn)
  const double block = tokens * (values * p + masks);
  const double layers = static_cast<double>(o.n_layers);
  const double stored = activation_checkpointing ? layers * tokens * d * p + block : layers * block;
  const double logits = tokens * static_cast<double>(o.vocab_size) * (p + 4);
  return stored + logits;
}

}  // namespace tessera::models
