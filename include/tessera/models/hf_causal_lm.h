// LLM Foundry's `model.name: hf_causal_lm`: a model described by a Hugging Face folder (a local path, or a hub id in
// the local Hugging Face cache, util/hf_hub.h), whose config.json model_type picks the family (hf_model_type_registry:
// llama, mistral, qwen2, falcon, mpt, gpt2, and what plug-ins register), with LLM Foundry's `config_overrides`
// applied, and whose weights start the run when `pretrained`.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "tessera/config/reader.h"

namespace tessera::models {

struct HfCausalLMOptions {
  std::string name_or_path;  // pretrained_model_name_or_path as written
  std::string folder;        // where it resolved
  nlohmann::json config;     // its config.json with config_overrides applied
  bool pretrained = true;    // start from the folder's weights (else the family's initialisation)
  std::string init_device = "cpu";
};

// Reads the `model:` section (LLM Foundry's keys: pretrained_model_name_or_path, pretrained, init_device,
// config_overrides; use_auth_token, trust_remote_code, use_flash_attention_2, attn_implementation and
// use_train_metrics accepted and ignored, as they do not change the function). Errors name the key and line.
HfCausalLMOptions parse_hf_causal_lm_options(config::Section& s);

// LLM Foundry's set_config_overrides on a config.json: each key must be in the config (or be one of the generic
// fields transformers leaves out when they have their default values: tie_word_embeddings, bos/eos/pad_token_id); a
// mapping value updates a mapping (its keys must exist there) or sets a null one. Returns the message of the first
// problem, or an empty string.
std::string apply_config_overrides(nlohmann::json& config, const nlohmann::json& overrides);

}  // namespace tessera::models
