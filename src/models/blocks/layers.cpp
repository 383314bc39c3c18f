// Linear, Norm and Embedding modules with meta-device-friendly parameter creation, transformers' activations, and the
// initialisation helpers.
#include "tessera/models/blocks/layers.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "tessera/models/blocks/float8.h"

namespace tessera::models {
namespace {

// Disables autocast for one device type for the lifetime of the guard.
class AutocastOff {
 public:
  explicit AutocastOff(at::DeviceType device) : device_(device), was_(at::autocast::is_autocast_enabled(device)) {
    at::autocast::set_autocast_enabled(device_, false);
  }
  ~AutocastOff() { at::autocast::set_autocast_enabled(device_, was_); }
  AutocastOff(const AutocastOff&) = delete;
  AutocastOff& operator=(const AutocastOff&) = delete;

 private:
  at::DeviceType device_;
  bool was_;
};

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  // In fp32 (the residual stream under amp_bf16/amp_fp8), ATen's rms_norm: the same formula in the same dtype (on the
  // CPU the same operations, bitwise), which on a GPU is one fused kernel forward and one backward, saving each row's
  // rstd for backward where the formula's five operations keep (B, S, D) fp32 intermediates.
  if (x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat) {
    return at::rms_norm(x, {x.size(-1)}, weight, eps);
  }
  // LLM Foundry's rms_norm: x * rsqrt(mean(x^2) + eps) * weight, in the input dtype (ATen's would compute a bf16
  // input in fp32, which LLM Foundry's low-precision RMSNorm does not).
  at::Tensor out = x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (out * weight).to(x.scalar_type());
}

}  // namespace

LinearImpl::LinearImpl(int64_t in, int64_t out, bool with_bias, const at::TensorOptions& options)
    : in_features(in), out_features(out) {
  weight = register_parameter("weight", at::empty({out, in}, options));
  if (with_bias) bias = register_parameter("bias", at::zeros({out}, options));
}

void LinearImpl::attach_lora(const at::Tensor& a, const at::Tensor& b, double scale, double dropout) {
  lora_A = register_parameter("lora_A", a);
  lora_B = register_parameter("lora_B", b);
  lora_scale = scale;
  lora_dropout = dropout;
}

void LinearImpl::detach_lora() {
  parameters_.erase("lora_A");
  parameters_.erase("lora_B");
  lora_A = at::Tensor();
  lora_B = at::Tensor();
}

at::Tensor LinearImpl::forward(const at::Tensor& x) {
  return style ? style->forward(*this, x) : local_forward(x);
}

at::Tensor LinearImpl::local_forward(const at::Tensor& x) {
  at::Tensor y = float8 ? float8_linear(x, weight, bias) : at::linear(x, weight, bias);
  if (!lora_A.defined()) return y;
  const at::Tensor h = lora_dropout > 0 && is_training() ? at::dropout(x, lora_dropout, true) : x;
  return y + at::linear(at::linear(h, lora_A), lora_B) * lora_scale;
}

NormImpl::NormImpl(int64_t n, NormType t, double e, bool with_bias, const at::TensorOptions& options)
    : size(n), type(t), eps(e) {
  weight =
      register_parameter("weight", type == NormType::kOffsetRMSNorm ? at::zeros({n}, options) : at::ones({n}, options));
  const bool layer_norm =
      type == NormType::kLayerNorm || type == NormType::kLowPrecisionLayerNorm || type == NormType::kLayerNorm1P;
  if (layer_norm && with_bias) bias = register_parameter("bias", at::zeros({n}, options));
}

at::Tensor NormImpl::forward(const at::Tensor& x) {
  return style ? style->forward(*this, x) : forward_with(x, weight, bias);
}

at::Tensor NormImpl::forward_with(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  if (type == NormType::kOffsetRMSNorm) {  // Gemma's: in float32, scaled by (1 + weight)
    const at::Tensor f = x.to(at::kFloat);
    const at::Tensor normed = f * at::rsqrt(f.pow(2).mean(-1, /*keepdim=*/true) + eps);
    return (normed * (1.0 + w.to(at::kFloat))).to(x.scalar_type());
  }
  // Nemotron's LayerNorm1P scales by (1 + weight) and runs as the low-precision LayerNorm does.
  const at::Tensor scale = type == NormType::kLayerNorm1P ? w + 1.0 : w;
  const bool low_precision = type == NormType::kLowPrecisionLayerNorm || type == NormType::kLowPrecisionRMSNorm ||
                             type == NormType::kLayerNorm1P;
  const at::DeviceType device = x.device().type();
  if (low_precision && at::autocast::is_autocast_enabled(device)) {
    const at::ScalarType dtype = at::autocast::get_autocast_dtype(device);
    AutocastOff off(device);
    const at::Tensor xd = x.to(dtype), wd = scale.to(dtype);
    if (type == NormType::kLowPrecisionRMSNorm) return rms_norm(xd, wd, eps);
    return at::layer_norm(xd, {size}, wd, b.defined() ? b.to(dtype) : at::Tensor(), eps);
  }
  if (type == NormType::kRMSNorm || type == NormType::kLowPrecisionRMSNorm) return rms_norm(x, scale, eps);
  return at::layer_norm(x, {size}, scale, b, eps);
}

