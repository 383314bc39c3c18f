// Event names and classification.
#include "tessera/core/event.h"

#include <array>

namespace tessera::core {

std::string_view to_string(Event e) {
  static constexpr std::array<std::string_view, 31> kNames = {"init",
                                                              "before_load",
                                                              "after_load",
                                                              "fit_start",
                                                              "epoch_start",
                                                              "before_dataloader",
                                                              "after_dataloader",
                                                              "batch_start",
                                                              "before_train_batch",
                                                              "before_forward",
                                                              "after_forward",
                                                              "before_loss",
                                                              "after_loss",
                                                              "before_backward",
                                                              "after_backward",
                                                              "after_train_batch",
                                                              "batch_end",
                                                              "batch_checkpoint",
                                                              "epoch_end",
                                                              "epoch_checkpoint",
                                                              "fit_end",
                                                              "eval_before_all",
                                                              "eval_start",
                                                              "eval_batch_start",
                                                              "eval_before_forward",
                                                              "eval_after_forward",
                                                              "eval_batch_end",
                                                              "eval_end",
                                                              "eval_after_all",
                                                              "eval_standalone_start",
                                                              "eval_standalone_end"};
  return kNames.at(static_cast<size_t>(e));
}

bool is_after_event(Event e) {
  switch (e) {
    case Event::kAfterLoad:
    case Event::kAfterDataloader:
    case Event::kAfterForward:
    case Event::kAfterLoss:
    case Event::kAfterBackward:
    case Event::kAfterTrainBatch:
    case Event::kEvalAfterForward:
    case Event::kEvalAfterAll:
      return true;
    default:
      return false;
  }
}

bool is_eval_event(Event e) {
  return e >= Event::kEvalBeforeAll;
}

}  // namespace tessera::core
