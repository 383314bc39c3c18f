// The model protocol: what everything outside models/ -- the trainer, the sharding engine, activation checkpointing,
// ICL evaluation, generation, checkpoints and HF export, the surgery algorithms and the monitors -- sees of a causal
// language model. Every family under src/models/ implements it; research code implements it for its own model and
// registers a builder under a `model.name` (model_registry() below), and then trains it from a recipe like any built-in
// family.
//
// A CausalLM is a torch::nn::Module whose parameter names are its checkpoint keys. It knows nothing about ranks or
// shards: the sharding engine wraps its units from outside through a UnitRunner. Not thread-safe.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <nlohmann/json_fwd.hpp>

#include <any>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/config/registry.h"
#include "tessera/data/batch.h"
#include "tessera/models/context_parallel.h"
#include "tessera/models/loss.h"
#include "tessera/models/metric.h"

namespace tessera::models {

// Keys and values of one layer: (B, kv_heads, T, head_dim).
struct LayerCache {
  at::Tensor key;
  at::Tensor value;
  // A linear-attention layer's instead (Qwen3.5's Gated DeltaNet): its convolution's last inputs and its recurrent
  // state.
  at::Tensor conv_state;
  at::Tensor recurrent_state;
};

// Keys and values of every layer for incremental decoding, plus the key padding mask seen so far.
struct KVCache {
  std::vector<LayerCache> layers;
  at::Tensor attention_mask;  // (B, length) bool, true = real token; undefined when no mask was given
  int64_t length = 0;         // positions cached
};

struct ForwardOptions {
  std::optional<at::Tensor> attention_mask;  // (B, S) bool/int, true or 1 = token, false or 0 = padding
  std::optional<at::Tensor> sequence_id;     // (B, S) int64: packed-document ids (attention and positions reset)
  KVCache* cache = nullptr;                  // incremental decoding: reads and extends the cache
  bool reference_attention = false;          // explicit softmax path instead of SDPA (for tests)
  // Context parallelism (context_parallel.h): the forward runs on this shard's positions of the whole sequence `ids`
  // and returns their logits only (B, S / C, V). Training only: no cache.
  std::shared_ptr<const ContextShard> context;
};

// Extension point for code that wraps parts of the forward pass: the sharding engine gathers a unit's parameters
// around each call, and re-runs the call in backward under activation checkpointing (so `fn` must capture by value
// and be repeatable). Without a runner, fn(x) runs directly.
class UnitRunner {
 public:
  virtual ~UnitRunner() = default;
  virtual at::Tensor run(int64_t unit, const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& x) = 0;
};

// fn(x) through `runner` when there is one.
inline at::Tensor run_unit(const std::shared_ptr<UnitRunner>& runner, int64_t unit,
                           const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& x) {
  return runner ? runner->run(unit, fn, x) : fn(x);
}

// One tensor of a Hugging Face folder: its name there, the model parameter it holds and how.
struct HfTensor {
  std::string name;            // in the folder ("transformer.h.0.attn.c_attn.weight")
  std::string param;           // the model's parameter (a named_parameters() key); empty: zeros (a bias the model
                               // does not have, which the HF architecture always has)
  bool transpose = false;      // stored transposed (GPT-2's Conv1D keeps weights as (in, out))
  std::vector<int64_t> shape;  // as stored
};

// A model as a folder that transformers' AutoModelForCausalLM loads as the same function: config.json (its
// model_type picks transformers' class) and every stored tensor, in file order.
struct HfFormat {
  nlohmann::ordered_json config;
  std::vector<HfTensor> tensors;
};

class CausalLM : public torch::nn::Module {
 public:
  // input_ids: (B, S) int64 -> logits (B, S, vocab_size()).
  virtual at::Tensor forward(const at::Tensor& input_ids, const ForwardOptions& options = {}) = 0;

  // --- Units: the ordered pieces the sharding engine wraps (and activation checkpointing re-runs), numbered
  // 0 .. num_units() - 1. Unit 0 is the root (what runs outside the blocks: embeddings, final norm, head); every
  // forward call of a unit goes through the runner set here.
  virtual int64_t num_units() const = 0;
  // The unit that owns parameter `name` (a key of named_parameters()).
  virtual int64_t unit_of_parameter(const std::string& name) const = 0;
  virtual void set_unit_runner(std::shared_ptr<UnitRunner> runner) = 0;

  // --- Initialisation. Initialises the parameters of the modules `select` accepts (by module name; all when null)
  // from `seed`, each module from its own generator, so initialising one unit at a time (a sharded build from `meta`)
  // gives exactly the values of a whole-model init.
  virtual void init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select = nullptr) = 0;
  // A new model of this architecture (the family's own options, surgery such as ALiBi or low-precision norms
  // included; attached adapters not) on `device` ("cpu", "cuda:0", "meta"), initialised from `seed` when one is
  // given (and the device is not meta), else allocated only. The weights are not copied.
  virtual std::shared_ptr<CausalLM> rebuild(const std::string& device, std::optional<uint64_t> seed) const = 0;

