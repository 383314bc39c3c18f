// Building blocks every family shares: Linear, LayerNorm/RMSNorm (optionally low precision) and Embedding modules
// whose parameters are created directly with the requested TensorOptions, so a model can be built on the `meta` device
// (no memory) and materialised later by the sharding engine. Parameter names ("weight", "bias") are the HF ones.
// Not thread-safe (like every torch::nn::Module).
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/models/blocks/norm_type.h"

namespace tessera::models {

class LinearImpl;
class NormImpl;
class EmbeddingImpl;

// How a module runs once parallelism applied from outside the model changed it (models/parallel_plan.h: the sharding
// engine installs the styles of a family's plan, distributed/parallel_styles.h): the module's forward hands the call
// to its style. Model code neither sets nor names one.
class LinearStyle {
 public:
  virtual ~LinearStyle() = default;
  virtual at::Tensor forward(LinearImpl& layer, const at::Tensor& x) = 0;
};
class NormStyle {
 public:
  virtual ~NormStyle() = default;
  virtual at::Tensor forward(NormImpl& norm, const at::Tensor& x) = 0;
};
class EmbeddingStyle {
 public:
  virtual ~EmbeddingStyle() = default;
  virtual at::Tensor forward(EmbeddingImpl& embedding, const at::Tensor& ids) = 0;
  virtual at::Tensor attend(EmbeddingImpl& embedding, const at::Tensor& x) = 0;
};

// y = x W^T + b, W: (out_features, in_features).
class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in_features, int64_t out_features, bool bias, const at::TensorOptions& options);
  // local_forward(x), or through the style when one is installed.
  at::Tensor forward(const at::Tensor& x);
  // The layer on its own weights: x W^T + b (float8 GEMMs, the LoRA adapter's term).
  at::Tensor local_forward(const at::Tensor& x);
  std::shared_ptr<LinearStyle> style;

  int64_t in_features;
  int64_t out_features;
  at::Tensor weight;
  at::Tensor bias;  // undefined when absent
  // Set on attention out_proj and ffn down_proj: LLM Foundry divides their init by init_div_is_residual.
  bool is_residual = false;
  // The GEMMs in float8 (models/float8.h; precision: amp_fp8), set by apply_float8(). Weights stay as they are.
  bool float8 = false;
  // A LoRA adapter (algorithms::Lora), when attached: forward adds lora_scale * dropout(x) A^T B^T, with the
  // parameters "lora_A" (r, in_features) and "lora_B" (out_features, r). Undefined otherwise.
  void attach_lora(const at::Tensor& a, const at::Tensor& b, double scale, double dropout);
  void detach_lora();  // removes the adapter's parameters (after merging it, for instance)
  at::Tensor lora_A;
  at::Tensor lora_B;
  double lora_scale = 0;
  double lora_dropout = 0;
};
TORCH_MODULE(Linear);

// LayerNorm (weight, bias unless `bias` is false) or RMSNorm (weight only) over the last dimension. The
// low-precision variants run in the autocast dtype with autocast disabled, as LLM Foundry's LPLayerNorm does; without
// autocast they are the plain norms.
class NormImpl : public torch::nn::Module {
 public:
  NormImpl(int64_t size, NormType type, double eps, bool bias, const at::TensorOptions& options);
  // forward_with(x, weight, bias), or through the style when one is installed.
  at::Tensor forward(const at::Tensor& x);
  // The same norm with other tensors standing for weight and bias (what a style passes).
  at::Tensor forward_with(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);
  std::shared_ptr<NormStyle> style;

  int64_t size;
  NormType type;
  double eps;
  at::Tensor weight;
  at::Tensor bias;  // undefined for RMSNorm or without bias
};
TORCH_MODULE(Norm);

class EmbeddingImpl : public torch::nn::Module {
 public:
  EmbeddingImpl(int64_t num_embeddings, int64_t dim, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& ids);  // ids: (B, T) int64 -> (B, T, dim)
  // A head tied to this table: x (..., dim) -> x W^T (..., num_embeddings).
  at::Tensor attend(const at::Tensor& x);
  std::shared_ptr<EmbeddingStyle> style;

  at::Tensor weight;  // (num_embeddings, dim)
  // torch.nn.Embedding's padding_idx: that row gets no gradient (the row's value is used as stored); -1 = none.
  int64_t padding_idx = -1;
};
TORCH_MODULE(Embedding);

// ---- Activations ---------------------------------------------------------------------------------------------------

// The activations of transformers' ACT2FN this computes, by their config names ("gelu", "gelu_new", ...), each as
// transformers' module computes it (term by term where transformers writes it out).
const std::vector<std::string>& hf_activation_names();
bool is_hf_activation(const std::string& name);
// act(x) for one of hf_activation_names(); throws std::invalid_argument for any other name.
at::Tensor hf_activation(const std::string& name, const at::Tensor& x);

// ---- Initialisation helpers shared by the families' init_weights ---------------------------------------------------

// The seed of module `module_name`'s own generator under a whole-model init from `seed`: each module draws from its
// own generator, so initialising any subset of modules (one unit at a time, when a sharded model is built from
// `meta`) gives exactly the values of a whole-model init.
uint64_t module_seed(uint64_t seed, const std::string& module_name);

// Random fills from a CPU generator into a tensor on any device: drawn on the CPU and copied, so that a model built
// on a GPU gets exactly the weights it gets on the CPU (and a CUDA tensor cannot take a CPU generator).
void normal_from(at::Tensor w, double mean, double std, at::Generator& gen);
void uniform_from(at::Tensor w, double low, double high, at::Generator& gen);

// transformers' PreTrainedModel._init_weights over the Linear, Embedding and Norm modules of `model` that `select`
// accepts (by module name; all when null): weights normal(0, std) and biases 0, embeddings normal(0, std) with row
// `padding_row` (or the embedding's own padding_idx) zeroed, norms weight 1 and bias 0; each module from its own
// generator (module_seed).
void init_like_transformers(torch::nn::Module& model, uint64_t seed, double std,
                            const std::function<bool(const std::string&)>& select,
                            std::optional<int64_t> padding_row = std::nullopt);

}  // namespace tessera::models
