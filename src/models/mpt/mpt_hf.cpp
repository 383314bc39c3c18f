// MPT's config.json in both directions (LLM Foundry's MPTConfig fields plus HF's aliases).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <vector>

#include <fmt/ranges.h>

#include "models/mpt/mpt.h"
#include "tessera/config/reader.h"
#include "tessera/config/value.h"
#include "tessera/models/family_keys.h"
#include "tessera/models/family_support.h"
#include "tessera/util/error.h"

namespace tessera::models {
namespace {

constexpr const char* kComponent = "hf";

const std::set<std::string> kModelKeys = {"d_model",
                                          "n_heads",
                                          "n_layers",
                                          "expansion_ratio",
                                          "max_seq_len",
                                          "vocab_size",
                                          "resid_pdrop",
                                          "emb_pdrop",
                                          "learned_pos_emb",
                                          "attn_config",
                                          "ffn_config",
                                          "logit_scale",
                                          "no_bias",
                                          "attention_bias",
                                          "embedding_fraction",
                                          "norm_type",
                                          "norm_eps",
                                          "init_config",
                                          "tie_word_embeddings",
                                          "fc_type",
                                          "use_pad_tok_in_ffn",
                                          "final_logit_softcapping",
                                          "block_overrides",
                                          "head_dim"};
const std::set<std::string> kAttnKeys = {"attn_type",
                                         "attn_pdrop",
                                         "attn_impl",
                                         "qk_ln",
                                         "qk_gn",
                                         "clip_qkv",
                                         "softmax_scale",
                                         "attn_uses_sequence_id",
                                         "sliding_window_size",
                                         "alibi",
                                         "alibi_bias_max",
                                         "rope",
                                         "rope_theta",
                                         "rope_impl",
                                         "rope_dail_config",
                                         "rope_hf_config",
                                         "kv_n_heads",
                                         "fused_qkv",
                                         "nope",
                                         "attn_logit_softcapping"};
const std::set<std::string> kInitKeys = {
    "name",     "fan_mode", "init_nonlinearity", "init_div_is_residual", "emb_init_std", "emb_init_uniform_lim",
    "init_std", "init_gain"};

nlohmann::json filtered(const nlohmann::json& in, const std::set<std::string>& keep) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [k, v] : in.items()) {
    if (keep.count(k)) out[k] = v;
  }
  return out;
}

}  // namespace

MPTOptions mpt_options_from_hf_config(const nlohmann::json& raw, const std::string& where) {
  if (raw.value("model_type", "") != "mpt") {
    throw Error(kComponent,
                fmt::format("{}: model_type is \"{}\", expected \"mpt\"", where, raw.value("model_type", "")));
  }
  // LLM Foundry's MPTConfig also writes init_device (Tessera's own choice decides) and verbose, its hub configs
  // tokenizer_name; transformers' MptConfig writes layer_norm_epsilon (read as norm_eps) and attn_config.prefix_lm.
  std::set<std::string> read = kModelKeys;
  read.insert({"layer_norm_epsilon", "model_type"});
  refuse_unread_hf_keys(raw, read, {"init_device", "verbose", "tokenizer_name"}, where, "mpt");
  // (A transformers sub-config also carries PretrainedConfig's fields, tie_word_embeddings among them.) LLM Foundry
  // writes attn_temperature_tuning {floor_scale, attn_scale}, which scales queries by position only when attn_scale
  // is not 0: read as off at 0, refused otherwise.
  if (raw.contains("attn_config") && raw["attn_config"].is_object()) {
    nlohmann::json attn = raw["attn_config"];
    if (attn.contains("attn_temperature_tuning")) {
      const nlohmann::json& t = attn["attn_temperature_tuning"];
      if (t.is_null() || (t.is_object() && t.value("attn_scale", nlohmann::json(0)) == 0)) {
        attn.erase("attn_temperature_tuning");
      }
    }
    refuse_unread_hf_keys(attn, kAttnKeys, {"tie_word_embeddings"}, where, "mpt", "attn_config.");
  }
  nlohmann::json cfg = filtered(raw, kModelKeys);
  if (!cfg.contains("norm_eps") && raw.contains("layer_norm_epsilon")) cfg["norm_eps"] = raw["layer_norm_epsilon"];
  if (raw.contains("attn_config")) cfg["attn_config"] = filtered(raw["attn_config"], kAttnKeys);
  if (raw.contains("init_config") && raw["init_config"].is_object()) {
    cfg["init_config"] = filtered(raw["init_config"], kInitKeys);
  }
  if (cfg.contains("attn_config")) cfg["attn_config"]["attn_impl"] = "torch";  // both run as SDPA here
  // Parse through the recipe schema, so that config.json and recipes are validated by the same code.
  config::Origin origin;
  origin.file = where;
  config::Value v = config::parse_yaml(cfg.dump(), origin);
  config::ParseContext ctx(where);
  config::Section s(&v, "", ctx);
  MPTOptions o;
  try {
    o = parse_mpt_options(s);
    ctx.throw_if_unsupported();
  } catch (const ConfigError& e) {
    throw Error(kComponent, e.message());
  }
  o.init_device = "cpu";
  return o;
}