  // --- Size and cost (also on `meta`).
  int64_t num_params() const;  // every parameter element, tied ones once
  // Training FLOPs per token at sequence length `seq_len` (6 N + the attention term), for MFU and plans.
  virtual double flops_per_token(int64_t seq_len) const = 0;
  // Activation bytes of one forward+backward on `batch` sequences of `seq_len` tokens stored in `bytes_per_value`;
  // nullopt when the model does not estimate it.
  virtual std::optional<double> activation_bytes(int64_t batch, int64_t seq_len, int bytes_per_value,
                                                 bool activation_checkpointing) const;
  // Parameters of the largest unit (what FULL_SHARD holds gathered at once); default: counted over the units.
  virtual int64_t largest_unit_params() const;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t max_seq_len() const = 0;
  // One line for plans and logs ("mpt_causal_lm: d_model 768, ...").
  virtual std::string describe() const;

  // --- Hugging Face interop. The family's model_type ("mpt"), and its own config.json of this model (torch_dtype
  // `dtype`): the description checkpoints store and build_from_hf_config() reads back, in the family's layout
  // (parameter names as checkpoint keys). A model without an HF format throws Error saying so (the default).
  virtual std::string family() const = 0;
  virtual bool has_hf_format() const { return false; }
  virtual nlohmann::ordered_json hf_config(at::ScalarType dtype) const;
  // The folder transformers' AutoModelForCausalLM loads as exactly this model's function (what exports write; it
  // may be another transformers architecture than the family's, e.g. GPT-2 for an MPT with learned positions). Throws
  // Error saying why and what to do when no transformers architecture computes the same function. The default: the
  // family's own config and parameter names, for families whose layout is transformers'.
  virtual HfFormat hf_format(at::ScalarType dtype) const;
  // For a model whose head reuses the input embedding: the embedding's parameter name, which HF folders may store
  // under "lm_head.weight" instead. nullopt (the default) for untied heads.
  virtual std::optional<std::string> tied_embedding_name() const { return std::nullopt; }

  // --- Decoding. True when a KV cache of `past` positions cannot serve the next call, which brings each row to
  // `total` positions: generate() then drops the cache and runs the whole sequence again (as transformers' Phi-3
  // does when longrope switches from its short to its long factors). Default: never.
  virtual bool kv_cache_stale(int64_t past, int64_t total) const { return false; }

  // --- Objective and metrics (Composer's ComposerModel.loss and get_metrics). The training loss of `logits` (this
  // model's forward on batch.input_ids) on `batch`, summed over its loss tokens (models/loss.h); default: next-token
  // cross-entropy. A recipe's `loss:` section takes precedence. The model's own evaluation metrics, beside
  // LanguageCrossEntropy and the recipe's `metrics:` (default: none).
  virtual at::Tensor loss(const at::Tensor& logits, const data::TokenBatch& batch) const;
  virtual std::vector<std::shared_ptr<const EvalMetric>> eval_metrics() const { return {}; }

  // --- Optional parts (capabilities.h): a mixture of experts' auxiliary losses and routing (MixtureOfExpertsModel),
  // surgery (AlibiSurgery, LowPrecisionNormsModel).
  // --- Tensor parallelism: a family that supports it implements models::TensorParallelModel (models/parallel_plan.h)
  // beside this protocol, and the sharding engine applies its plan from outside.
  // --- Context parallelism (models/context_parallel.h): whether the forward honours ForwardOptions::context (the
  // families whose decoder layers take AttentionInputs, apply context_parallel_inputs() and have no per-token
  // auxiliary losses). False by default.
  virtual bool supports_context_parallel() const { return false; }
};

// config.json's torch_dtype for `dtype`: "bfloat16", "float16" or "float32".
const char* hf_torch_dtype(at::ScalarType dtype);

// The family's own layout of `model` (hf_config() and its parameter names, sorted): what CausalLM::hf_format()
// returns by default, and what LLM Foundry's own classes load for an MPT.
HfFormat family_hf_format(const CausalLM& model, at::ScalarType dtype);

// What a recipe's `model:` section parsed into: the family's own options (type-erased), and what the trainer needs
// to know before building.
struct ModelOptions {
  std::string name;                 // the registered name (`model.name`)
  std::any options;                 // the registered parser's own Options struct
  int64_t max_seq_len = 0;          // the longest sequence the model takes
  std::string init_device = "cpu";  // "cpu" | "cuda" | "meta" (deferred: built unit by unit when sharded)
  // A Hugging Face folder whose weights the run starts from when there is no checkpoint to resume and no load_path
  // (hf_causal_lm with pretrained: true).
  std::optional<std::string> pretrained_weights;
};

