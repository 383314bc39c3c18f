// MPT's config.json in both directions (LLM Foundry's MPTConfig fields plus HF's aliases).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <set>
#include <string>

#include "tessera/config/reader.h"
#include "tessera/config/value.h"
#include "tessera/models/mpt.h"
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
      {"attn_pdrop", o.attn.attn_pdrop},
      {"attn_impl", "torch"},
      {"qk_ln", o.attn.qk_ln},
      {"qk_gn", o.attn.qk_gn},
      {"clip_qkv", o.attn.clip_qkv ? nlohmann::ordered_json(*o.attn.clip_qkv) : nlohmann::ordered_json()},
      {"softmax_scale",
       o.attn.softmax_scale ? nlohmann::ordered_json(*o.attn.softmax_scale) : nlohmann::ordered_json()},
      {"attn_uses_sequence_id", o.attn.attn_uses_sequence_id},
      {"sliding_window_size", o.attn.sliding_window_size},
      {"alibi", o.attn.alibi},
      {"alibi_bias_max", o.attn.alibi_bias_max},
      {"rope", o.attn.rope},
      {"rope_theta", o.attn.rope_theta},
      {"rope_impl", "dail"}};
  if (o.attn.attn_type == "grouped_query_attention") attn["kv_n_heads"] = o.attn.kv_n_heads;
  nlohmann::ordered_json ffn = {{"ffn_type", o.ffn.type == FfnType::kGLU ? "mptglu" : "mptmlp"}};
  if (o.ffn.ffn_hidden_size) ffn["ffn_hidden_size"] = *o.ffn.ffn_hidden_size;
  nlohmann::ordered_json init = {{"name", o.init.name},
                                 {"fan_mode", o.init.fan_mode},
                                 {"init_nonlinearity", o.init.init_nonlinearity},
                                 {"init_div_is_residual", o.init.init_div_is_residual},
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
      {"expansion_ratio", o.expansion_ratio},
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
      {"torch_dtype", dtype == at::kBFloat16 ? "bfloat16" : (dtype == at::kHalf ? "float16" : "float32")}};
  if (o.attention_bias) j["attention_bias"] = *o.attention_bias;
  return j;
}

}  // namespace tessera::models
