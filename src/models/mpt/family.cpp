// The MPT family's entries: LLM Foundry's mpt_causal_lm and DBRX recipes, and the config.json model_types an MPT
// reads (its own, GPT-2's for an MPT with learned positions, DBRX's).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "models/mpt/mpt.h"
#include "tessera/models/family.h"
#include "tessera/util/error.h"

namespace tessera::models {

void register_family_mpt(FamilyRegistrar& r) {
  r.recipes.add(
      "mpt_causal_lm",
      [](config::Section& s) {
        const MPTOptions o = parse_mpt_options(s);
        return ModelOptions{"mpt_causal_lm", o, o.max_seq_len, o.init_device, {}};
      },
      [](const ModelOptions& m, const std::string& device, uint64_t seed) -> std::shared_ptr<CausalLM> {
        MPTOptions o = std::any_cast<const MPTOptions&>(m.options);
        o.init_device = device;
        return build_mpt(o, seed).ptr();
      });
  // DBRX: transformers' DbrxConfig keys (d_model, attn_config, ffn_config, ...), built as the MPT computing it.
  r.recipes.add(
      "dbrx",
      [](config::Section& s) {
        s.get_choice("model_type", "dbrx", {"dbrx"});
        nlohmann::json c = {{"model_type", "dbrx"}};
        int64_t expert_parallel = 1;
        for (const char* key : {"d_model", "n_heads", "n_layers", "max_seq_len", "vocab_size"}) {
          if (s.has(key)) c[key] = s.get_int(key, 0);
        }
        for (const char* key : {"resid_pdrop", "emb_pdrop", "initializer_range"}) {
          if (s.has(key)) c[key] = s.get_double(key, 0.0);
        }
        c["output_router_logits"] = s.get_bool("output_router_logits", false);
        c["tie_word_embeddings"] = s.get_bool("tie_word_embeddings", false);
        const std::string device = s.get_choice("init_device", "cpu", {"cpu", "meta", "cuda"});
        auto optional = [](config::Section& sec, const char* key, nlohmann::json& into) {
          if (!sec.has(key)) return;
          const auto v = sec.get_optional_double(key);
          into[key] = v ? nlohmann::json(*v) : nlohmann::json();
        };
        if (auto a = s.section("attn_config"); a.present()) {
          nlohmann::json j = nlohmann::json::object();
          if (a.has("kv_n_heads")) j["kv_n_heads"] = a.get_int("kv_n_heads", 1);
          for (const char* key : {"rope_theta", "attn_pdrop"}) {
            if (a.has(key)) j[key] = a.get_double(key, 0.0);
          }
          optional(a, "clip_qkv", j);
          a.finish();
          c["attn_config"] = j;
        }
        if (auto f = s.section("ffn_config"); f.present()) {
          nlohmann::json j = nlohmann::json::object();
          for (const char* key : {"ffn_hidden_size", "moe_num_experts", "moe_top_k"}) {
            if (f.has(key)) j[key] = f.get_int(key, 0);
          }
          if (f.has("moe_loss_weight")) j["moe_loss_weight"] = f.get_double("moe_loss_weight", 0.0);
          // LLM Foundry's expert-parallel degree (DBRX was trained with it): not a DbrxConfig key, applied below.
          expert_parallel = f.get_int("moe_world_size", 1);
          optional(f, "moe_jitter_eps", j);
          optional(f, "moe_normalize_expert_weights", j);
          if (auto act = f.section("ffn_act_fn"); act.present()) {
            j["ffn_act_fn"] = {{"name", act.get_string("name", "silu")}};
            act.finish();
          }
          f.finish();
          c["ffn_config"] = j;
        }
        s.finish();
        MPTOptions o;
        try {
          o = mpt_options_from_dbrx_config(c, s.key_path(""));
        } catch (const Error& e) {
          s.fail("d_model", e.message());
        }
        o.init_device = device;
        if (expert_parallel != 1) {
          const int64_t experts = o.ffn.moe->num_experts;
          if (expert_parallel < 1 || experts % expert_parallel != 0) {
            s.fail("ffn_config",
                   fmt::format("moe_world_size {} must divide moe_num_experts ({})", expert_parallel, experts));
          }
          o.ffn.moe->world_size = expert_parallel;
        }
        return ModelOptions{"dbrx", o, o.max_seq_len, o.init_device, {}};
      },
      [](const ModelOptions& m, const std::string& device, uint64_t seed) -> std::shared_ptr<CausalLM> {
        MPTOptions o = std::any_cast<const MPTOptions&>(m.options);
        o.init_device = device;
        return build_mpt(o, seed).ptr();
      });
  r.model_types.add("mpt", hf_builder(&mpt_options_from_hf_config, &build_mpt));
  // An MPT with learned positions; older transformers saved GPT-2's causal-mask buffers beside its weights.
  r.model_types.add("gpt2", hf_builder(&mpt_options_from_gpt2_config, &build_mpt),
                    HfAdapter{.dropped_buffers = {".attn.bias", ".attn.masked_bias"}});
  r.model_types.add("dbrx", hf_builder(&mpt_options_from_dbrx_config, &build_mpt));  // an MPT with DBRX's names
  // transformers 5: DBRX's rope_theta inside attn_config, and no scaling.
  r.config_forms["dbrx"] = {.rope = HfConfigForm::Rope{.theta_section = "attn_config", .scaling = false}};
}

}  // namespace tessera::models
