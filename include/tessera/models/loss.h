// The training loss, an extension point (docs/api.md#losses). The trainer asks the model for its loss
// (CausalLM::loss, by default next-token cross-entropy); a recipe's `loss:` section replaces it with a registered
// one. A loss returns the SUM over the batch's loss tokens: the trainer divides by the tokens (or samples) it
// accumulates over, so gradient accumulation over microbatches and ranks stays exact.
//
//   loss:
//     name: cross_entropy     # built in
//     label_smoothing: 0.1    # torch's label smoothing, in [0, 1)
//     z_loss: 1.0e-4          # PaLM's z-loss: + z_loss * logsumexp(logits)^2 per loss token
//
// Research code registers its own before building a Trainer:
//
//   models::loss_registry().add("my_loss", parse_my_options, build_my_loss);
#pragma once

#include <ATen/ATen.h>

#include <any>
#include <memory>
#include <string>

#include "tessera/config/registry.h"
#include "tessera/data/batch.h"

namespace tessera::models {

class Loss {
 public:
  virtual ~Loss() = default;
  // `logits` (B, S, V): the model's forward on batch.input_ids. Returns a scalar: the loss summed over the batch's
  // loss tokens (labels[:, 1:] that are not data::kIgnoreLabel), differentiable with respect to the logits.
  virtual at::Tensor sum(const at::Tensor& logits, const data::TokenBatch& batch) const = 0;
};

// Next-token cross-entropy, summed; with label smoothing (torch's definition) and PaLM's z-loss.
struct CrossEntropyOptions {
  double label_smoothing = 0.0;
  double z_loss = 0.0;
};

// Cross-entropy of `logits` (N, V), any floating dtype, against `targets` (N) int64, SUMMED over the rows whose target
// is not `ignore_index`: torch's cross_entropy (label smoothing as torch defines it) plus z_loss * logsumexp^2 per
// counted row. Computed in fp32 a chunk of rows at a time, forward and backward: the whole (N, V) fp32 log-softmax and
// gradient that `cross_entropy(logits.float())` keeps are never made; backward writes the gradient straight in the
// logits' dtype, recomputing each chunk's softmax (torch's own kernels: it equals the unchunked loss to rounding).
// `chunk_elements`: logits per chunk (0: 4 Mi on a CPU, 32 Mi on a GPU). No host synchronisation.
at::Tensor chunked_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, const CrossEntropyOptions& o = {},
                                 int64_t ignore_index = data::kIgnoreLabel, int64_t chunk_elements = 0);

class CrossEntropyLoss : public Loss {
 public:
  explicit CrossEntropyLoss(CrossEntropyOptions o = {}) : o_(o) {}
  at::Tensor sum(const at::Tensor& logits, const data::TokenBatch& batch) const override;
  const CrossEntropyOptions& options() const { return o_; }

 private:
  CrossEntropyOptions o_;
};

// A recipe's `loss:` section: the registered name and the parser's own options.
struct LossOptions {
  std::string name;
  std::any options;
};

// Built in: cross_entropy.
using LossRegistry = config::Registry<LossOptions, std::shared_ptr<const Loss>>;
LossRegistry& loss_registry();

}  // namespace tessera::models
