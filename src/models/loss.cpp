#include "tessera/models/loss.h"

#include <fmt/format.h>

#include "tessera/models/causal_lm.h"

namespace tessera::models {

at::Tensor CrossEntropyLoss::sum(const at::Tensor& logits, const data::TokenBatch& batch) const {
  const at::Tensor flat = logits.to(at::kFloat).reshape({-1, logits.size(2)});
  const at::Tensor targets = next_token_targets(batch);
  at::Tensor loss =
      at::cross_entropy_loss(flat, targets, {}, at::Reduction::Sum, data::kIgnoreLabel, o_.label_smoothing);
  if (o_.z_loss != 0.0) {
    // log Z = logsumexp over the vocabulary, squared, on the loss tokens only.
    const at::Tensor keep = targets.ne(data::kIgnoreLabel).to(at::kFloat);
    loss = loss + o_.z_loss * (at::logsumexp(flat, {-1}).pow(2) * keep).sum();
  }
  return loss;
}

LossRegistry& loss_registry() {
  static LossRegistry* r = [] {
    auto* reg = new LossRegistry("loss");
    reg->add(
        "cross_entropy",
        [](config::Section& s) {
          CrossEntropyOptions o;
          o.label_smoothing = s.get_double("label_smoothing", o.label_smoothing);
          s.check(o.label_smoothing >= 0 && o.label_smoothing < 1, "label_smoothing", "must be in [0, 1)");
          o.z_loss = s.get_double("z_loss", o.z_loss);
          s.check(o.z_loss >= 0, "z_loss", "must be non-negative");
          s.finish();
          return LossOptions{"cross_entropy", o};
        },
        [](const LossOptions& o) -> std::shared_ptr<const Loss> {
          return std::make_shared<CrossEntropyLoss>(std::any_cast<const CrossEntropyOptions&>(o.options));
        });
    return reg;
  }();
  return *r;
}

}  // namespace tessera::models
