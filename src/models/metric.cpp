#include "tessera/models/metric.h"

#include "tessera/models/causal_lm.h"

namespace tessera::models {

void TokenAccuracy::update(const at::Tensor& logits, const data::TokenBatch& batch, double* sums) const {
  const at::Tensor targets = next_token_targets(batch);
  const at::Tensor keep = targets.ne(data::kIgnoreLabel);
  const at::Tensor predicted = logits.reshape({-1, logits.size(2)}).argmax(-1);
  sums[0] += static_cast<double>(predicted.eq(targets).logical_and(keep).sum().item<int64_t>());
  sums[1] += static_cast<double>(keep.sum().item<int64_t>());
}

MetricRegistry& metric_registry() {
  static MetricRegistry* r = [] {
    auto* reg = new MetricRegistry("metric");
    reg->add(
        "token_accuracy",
        [](config::Section& s) -> std::any {
          s.finish();
          return {};
        },
        [](const std::any& /*options*/) -> std::shared_ptr<const EvalMetric> {
          return std::make_shared<TokenAccuracy>();
        });
    return reg;
  }();
  return *r;
}

}  // namespace tessera::models
