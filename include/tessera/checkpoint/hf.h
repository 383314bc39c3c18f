// Hugging Face folders: config.json + model.safetensors (or a sharded index), for any model family through the model
// protocol (models/causal_lm.h): config.json's model_type picks the family (models::hf_model_type_registry()). Tessera
// loads folders written by HF transformers or LLM Foundry and writes folders that their from_pretrained loads.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/checkpoint/safetensors.h"
#include "tessera/models/causal_lm.h"

namespace tessera::checkpoint {

// The config.json Tessera writes for `model` (the family's hf_config()); throws for a model without an HF format.
std::string hf_config_json(const models::CausalLM& model, at::ScalarType dtype);

// The weights of a Hugging Face folder as a model's parameters, read through memory maps one tensor at a time. The
// folder's config.json model_type picks the layout: the family's own (parameter names) when it is model.family(),
// else the model's transformers format (CausalLM::hf_format(), e.g. GPT-2 for an MPT with learned positions).
class HfWeights {
 public:
  // Throws naming the folder for a missing or invalid config.json or safetensors, or a model_type whose layout this
  // model does not have.
  HfWeights(const models::CausalLM& model, const std::string& dir);
  // Parameter `name` as stored, in the parameter's shape and the stored dtype (a view of the file, or a transposed
  // copy); nullopt when the folder lacks it. A tied model accepts a stored lm_head.weight for its embedding. Throws
  // naming file and tensor for a shape that does not fit.
  std::optional<at::Tensor> param(const std::string& name) const;
  // Stored tensors no parameter takes (a tied model's lm_head.weight and GPT-2's attention-mask buffers aside). Throws
  // naming the tensor when one that stands for a bias the model lacks is not all zeros.
  std::vector<std::string> unexpected() const;
  // After param(name) was copied: drops the stored tensor's pages from this process (SafetensorsFile::release).
  void release(const std::string& name) const;
  // The file holding stored tensor `name` (for messages); the folder when none does.
  std::string path_of(const std::string& name) const;
  const std::string& model_type() const { return model_type_; }

 private:
  struct Stored {  // where parameter `name` is stored
    const models::HfTensor* tensor;
    const SafetensorsFile* file;
    std::string name;
  };
  std::optional<Stored> locate(const std::string& name) const;

  std::string dir_;
  std::string model_type_;
  std::map<std::string, std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, models::HfTensor> by_param_;  // parameter -> its stored tensor
  std::vector<models::HfTensor> zeros_;               // stored tensors that must be zeros
  std::optional<std::string> tied_;
};

struct LoadReport {
  std::vector<std::string> missing;     // model parameters not in the files (only when !strict)
  std::vector<std::string> unexpected;  // stored tensors the model does not have (only when !strict)
};

// Copies the folder's weights into the model's parameters, converting dtype. With `strict`, a missing or unexpected
// tensor is an error naming it; a shape mismatch always is.
LoadReport load_weights(models::CausalLM& model, const HfWeights& weights, bool strict = true);

// Builds a model from an HF folder: the family and architecture from config.json, then the weights (strict).
std::shared_ptr<models::CausalLM> load_hf_model(const std::string& dir);

// Which layout an export writes: the one transformers' AutoModelForCausalLM loads as the same function
// (CausalLM::hf_format(); refused with a reason when there is none), or the family's own (LLM Foundry's MPT layout,
// which its MPT class loads).
enum class HfLayout { kTransformers, kFamily };

// Writes config.json and the weights (in `dtype`, sharded above `max_shard_bytes`) into `dir`, in `layout`. Tied
// models store the embedding only, as HF does. A layout the model has no form in throws before anything is written.
//
// Every export also writes generation_config.json (bos/eos/pad_token_id: config.json's, else the tokenizer's special
// tokens), and with `tokenizer` (a tokenizer.json, or a folder holding one: util::resolve_hf_tokenizer) copies its
// files (tokenizer.json, tokenizer_config.json, special_tokens_map.json, tokenizer.model, chat_template.jinja, those
// present; those absent are removed from `dir`), so that AutoTokenizer loads the folder. A lone tokenizer.json gets a
// tokenizer_config.json naming PreTrainedTokenizerFast. config.json is written last.
//
// `transformers_version` (4 or 5) picks the form of a transformers layout's config.json: 5 (the default) as
// transformers 5 writes it (the rotary settings in rope_parameters, dtype), which transformers 4 would read with its
// default rope base; 4 as transformers 4 writes it (rope_theta, rope_scaling, ...), which transformers 5 reads too.
void save_hf_model(models::CausalLM& model, const std::string& dir, at::ScalarType dtype = at::kFloat,
                   uint64_t max_shard_bytes = uint64_t{5} << 30, HfLayout layout = HfLayout::kTransformers,
                   const std::optional<std::filesystem::path>& tokenizer = std::nullopt, int transformers_version = 5);

// Builds a model from a Tessera checkpoint directory (checkpoint.h; any world size and strategy): the architecture
// from its "hf_config", the fp32 weights read (checksums verified) from its rank files. Throws naming the checkpoint
// for one without an HF config, or with weights that are not the plain model.
std::shared_ptr<models::CausalLM> load_checkpoint_model(const std::string& checkpoint_dir);

// What the tools' --model accepts: an HF folder (config.json), a Tessera checkpoint (metadata.json), a save folder
// (its newest valid checkpoint) or a hub id in the local Hugging Face cache. Errors name `tool` and the path.
std::shared_ptr<models::CausalLM> load_any_model(const std::string& path, const std::string& tool);

// Where such a path leads without reading any weight: the HF folder or Tessera checkpoint to read and the
// architecture (config.json, or the checkpoint's hf_config), e.g. to build the model on the meta device and load it
// sharded (callbacks::load_checkpoint reads both kinds).
struct ModelSource {
  std::string path;  // the HF folder or the checkpoint directory
  bool hf = true;    // an HF folder (else a Tessera checkpoint)
  nlohmann::json config;
  std::string config_file;  // where `config` was read, for messages
};
ModelSource resolve_model_source(const std::string& path, const std::string& tool);

// Writes a Tessera checkpoint's model (checkpoint.h; any world size) as a Hugging Face folder in `layout`: config.json
// and model.safetensors (or shards past `max_shard_bytes`, with HF's index) in `dtype`, streamed one tensor at a time,
// so that no more than the largest tensor is in memory. Each file appears complete or not at all, config.json last.
// Throws naming the checkpoint for one without an HF config, with weights that are not the plain model (LoRA
// adapters: merge them before saving), or a model with no form in `layout` (before writing anything).
// generation_config.json and `tokenizer` as in save_hf_model.
void export_checkpoint_to_hf(const std::string& checkpoint_dir, const std::string& out_dir,
                             at::ScalarType dtype = at::kFloat, HfLayout layout = HfLayout::kTransformers,
                             uint64_t max_shard_bytes = uint64_t{5} << 30,
                             const std::optional<std::filesystem::path>& tokenizer = std::nullopt,
                             int transformers_version = 5);

// The recipe's tokenizer.name stored in a checkpoint's metadata (the trainer's "config"), if any.
std::optional<std::string> checkpoint_tokenizer_name(const std::string& checkpoint_dir);

}  // namespace tessera::checkpoint
