// Hugging Face folders: config.json + model.safetensors (or a sharded index), for any model family through the model
// protocol (models/causal_lm.h): config.json's model_type picks the family (mpt). Tessera loads folders written by HF
// transformers or LLM Foundry and writes folders that their from_pretrained loads.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>

#include "tessera/checkpoint/safetensors.h"
#include "tessera/models/causal_lm.h"
#include "tessera/models/mpt_config.h"

namespace tessera::checkpoint {

// Reads an MPT folder's <dir>/config.json into MPTOptions (LLM Foundry's field names; HF's layer_norm_epsilon is
// accepted, and HF's generic PretrainedConfig fields are ignored). Throws naming the file for a missing file, bad JSON,
// a model_type other than "mpt", or an invalid or unsupported architecture value.
models::MPTOptions read_hf_config(const std::string& dir);

// The config.json Tessera writes for `model` (the family's hf_config()); throws for a model without an HF format.
std::string hf_config_json(const models::CausalLM& model, at::ScalarType dtype);

struct LoadReport {
  std::vector<std::string> missing;     // model parameters not in the files (only when !strict)
  std::vector<std::string> unexpected;  // stored tensors the model does not have (only when !strict)
};

// Copies stored tensors into the model's parameters by name, converting dtype. With `strict`, a missing or unexpected
// tensor is an error naming it; a shape mismatch always is. A tied model accepts a stored lm_head.weight in place of
// its input embedding (tied_embedding_name(); HF may keep either copy of a tied pair).
LoadReport load_weights(models::CausalLM& model, const std::map<std::string, std::shared_ptr<SafetensorsFile>>& tensors,
                        bool strict = true);

// Builds a model from an HF folder: the family and architecture from config.json, then the weights (strict).
std::shared_ptr<models::CausalLM> load_hf_model(const std::string& dir);

// Writes config.json and the weights (in `dtype`, sharded above `max_shard_bytes`) into `dir`. Tied models store
// transformer.wte.weight only, as HF does.
void save_hf_model(models::CausalLM& model, const std::string& dir, at::ScalarType dtype = at::kFloat,
                   uint64_t max_shard_bytes = uint64_t{5} << 30);

// Builds a model from a Tessera checkpoint directory (checkpoint.h; any world size and strategy): the architecture
// from its "hf_config", the fp32 weights read (checksums verified) from its rank files. Throws naming the checkpoint
// for one without an HF config, or with weights that are not the plain model.
std::shared_ptr<models::CausalLM> load_checkpoint_model(const std::string& checkpoint_dir);

// Writes a Tessera checkpoint's model (checkpoint.h; any world size) as a Hugging Face folder: config.json (from the
// checkpoint's "hf_config") and model.safetensors in `dtype`, streamed one tensor at a time, so that no more than
// the largest tensor is in memory. The file appears complete or not at all. Throws naming the checkpoint for one
// without an HF config, or with weights that are not the plain model (LoRA adapters: merge them before saving).
void export_checkpoint_to_hf(const std::string& checkpoint_dir, const std::string& out_dir,
                             at::ScalarType dtype = at::kFloat);

}  // namespace tessera::checkpoint