nlohmann::ordered_json mpt_hf_config(const MPTOptions& o, at::ScalarType dtype) {
  const char* norm = "layernorm";
  if (o.norm_type == NormType::kLowPrecisionLayerNorm) norm = "low_precision_layernorm";
  if (o.norm_type == NormType::kRMSNorm) norm = "rmsnorm";
  if (o.norm_type == NormType::kLowPrecisionRMSNorm) norm = "low_precision_rmsnorm";
  nlohmann::ordered_json attn = {
      {"attn_type", o.attn.attn_type},
      // attn_pdrop, alibi_bias_max and expansion_ratio are ints in transformers' MptConfig (any number in LLM
      // Foundry's).
      {"attn_pdrop", whole_number_json(o.attn.attn_pdrop)},
      {"attn_impl", "torch"},
      {"qk_ln", o.attn.qk_ln},
      {"qk_gn", o.attn.qk_gn},
      {"clip_qkv", o.attn.clip_qkv ? nlohmann::ordered_json(*o.attn.clip_qkv) : nlohmann::ordered_json()},
      {"softmax_scale",
       o.attn.softmax_scale ? nlohmann::ordered_json(*o.attn.softmax_scale) : nlohmann::ordered_json()},
      {"attn_uses_sequence_id", o.attn.attn_uses_sequence_id},
      {"sliding_window_size", o.attn.sliding_window_size},
      {"alibi", o.attn.alibi},
      {"alibi_bias_max", whole_number_json(o.attn.alibi_bias_max)},
      {"rope", o.attn.rope},
      {"rope_theta", o.attn.rope_theta},
      {"rope_impl", "dail"}};
  if (o.attn.attn_type == "grouped_query_attention") attn["kv_n_heads"] = o.attn.kv_n_heads;
  if (!o.attn.fused_qkv) attn["fused_qkv"] = false;
  nlohmann::ordered_json ffn = {{"ffn_type", o.ffn.type == FfnType::kGLU ? "mptglu" : "mptmlp"}};
  if (o.ffn.moe) {
    // LLM Foundry's torch_dmoe keys, and MegaBlocks' for the losses and capacity (which LLM Foundry passes on).
    const MoEFfnOptions& m = *o.ffn.moe;
    auto optional = [](const std::optional<double>& v) {
      return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json();
    };
    ffn = {{"ffn_type", m.ffn_type},
           {"moe_num_experts", m.num_experts},
           {"moe_top_k", m.top_k},
           {"mlp_type", m.glu ? "glu" : "mlp"},
           {"moe_jitter_eps", optional(m.jitter_eps)},
           {"moe_normalize_expert_weights", optional(m.normalize_expert_weights)},
           {"uniform_expert_assignment", m.uniform_expert_assignment}};
    if (m.ffn_type != "torch_dmoe" || m.loss_weight != 0) ffn["moe_loss_weight"] = m.loss_weight;
    if (m.ffn_type == "mb_moe") ffn["moe_capacity_factor"] = m.capacity_factor;
    if (m.lbl_in_fp32) ffn["moe_lbl_in_fp32"] = true;
    if (m.zloss_weight != 0) ffn["moe_zloss_weight"] = m.zloss_weight;
    if (m.zloss_in_fp32) ffn["moe_zloss_in_fp32"] = true;
    if (m.memory_optimized_mlp) ffn["memory_optimized_mlp"] = true;
  }
  if (o.ffn.ffn_hidden_size) ffn["ffn_hidden_size"] = *o.ffn.ffn_hidden_size;
  const bool default_act = o.ffn.moe && o.ffn.moe->ffn_type != "torch_dmoe" ? o.ffn.ffn_act_fn == "gelu_pytorch_tanh"
                                                                            : o.ffn.ffn_act_fn == "gelu";
  if (!default_act) {
    // torch.nn.functional's form; GPT-2's gelu_new is the same tanh GELU (equal up to rounding).
    const bool tanh_gelu = o.ffn.ffn_act_fn == "gelu_pytorch_tanh" || o.ffn.ffn_act_fn == "gelu_new";
    ffn["ffn_act_fn"] = tanh_gelu ? nlohmann::ordered_json{{"name", "gelu"}, {"approximate", "tanh"}}
                                  : nlohmann::ordered_json{{"name", o.ffn.ffn_act_fn}};
  }
  nlohmann::ordered_json init = {{"name", o.init.name},
                                 {"fan_mode", o.init.fan_mode},
                                 {"init_nonlinearity", o.init.init_nonlinearity},
                                 {"init_div_is_residual", init_div_is_residual(o)},
                                 {"init_gain", o.init.init_gain}};
  if (o.init.emb_init_std) init["emb_init_std"] = *o.init.emb_init_std;
  if (o.init.emb_init_uniform_lim) init["emb_init_uniform_lim"] = *o.init.emb_init_uniform_lim;
  if (o.init.init_std) init["init_std"] = *o.init.init_std;
  nlohmann::ordered_json j = {
      {"architectures", {"MPTForCausalLM"}},
      {"model_type", "mpt"},
      {"d_model", o.d_model},
      {"n_heads", o.n_heads},
      {"n_layers", o.n_layers},
      {"expansion_ratio", whole_number_json(o.expansion_ratio)},
      {"max_seq_len", o.max_seq_len},
      {"vocab_size", o.vocab_size},
      {"resid_pdrop", o.resid_pdrop},
      {"emb_pdrop", o.emb_pdrop},
      {"learned_pos_emb", o.learned_pos_emb},
      {"attn_config", attn},
      {"ffn_config", ffn},
      {"init_device", "cpu"},
      {"logit_scale", o.logit_scale ? nlohmann::ordered_json(*o.logit_scale) : nlohmann::ordered_json()},
      {"no_bias", o.no_bias},
      {"embedding_fraction", o.embedding_fraction},
      {"norm_type", norm},
      {"norm_eps", o.norm_eps},
      {"layer_norm_epsilon", o.norm_eps},
      {"use_cache", false},
      {"init_config", init},
      {"tie_word_embeddings", o.tie_word_embeddings},
      {"torch_dtype", hf_torch_dtype(dtype)}};
  if (o.attention_bias) j["attention_bias"] = *o.attention_bias;
  return j;
}

