// `hf_causal_lm`: models from Hugging Face folders and the local hub cache, as LLM Foundry names them.
#include "tessera/models/hf_causal_lm.h"

#include <fmt/format.h>

#include <fstream>
#include <set>

#include "tessera/config/value.h"
#include "tessera/models/family_support.h"
#include "tessera/util/error.h"
#include "tessera/util/hf_hub.h"

namespace tessera::models {

std::string apply_config_overrides(nlohmann::json& config, const nlohmann::json& overrides) {
  static const std::set<std::string> kGeneric = {"tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id"};
  if (!overrides.is_object()) return "must be a mapping of config.json keys to values";
  for (const auto& [key, value] : overrides.items()) {
    if (!config.contains(key) && !kGeneric.count(key)) {
      return fmt::format("config does not have attribute \"{}\" to override ({}: {})", key, key, value.dump());
    }
    nlohmann::json& attr = config[key];
    if (attr.is_object()) {
      if (!value.is_object()) return fmt::format("{}: expected a mapping, got {}", key, value.dump());
      for (const auto& [k, v] : value.items()) {
        if (!attr.contains(k)) return fmt::format("{}: unknown key \"{}\" (keys: {})", key, k, attr.dump());
        attr[k] = v;
      }
    } else {
      attr = value;
    }
  }
  return "";
}

HfCausalLMOptions parse_hf_causal_lm_options(config::Section& s) {
  HfCausalLMOptions o;
  o.name_or_path = s.require_string("pretrained_model_name_or_path");
  o.pretrained = s.get_bool("pretrained", true);
  // LLM Foundry's "mixed" (rank 0 on the CPU, the others on meta) is what `meta` does here: every rank reads its own
  // shard spans of the folder.
  o.init_device = s.get_choice("init_device", "cpu", {"cpu", "meta", "mixed", "cuda"});
  if (o.init_device == "mixed") o.init_device = "meta";
  // Accepted and ignored: credentials (nothing is downloaded), remote code (none is run), kernel choices.
  for (const char* key : {"use_auth_token", "trust_remote_code", "use_flash_attention_2", "use_train_metrics"}) {
    (void)s.raw(key);
  }
  (void)s.get_optional_string("attn_implementation");
  try {
    o.folder = util::resolve_hf_folder(o.name_or_path).string();
  } catch (const Error& e) {
    s.fail("pretrained_model_name_or_path", e.message());
  }
  const std::string config_path = o.folder + "/config.json";
  std::ifstream f(config_path);
  s.check(f.good(), "pretrained_model_name_or_path", fmt::format("{} does not exist", config_path));
  try {
    o.config = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    s.fail("pretrained_model_name_or_path", fmt::format("{}: not valid JSON: {}", config_path, e.what()));
  }
  if (const config::Value* overrides = s.raw("config_overrides"); overrides != nullptr && !overrides->is_null()) {
    // Overrides name transformers 4's keys (as LLM Foundry's recipes do: rope_theta, rope_scaling, ...), whichever
    // form the folder's config.json is in: a transformers 5 config (rope_parameters, dtype) is read into that form
    // first.
    try {
      o.config = hf_config_v4(o.config, config_path);
    } catch (const Error& e) {
      s.fail("pretrained_model_name_or_path", e.message());
    }
    const std::string problem = apply_config_overrides(o.config, overrides->to_json());
    s.check(problem.empty(), "config_overrides", problem);
  }
  s.finish({"pretrained_lora_id_or_path", "peft_config", "load_in_8bit", "allow_embedding_resizing",
            "additional_train_metrics", "additional_eval_metrics", "should_save_peft_only"});
  return o;
}

}  // namespace tessera::models
