// Evaluation metrics over the eval loader, an extension point (docs/api.md#metrics). The trainer always reports
// LanguageCrossEntropy and LanguagePerplexity; the model adds its own (CausalLM::eval_metrics) and a recipe's
// `metrics:` map adds registered ones:
//
//   metrics:
//     token_accuracy: {}      # built in: next-token top-1 accuracy over the loss tokens
//
// A metric accumulates a fixed number of sums per rank, batch by batch; the trainer adds them up over the ranks and
// computes the value once, so every rank reports the metric of the whole eval set. Each is logged as
// metrics/eval/<name()> and stored in state.eval_metrics["eval"].
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "tessera/config/component.h"
#include "tessera/data/batch.h"

namespace tessera::models {

class EvalMetric {
 public:
  virtual ~EvalMetric() = default;
  virtual std::string name() const = 0;  // "TokenAccuracy"
  virtual size_t num_sums() const = 0;
  // Adds the batch's share to `sums` (num_sums() values, zero at the start of an evaluation).
  virtual void update(const at::Tensor& logits, const data::TokenBatch& batch, double* sums) const = 0;
  // The metric from the sums over every batch of every rank.
  virtual double compute(const double* sums) const = 0;
};

// Next-token top-1 accuracy over the loss tokens (LLM Foundry's TokenAccuracy).
class TokenAccuracy : public EvalMetric {
 public:
  std::string name() const override { return "TokenAccuracy"; }
  size_t num_sums() const override { return 2; }  // correct, counted
  void update(const at::Tensor& logits, const data::TokenBatch& batch, double* sums) const override;
  double compute(const double* sums) const override { return sums[1] > 0 ? sums[0] / sums[1] : 0.0; }
};

// `metrics:` entries: name -> parse the options, build the metric. Built in: token_accuracy.
using MetricRegistry = config::ComponentRegistry<std::shared_ptr<const EvalMetric>>;
MetricRegistry& metric_registry();

}  // namespace tessera::models