// `model.name` -> parse the section, build on a device ("cpu", "cuda:0", "meta") from a seed. Built in: each family's
// recipe names (src/models/<family>/family.cpp; docs/models.md lists them), and hf_causal_lm (a Hugging Face folder or
// cached hub id of any registered model_type). Research code adds its own entries before building a Trainer.
using ModelRegistry = config::Registry<ModelOptions, std::shared_ptr<CausalLM>, const std::string&, uint64_t>;
ModelRegistry& model_registry();

// config.json model_type -> the family that reads it: builds the model a config.json describes (`where` names the
// file in messages) on `device`, initialised from `seed` when one is given, else allocated only (for weights read
// next). Every HF folder and every checkpoint (whose metadata.json stores the model's hf_config()) is rebuilt through
// it: `hf_causal_lm`, `load_path`, and the eval, convert and generate tools. A family registers its model_types
// beside its `model.name`; research code registers its own family's (its hf_config()'s model_type) the same way.
using HfConfigBuilder = std::function<std::shared_ptr<CausalLM>(
    const nlohmann::json& config, const std::string& where, const std::string& device, std::optional<uint64_t> seed)>;

// What a Hugging Face folder of one model_type stores besides its parameters under their own names: the facts that
// reading such a folder needs (checkpoint/hf.h), declared by the family that registers the model_type.
struct HfAdapter {
  // The name under which a folder may store a head tied to the input embedding.
  std::string tied_head = "lm_head.weight";
  // Name suffixes of buffers that older transformers versions saved beside the weights (causal masks, rotary tables)
  // and no current class reads: neither parameters nor unexpected.
  std::vector<std::string> dropped_buffers{};
  // A multimodal model_type's folders (transformers' *ForConditionalGeneration) hold a text model of another
  // model_type, `text_model_type`, whose parameter names beginning with `text_prefix.first` are stored beginning with
  // `text_prefix.second` ("model." as "model.language_model."), beside tensors under `ignored_prefixes` (a vision
  // tower, multi-token-prediction heads) that loading leaves aside, as transformers' AutoModelForCausalLM does.
  std::string text_model_type{};
  std::pair<std::string, std::string> text_prefix{};
  std::vector<std::string> ignored_prefixes{};
  bool drops(const std::string& name) const;                // a dropped buffer, or under an ignored prefix
  std::string stored_name(const std::string& param) const;  // `param` as such a folder stores it
};

class HfModelTypeRegistry {
 public:
  // Registers (or replaces) the builder of `model_type`, and its folders' layout.
  void add(const std::string& model_type, HfConfigBuilder build, HfAdapter adapter = {});
  bool contains(const std::string& model_type) const;
  std::vector<std::string> model_types() const;  // sorted
  // Throws tessera::Error naming `where` and the registered model_types for one no family reads.
  std::shared_ptr<CausalLM> build(const nlohmann::json& config, const std::string& where, const std::string& device,
                                  std::optional<uint64_t> seed) const;
  // The layout of `model_type`'s folders (the default one for a model_type no family registered).
  const HfAdapter& adapter(const std::string& model_type) const;

 private:
  struct Entry {
    HfConfigBuilder build;
    HfAdapter adapter;
  };
  std::map<std::string, Entry> entries_;
};

// Every model_type a built-in family registers (src/models/<family>/family.cpp), and research code's.
HfModelTypeRegistry& hf_model_type_registry();

// hf_model_type_registry().build(...).
std::shared_ptr<CausalLM> build_from_hf_config(const nlohmann::json& config, const std::string& where,
                                               const std::string& device, std::optional<uint64_t> seed = std::nullopt);

// Next-token loss: cross-entropy of logits[:, t] against labels[:, t + 1] over labels != ignore_index, their mean
// (at::Reduction::Mean) or sum (at::Reduction::Sum). Computed in fp32 on the logits as they are (no copy without
// the last position: the targets are shifted instead, with the last one ignored).
at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels, int64_t ignore_index = data::kIgnoreLabel,
                          at::Reduction::Reduction reduction = at::Reduction::Mean);
// The flattened (B * S) targets causal_lm_loss scores position t against: labels[:, t + 1], and ignore_index for the
// last position.
at::Tensor next_token_targets(const at::Tensor& labels, int64_t ignore_index = data::kIgnoreLabel);
// The same for a batch: its targets, flattened, when it has them (a context-parallel shard), else its labels'. Losses
// and metrics read targets through this, so that they score any shard of a sequence.
at::Tensor next_token_targets(const data::TokenBatch& batch);

}  // namespace tessera::models