namespace {

// What keeps a model from every transformers architecture (as phrases naming the recipe key).
std::vector<std::string> blockers_for_any(const MPTOptions& o) {
  std::vector<std::string> why;
  if (o.attn.kv_n_heads != o.n_heads) {
    why.push_back(fmt::format("attn_config.attn_type {} (kv_n_heads {} of {} heads)", o.attn.attn_type,
                              o.attn.kv_n_heads, o.n_heads));
  }
  if (o.attn.qk_ln) why.emplace_back("attn_config.qk_ln");
  if (!o.attn.fused_qkv) why.emplace_back("attn_config.fused_qkv false (separate Wq, Wk, Wv)");
  if (o.attn.qk_gn) why.emplace_back("attn_config.qk_gn");
  if (o.attn.sliding_window_size > 0) {
    why.push_back(fmt::format("attn_config.sliding_window_size {}", o.attn.sliding_window_size));
  }
  if (o.attn.rope) why.emplace_back("attn_config.rope");
  if (o.ffn.type == FfnType::kGLU) why.emplace_back("ffn_config.ffn_type mptglu");
  if (o.ffn.moe) why.push_back(fmt::format("ffn_config.ffn_type {} (a mixture of experts)", o.ffn.moe->ffn_type));
  if (o.norm_type == NormType::kRMSNorm || o.norm_type == NormType::kLowPrecisionRMSNorm) {
    why.emplace_back("norm_type rmsnorm");
  }
  if (o.logit_scale) why.push_back(fmt::format("logit_scale {}", *o.logit_scale));
  return why;
}

// transformers' MptForCausalLM computes the exact GELU only.
std::vector<std::string> blockers_for_mpt(const MPTOptions& o) {
  std::vector<std::string> why = blockers_for_any(o);
  if (o.ffn.ffn_act_fn != "gelu") why.push_back(fmt::format("ffn_config.ffn_act_fn {}", o.ffn.ffn_act_fn));
  return why;
}

std::string refusal(const MPTOptions& o, const std::string& target, const std::vector<std::string>& why) {
  return fmt::format(
      "this MPT ({}) has no exact Hugging Face transformers form: {} cannot represent {}; transformers would load a "
      "different function. Export the LLM Foundry layout instead (convert --layout llm-foundry, loaded by LLM "
      "Foundry's MPT class), or train with settings transformers represents: learned positions (exported as GPT-2), "
      "or ALiBi with no_bias: true and expansion_ratio 4 (exported as MPT)",
      o.attn.alibi ? "ALiBi" : (o.attn.rope ? "rotary positions" : "learned positions"), target, fmt::join(why, ", "));
}

// transformers' MptForCausalLM: ALiBi (slopes from alibi_bias_max 8), no biases anywhere, 4 d_model MLP, multi-head.
HfFormat mpt_as_transformers_mpt(const MPTOptions& o, at::ScalarType dtype, const CausalLM& model) {
  std::vector<std::string> why = blockers_for_mpt(o);
  if (!o.no_bias || o.wqkv_bias()) why.emplace_back("biases (no_bias: false)");
  if (o.attn.alibi_bias_max != 8.0) why.push_back(fmt::format("attn_config.alibi_bias_max {}", o.attn.alibi_bias_max));
  if (o.ffn_hidden() != 4 * o.d_model) why.push_back(fmt::format("an MLP of {} (not 4 d_model)", o.ffn_hidden()));
  if (!why.empty()) throw Error("hf", refusal(o, "transformers' MptForCausalLM (ALiBi, no biases)", why));
  return family_hf_format(model, dtype);
}

// transformers' GPT2LMHeadModel: learned positions, LayerNorms and Linears with biases (zeros where the MPT has
// none), the MLP's activation by its ACT2FN name (the tanh GELU as GPT-2's own "gelu_new"), Conv1D weights stored as
// (in, out), scores scaled by 1/sqrt(head_dim).
HfFormat mpt_as_gpt2(const MPTOptions& o, at::ScalarType dtype) {
  std::vector<std::string> why = blockers_for_any(o);
  if (o.attn.clip_qkv) why.push_back(fmt::format("attn_config.clip_qkv {}", *o.attn.clip_qkv));
  // scale_attn_weights: false (scores unscaled) is not an export target: transformers 4.57 honours it only with
  // attn_implementation eager, and its default SDPA path scales by 1/sqrt(head_dim) whatever the config says.
  const double default_scale = 1.0 / std::sqrt(static_cast<double>(o.head_dim()));
  const bool scaled = !o.attn.softmax_scale || *o.attn.softmax_scale == default_scale;
  if (!scaled) why.push_back(fmt::format("attn_config.softmax_scale {}", *o.attn.softmax_scale));
  if (!why.empty()) throw Error("hf", refusal(o, "transformers' GPT2LMHeadModel (learned positions)", why));
  const int64_t d = o.d_model, f_dim = o.ffn_hidden();
  HfFormat f;
  f.config = {{"architectures", {"GPT2LMHeadModel"}},
              {"model_type", "gpt2"},
              {"vocab_size", o.vocab_size},
              {"n_positions", o.max_seq_len},
              {"n_embd", d},
              {"n_layer", o.n_layers},
              {"n_head", o.n_heads},
              {"n_inner", f_dim},
              {"activation_function", o.ffn.ffn_act_fn == "gelu_pytorch_tanh" ? "gelu_new" : o.ffn.ffn_act_fn},
              {"resid_pdrop", o.resid_pdrop},
              {"embd_pdrop", o.emb_pdrop},
              {"attn_pdrop", o.attn.attn_pdrop},
              {"layer_norm_epsilon", o.norm_eps},
              {"initializer_range", 0.02},
              {"scale_attn_weights", true},
              {"scale_attn_by_inverse_layer_idx", false},
              {"reorder_and_upcast_attn", false},
              {"tie_word_embeddings", o.tie_word_embeddings},
              {"bos_token_id", nullptr},
              {"eos_token_id", nullptr},
              {"use_cache", true},
              {"torch_dtype", hf_torch_dtype(dtype)}};
  auto add = [&](const std::string& name, const std::string& param, std::vector<int64_t> shape, bool t = false) {
    f.tensors.push_back({name, param, t, std::move(shape)});
  };
  add("transformer.wte.weight", "transformer.wte.weight", {o.vocab_size, d});
  add("transformer.wpe.weight", o.learned_pos_emb ? "transformer.wpe.weight" : "", {o.max_seq_len, d});
  const bool norm_bias = o.norm_has_bias(), bias = !o.no_bias;
  auto norm = [&](const std::string& to, const std::string& from) {
    add(to + ".weight", from + ".weight", {d});
    add(to + ".bias", norm_bias ? from + ".bias" : "", {d});
  };
  for (int64_t i = 0; i < o.n_layers; ++i) {
    const std::string h = fmt::format("transformer.h.{}.", i), b = fmt::format("transformer.blocks.{}.", i);
    norm(h + "ln_1", b + "norm_1");
    add(h + "attn.c_attn.weight", b + "attn.Wqkv.weight", {d, 3 * d}, true);
    add(h + "attn.c_attn.bias", o.wqkv_bias() ? b + "attn.Wqkv.bias" : "", {3 * d});
    add(h + "attn.c_proj.weight", b + "attn.out_proj.weight", {d, d}, true);
    add(h + "attn.c_proj.bias", bias ? b + "attn.out_proj.bias" : "", {d});
    norm(h + "ln_2", b + "norm_2");
    add(h + "mlp.c_fc.weight", b + "ffn.up_proj.weight", {d, f_dim}, true);
    add(h + "mlp.c_fc.bias", bias ? b + "ffn.up_proj.bias" : "", {f_dim});
    add(h + "mlp.c_proj.weight", b + "ffn.down_proj.weight", {f_dim, d}, true);
    add(h + "mlp.c_proj.bias", bias ? b + "ffn.down_proj.bias" : "", {d});
  }
  norm("transformer.ln_f", "transformer.norm_f");
  if (!o.tie_word_embeddings) add("lm_head.weight", "lm_head.weight", {o.vocab_size, d});
  return f;
}

}  // namespace