EmbeddingImpl::EmbeddingImpl(int64_t num_embeddings, int64_t dim, const at::TensorOptions& options) {
  weight = register_parameter("weight", at::empty({num_embeddings, dim}, options));
}

at::Tensor EmbeddingImpl::forward(const at::Tensor& ids) {
  return style ? style->forward(*this, ids) : at::embedding(weight, ids, padding_idx);
}

at::Tensor EmbeddingImpl::attend(const at::Tensor& x) {
  return style ? style->attend(*this, x) : at::linear(x, weight);
}

const std::vector<std::string>& hf_activation_names() {
  static const std::vector<std::string> kNames = {
      "gelu",       "gelu_10", "gelu_fast", "gelu_new",   "gelu_python", "gelu_pytorch_tanh",
      "leaky_relu", "linear",  "mish",      "quick_gelu", "relu",        "relu2",
      "relu6",      "sigmoid", "silu",      "swish",      "tanh"};
  return kNames;
}

bool is_hf_activation(const std::string& name) {
  const auto& names = hf_activation_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

at::Tensor hf_activation(const std::string& name, const at::Tensor& x) {
  if (name == "gelu" || name == "gelu_python") return at::gelu(x);
  if (name == "gelu_pytorch_tanh") return at::gelu(x, "tanh");
  if (name == "gelu_new") {  // NewGELUActivation
    return 0.5 * x * (1.0 + at::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * at::pow(x, 3.0))));
  }
  if (name == "gelu_fast") return 0.5 * x * (1.0 + at::tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)));
  if (name == "gelu_10") return at::clamp(at::gelu(x), -10, 10);
  if (name == "quick_gelu") return x * at::sigmoid(1.702 * x);
  if (name == "relu") return at::relu(x);
  if (name == "relu2") return at::square(at::relu(x));
  if (name == "relu6") return at::hardtanh(x, 0, 6);
  if (name == "leaky_relu") return at::leaky_relu(x, 0.01);
  if (name == "sigmoid") return at::sigmoid(x);
  if (name == "silu" || name == "swish") return at::silu(x);
  if (name == "tanh") return at::tanh(x);
  if (name == "mish") return at::mish(x);
  if (name == "linear") return x;
  throw std::invalid_argument("unknown activation \"" + name + "\"");
}

uint64_t module_seed(uint64_t seed, const std::string& module_name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the name, mixed with the seed (splitmix64's finaliser)
  for (const unsigned char c : module_name) h = (h ^ c) * 1099511628211ull;
  uint64_t z = h ^ (seed + 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void normal_from(at::Tensor w, double mean, double std, at::Generator& gen) {
  if (w.is_cpu()) {
    w.normal_(mean, std, gen);
    return;
  }
  at::Tensor t = at::empty(w.sizes(), w.options().device(at::kCPU));
  t.normal_(mean, std, gen);
  w.copy_(t);
}

void uniform_from(at::Tensor w, double low, double high, at::Generator& gen) {
  if (w.is_cpu()) {
    w.uniform_(low, high, gen);
    return;
  }
  at::Tensor t = at::empty(w.sizes(), w.options().device(at::kCPU));
  t.uniform_(low, high, gen);
  w.copy_(t);
}

void init_like_transformers(torch::nn::Module& model, uint64_t seed, double std,
                            const std::function<bool(const std::string&)>& select, std::optional<int64_t> padding_row) {
  at::NoGradGuard no_grad;
  for (const auto& item : model.named_modules()) {
    if (select && !select(item.key())) continue;
    torch::nn::Module& m = *item.value();
    if (m.parameters(/*recurse=*/false).empty()) continue;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(module_seed(seed, item.key()));
    if (auto* lin = m.as<LinearImpl>()) {
      normal_from(lin->weight, 0.0, std, gen);
      if (lin->bias.defined()) lin->bias.zero_();
    } else if (auto* emb = m.as<EmbeddingImpl>()) {
      normal_from(emb->weight, 0.0, std, gen);
      const int64_t row = emb->padding_idx >= 0 ? emb->padding_idx : padding_row.value_or(-1);
      if (row >= 0 && row < emb->weight.size(0)) emb->weight[row].zero_();
    } else if (auto* norm = m.as<NormImpl>()) {
      norm->weight.fill_(norm->type == NormType::kOffsetRMSNorm ? 0.0 : 1.0);
      if (norm->bias.defined()) norm->bias.zero_();
    }
  }
}

}  // namespace tessera::models
