// The model protocol's defaults, and the next-token loss.
#include "tessera/models/causal_lm.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>

#include "tessera/models/blocks/layers.h"
#include "tessera/models/capabilities.h"
#include "tessera/util/error.h"

namespace tessera::models {

int64_t CausalLM::num_params() const {
  int64_t n = 0;
  for (const at::Tensor& p : parameters()) n += p.numel();  // a tied weight is one parameter
  return n;
}

const char* hf_torch_dtype(at::ScalarType dtype) {
  return dtype == at::kBFloat16 ? "bfloat16" : (dtype == at::kHalf ? "float16" : "float32");
}

std::optional<double> CausalLM::activation_bytes(int64_t /*batch*/, int64_t /*seq_len*/, int /*bytes_per_value*/,
                                                 bool /*activation_checkpointing*/) const {
  return std::nullopt;
}

int64_t CausalLM::largest_unit_params() const {
  std::map<int64_t, int64_t> per_unit;
  for (const auto& item : named_parameters()) per_unit[unit_of_parameter(item.key())] += item.value().numel();
  int64_t largest = 0;
  for (const auto& [unit, n] : per_unit) largest = std::max(largest, n);
  return largest;
}

std::string CausalLM::describe() const {
  return fmt::format("{}: {} parameters, {} units, vocab {}", family(), num_params(), num_units(), vocab_size());
}

nlohmann::ordered_json CausalLM::hf_config(at::ScalarType /*dtype*/) const {
  throw Error("hf", fmt::format("model family \"{}\" has no Hugging Face format", family()));
}

HfFormat CausalLM::hf_format(at::ScalarType dtype) const {
  return family_hf_format(*this, dtype);
}

HfFormat family_hf_format(const CausalLM& model, at::ScalarType dtype) {
  HfFormat f;
  f.config = model.hf_config(dtype);
  for (const auto& item : model.named_parameters()) {
    f.tensors.push_back({item.key(), item.key(), false, item.value().sizes().vec()});
  }
  std::sort(f.tensors.begin(), f.tensors.end(), [](const HfTensor& a, const HfTensor& b) { return a.name < b.name; });
  return f;
}

int64_t active_params(const CausalLM& model) {
  const auto* moe = capability<MixtureOfExpertsModel>(model);
  return moe ? moe->num_active_params() : model.num_params();
}

void use_low_precision_norms(CausalLM& model) {
  int n = 0;
  for (const auto& item : model.named_modules()) {
    auto norm = std::dynamic_pointer_cast<NormImpl>(item.value());
    if (!norm) continue;
    if (norm->type == NormType::kLayerNorm) norm->type = NormType::kLowPrecisionLayerNorm;
    if (norm->type == NormType::kRMSNorm) norm->type = NormType::kLowPrecisionRMSNorm;
    ++n;
  }
  if (auto* keeps = capability<LowPrecisionNormsModel>(model)) keeps->record_low_precision_norms();
  spdlog::debug("low_precision_layernorm: {} norms in low precision", n);
}

at::Tensor next_token_targets(const at::Tensor& labels, int64_t ignore_index) {
  const int64_t b = labels.size(0), s = labels.size(1);
  // Position t is scored against labels[:, t + 1]; the last position has no target and is ignored. Scoring every
  // position of the contiguous logits avoids slicing them, which would copy (B*S, V) floats forward and scatter
  // them back in backward: the largest tensors of a small model's step. The ignored rows add nothing to the sum,
  // the count or the gradient.
  return at::cat({labels.narrow(1, 1, s - 1), at::full({b, 1}, ignore_index, labels.options())}, 1).reshape({-1});
}

at::Tensor next_token_targets(const data::TokenBatch& batch) {
  return batch.targets.defined() ? batch.targets.reshape({-1}) : next_token_targets(batch.labels);
}

at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels, int64_t ignore_index,
                          at::Reduction::Reduction reduction) {
  const at::Tensor targets = next_token_targets(labels, ignore_index);
  const at::Tensor sum = chunked_cross_entropy(logits.reshape({-1, logits.size(2)}), targets, {}, ignore_index);
  if (reduction == at::Reduction::Sum) return sum;
  TORCH_CHECK(reduction == at::Reduction::Mean, "causal_lm_loss: reduction must be Mean or Sum");
  return sum / targets.ne(ignore_index).sum();  // 0 / 0 = nan without loss tokens, as torch's mean
}

at::Tensor CausalLM::loss(const at::Tensor& logits, const data::TokenBatch& batch) const {
  return chunked_cross_entropy(logits.reshape({-1, logits.size(2)}), next_token_targets(batch));
}

}  // namespace tessera::models