HfFormat mpt_hf_format(const MPTOptions& o, at::ScalarType dtype, const CausalLM& model) {
  if (o.hf_layout == "dbrx") {
    // DbrxForCausalLM: MPT's modules under DBRX's names (the attention and its norms inside norm_attn_norm).
    HfFormat f;
    f.config = dbrx_hf_config(o, dtype);
    for (const auto& p : model.named_parameters()) {
      std::string name = p.key();
      for (const char* inner : {".norm_1.", ".attn.", ".norm_2."}) {
        const size_t at = name.find(inner);
        if (name.rfind("transformer.blocks.", 0) == 0 && at != std::string::npos) {
          name.insert(at, ".norm_attn_norm");
          break;
        }
      }
      f.tensors.push_back({name, p.key(), false, p.value().sizes().vec()});
    }
    return f;
  }
  if (o.attn.alibi) return mpt_as_transformers_mpt(o, dtype, model);
  if (o.attn.rope)
    throw Error("hf", refusal(o, "no transformers architecture with MPT's layout", {"attn_config.rope"}));
  return mpt_as_gpt2(o, dtype);
}

MPTOptions mpt_options_from_dbrx_config(const nlohmann::json& raw, const std::string& where) {
  auto fail = [&](const std::string& why) {
    throw Error("hf", fmt::format("{}: a DBRX config Tessera cannot read exactly: {}", where, why));
  };
  // DbrxConfig's keys; transformers derives num_key_value_heads (kv_n_heads) and ffn_config.hidden_size (d_model)
  // itself, and its DBRX weighs the router loss by moe_loss_weight, not router_aux_loss_coef.
  const nlohmann::json c = hf_config_v4(raw, where);
  refuse_unread_hf_keys(
      c,
      {"model_type", "d_model", "n_heads", "n_layers", "max_seq_len", "vocab_size", "resid_pdrop", "emb_pdrop",
       "initializer_range", "attn_config", "ffn_config", "output_router_logits", "tie_word_embeddings"},
      {"num_key_value_heads", "router_aux_loss_coef"}, where, "dbrx");
  if (c.contains("attn_config")) {
    refuse_unread_hf_keys(c["attn_config"], {"attn_pdrop", "clip_qkv", "kv_n_heads", "rope_theta"},
                          {"tie_word_embeddings"}, where, "dbrx", "attn_config.");
  }
  if (c.contains("ffn_config")) {
    refuse_unread_hf_keys(c["ffn_config"],
                          {"ffn_act_fn", "ffn_hidden_size", "moe_jitter_eps", "moe_loss_weight",
                           "moe_normalize_expert_weights", "moe_num_experts", "moe_top_k"},
                          {"hidden_size", "tie_word_embeddings"}, where, "dbrx", "ffn_config.");
  }
  const nlohmann::json attn = c.value("attn_config", nlohmann::json::object());
  const nlohmann::json ffn = c.value("ffn_config", nlohmann::json::object());
  auto number = [](const nlohmann::json& j, const char* key, double fallback) {
    return j.contains(key) && j[key].is_number() ? j[key].get<double>() : fallback;
  };
  auto integer = [](const nlohmann::json& j, const char* key, int64_t fallback) {
    return j.contains(key) && j[key].is_number_integer() ? j[key].get<int64_t>() : fallback;
  };
  auto optional = [](const nlohmann::json& j, const char* key, std::optional<double> fallback) {
    if (!j.contains(key)) return fallback;
    return j[key].is_number() ? std::optional<double>(j[key].get<double>()) : std::nullopt;
  };
  if (c.value("tie_word_embeddings", false)) fail("tie_word_embeddings is true (DBRX's head is untied)");
  MPTOptions o;  // DbrxConfig's defaults
  o.hf_layout = "dbrx";
  o.d_model = integer(c, "d_model", 2048);
  o.n_heads = integer(c, "n_heads", 16);
  o.n_layers = integer(c, "n_layers", 24);
  o.max_seq_len = integer(c, "max_seq_len", 2048);
  o.vocab_size = integer(c, "vocab_size", 32000);
  o.resid_pdrop = number(c, "resid_pdrop", 0.0);
  o.emb_pdrop = number(c, "emb_pdrop", 0.0);
  o.initializer_range = number(c, "initializer_range", 0.02);
  if (o.n_heads <= 0 || o.d_model % o.n_heads != 0) fail("d_model is not a multiple of n_heads");
  o.no_bias = true;
  o.norm_type = NormType::kLayerNorm;  // nn.LayerNorm(d_model, bias=False), eps 1e-5
  o.norm_eps = 1e-5;
  o.learned_pos_emb = false;
  o.tie_word_embeddings = false;
  o.attn.attn_pdrop = number(attn, "attn_pdrop", 0.0);
  o.attn.clip_qkv = optional(attn, "clip_qkv", std::nullopt);
  o.attn.kv_n_heads = integer(attn, "kv_n_heads", 1);
  if (o.attn.kv_n_heads <= 0 || o.n_heads % o.attn.kv_n_heads != 0)
    fail("attn_config.kv_n_heads does not divide n_heads");
  o.attn.attn_type = o.attn.kv_n_heads == o.n_heads ? "multihead_attention"
                     : o.attn.kv_n_heads == 1       ? "multiquery_attention"
                                                    : "grouped_query_attention";
  o.attn.rope = true;
  o.attn.rope_theta = number(attn, "rope_theta", 10000.0);
  o.attn.attn_impl = "torch";
  o.ffn.ffn_hidden_size = integer(ffn, "ffn_hidden_size", 3584);
  o.expansion_ratio = static_cast<double>(*o.ffn.ffn_hidden_size) / static_cast<double>(o.d_model);
  std::string act = "silu";
  if (ffn.contains("ffn_act_fn") && ffn["ffn_act_fn"].is_object()) act = ffn["ffn_act_fn"].value("name", "silu");
  if (!is_hf_activation(act)) fail(fmt::format("ffn_config.ffn_act_fn {}", act));
  o.ffn.ffn_act_fn = act;
  MoEFfnOptions m;
  m.ffn_type = "torch_dmoe";
  m.glu = true;
  m.num_experts = integer(ffn, "moe_num_experts", 4);
  m.top_k = integer(ffn, "moe_top_k", 1);
  if (m.top_k < 1 || m.top_k > m.num_experts) fail("ffn_config.moe_top_k is not in [1, moe_num_experts]");
  m.jitter_eps = optional(ffn, "moe_jitter_eps", std::nullopt);
  m.normalize_expert_weights = optional(ffn, "moe_normalize_expert_weights", 1.0);
  m.loss_weight = number(ffn, "moe_loss_weight", 0.01);
  m.output_router_logits = c.value("output_router_logits", false);
  o.ffn.moe = m;
  o.init_device = "cpu";
  return o;
}

