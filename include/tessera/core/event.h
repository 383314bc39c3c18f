// The training events, in Composer's order. Algorithms, callbacks and loggers run on them (see engine.h). The loop:
//
//   INIT                                   model built; algorithms do model surgery here
//   BEFORE_LOAD, AFTER_LOAD                around loading weights or a checkpoint
//   FIT_START
//   [eval if eval_first]
//   while timestamp < max_duration:
//     EPOCH_START                          when batch_in_epoch == 0
//     for each device batch:
//       BEFORE_DATALOADER, (read batch), AFTER_DATALOADER, BATCH_START
//       BEFORE_TRAIN_BATCH                 once per optimizer step; gradients are cleared
//       for each microbatch:
//         BEFORE_FORWARD, AFTER_FORWARD, BEFORE_LOSS, AFTER_LOSS, BEFORE_BACKWARD, AFTER_BACKWARD
//       AFTER_TRAIN_BATCH                  gradients complete (unscaled); gradient clipping runs here
//       (optimizer step at the scheduled learning rate; timestamp advanced)
//       BATCH_END
//       [eval when eval_interval (ba/sp/tok/dur) is crossed]
//       BATCH_CHECKPOINT
//       stop here if max_duration is reached mid-epoch
//     EPOCH_END                            when the epoch's data is exhausted
//     [eval when eval_interval (ep) is crossed]
//     EPOCH_CHECKPOINT
//   FIT_END
//   [eval if the last interval did not end exactly at max_duration]
//
//   eval:  EVAL_BEFORE_ALL, EVAL_START, per batch (EVAL_BATCH_START, EVAL_BEFORE_FORWARD, EVAL_AFTER_FORWARD,
//          EVAL_BATCH_END), EVAL_END, EVAL_AFTER_ALL; Trainer::eval() alone adds EVAL_STANDALONE_START/_END around.
//
// Composer's ITERATION_* events are not emitted (its `iter` unit is not supported).
#pragma once

#include <string_view>

namespace tessera::core {

enum class Event {
  kInit,
  kBeforeLoad,
  kAfterLoad,
  kFitStart,
  kEpochStart,
  kBeforeDataloader,
  kAfterDataloader,
  kBatchStart,
  kBeforeTrainBatch,
  kBeforeForward,
  kAfterForward,
  kBeforeLoss,
  kAfterLoss,
  kBeforeBackward,
  kAfterBackward,
  kAfterTrainBatch,
  kBatchEnd,
  kBatchCheckpoint,
  kEpochEnd,
  kEpochCheckpoint,
  kFitEnd,
  kEvalBeforeAll,
  kEvalStart,
  kEvalBatchStart,
  kEvalBeforeForward,
  kEvalAfterForward,
  kEvalBatchEnd,
  kEvalEnd,
  kEvalAfterAll,
  kEvalStandaloneStart,
  kEvalStandaloneEnd,
};

// Composer's string value: "init", "batch_end", "eval_after_forward", ...
std::string_view to_string(Event e);
// AFTER_* events run algorithms in reverse order (Composer's set_filo_order pass).
bool is_after_event(Event e);
bool is_eval_event(Event e);

}  // namespace tessera::core