nlohmann::ordered_json dbrx_hf_config(const MPTOptions& o, at::ScalarType dtype) {
  const MoEFfnOptions& m = o.ffn.moe.value();
  auto optional = [](const std::optional<double>& v) {
    return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json();
  };
  return {{"architectures", {"DbrxForCausalLM"}},
          {"model_type", "dbrx"},
          {"d_model", o.d_model},
          {"n_heads", o.n_heads},
          {"n_layers", o.n_layers},
          {"max_seq_len", o.max_seq_len},
          {"vocab_size", o.vocab_size},
          {"resid_pdrop", o.resid_pdrop},
          {"emb_pdrop", o.emb_pdrop},
          {"attn_config",
           {{"attn_pdrop", o.attn.attn_pdrop},
            {"clip_qkv", optional(o.attn.clip_qkv)},
            {"kv_n_heads", o.attn.kv_n_heads},
            {"rope_theta", o.attn.rope_theta}}},
          {"ffn_config",
           {{"ffn_act_fn", {{"name", o.ffn.ffn_act_fn}}},
            {"ffn_hidden_size", o.ffn_hidden()},
            {"moe_jitter_eps", optional(m.jitter_eps)},
            {"moe_loss_weight", m.loss_weight},
            {"moe_normalize_expert_weights", optional(m.normalize_expert_weights)},
            {"moe_num_experts", m.num_experts},
            {"moe_top_k", m.top_k}}},
          {"initializer_range", o.initializer_range},
          {"output_router_logits", m.output_router_logits},
          {"tie_word_embeddings", false},
          {"use_cache", true},
          {"torch_dtype", hf_torch_dtype(dtype)}};
}

MPTOptions mpt_options_from_gpt2_config(const nlohmann::json& raw, const std::string& where) {
  auto fail = [&](const std::string& why) {
    throw Error("hf", fmt::format("{}: a GPT-2 config Tessera cannot read exactly: {}", where, why));
  };
  // GPT2Config's keys (n_ctx is an old copy of n_positions that transformers no longer reads). Its aliases
  // (hidden_size for n_embd, ...) are refused: Tessera reads the fields' own names.
  const nlohmann::json c = hf_config_v4(raw, where);
  refuse_unread_hf_keys(
      c,
      {"model_type", "n_embd", "n_head", "n_layer", "vocab_size", "n_positions", "n_inner", "resid_pdrop", "embd_pdrop",
       "attn_pdrop", "layer_norm_epsilon", "activation_function", "tie_word_embeddings",
       "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "scale_attn_weights", "add_cross_attention"},
      {"n_ctx"}, where, "gpt2");
  auto get_int = [&](const char* key, std::optional<int64_t> fallback = std::nullopt) -> int64_t {
    if (c.contains(key) && c[key].is_number_integer()) return c[key].get<int64_t>();
    if (!fallback) fail(fmt::format("{} is missing or not an integer", key));
    return *fallback;
  };
  auto get_double = [&](const char* key, double fallback) {
    return c.contains(key) && c[key].is_number() ? c[key].get<double>() : fallback;
  };
  const std::string act = c.value("activation_function", "gelu_new");
  if (!is_hf_activation(act)) {
    fail(fmt::format("activation_function \"{}\" (Tessera computes {})", act, fmt::join(hf_activation_names(), ", ")));
  }
  // Published GPT-2 checkpoints set none of these. transformers 4.57 computes them only with attn_implementation
  // eager (per-layer score scaling; under autocast, scores in float32; unscaled scores) and ignores them on its
  // default SDPA path, so a folder with them has no one function to match.
  for (const char* key : {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"}) {
    if (c.value(key, false)) {
      fail(
          fmt::format("{} is true (transformers computes it only with attn_implementation eager, and ignores it on "
                      "its default SDPA path)",
                      key));
    }
  }
  if (!c.value("scale_attn_weights", true)) {
    fail(
        "scale_attn_weights is false (transformers leaves scores unscaled only with attn_implementation eager; its "
        "default SDPA path scales them by 1/sqrt(head_dim))");
  }
  if (c.value("add_cross_attention", false)) fail("add_cross_attention is true");
  MPTOptions o;
  o.d_model = get_int("n_embd", 768);
  o.n_heads = get_int("n_head", 12);
  o.n_layers = get_int("n_layer", 12);
  o.vocab_size = get_int("vocab_size", 50257);
  o.max_seq_len = get_int("n_positions", 1024);
  o.ffn.ffn_hidden_size =
      c.contains("n_inner") && c["n_inner"].is_number_integer() ? c["n_inner"].get<int64_t>() : 4 * o.d_model;
  o.expansion_ratio = static_cast<double>(*o.ffn.ffn_hidden_size) / static_cast<double>(o.d_model);
  if (o.n_heads <= 0 || o.d_model % o.n_heads != 0) fail("n_embd is not a multiple of n_head");
  o.resid_pdrop = get_double("resid_pdrop", 0.1);
  o.emb_pdrop = get_double("embd_pdrop", 0.1);
  o.attn.attn_pdrop = get_double("attn_pdrop", 0.1);
  o.norm_eps = get_double("layer_norm_epsilon", 1e-5);
  o.norm_type = NormType::kLayerNorm;
  o.ffn.ffn_act_fn = act;
  o.learned_pos_emb = true;
  o.no_bias = false;
  o.tie_word_embeddings = c.value("tie_word_embeddings", true);
  o.attn.attn_type = "multihead_attention";
  o.attn.kv_n_heads = o.n_heads;
  o.attn.attn_impl = "torch";
  o.init_device = "cpu";
  return o;
}

}  // namespace tessera::models
