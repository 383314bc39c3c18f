// What the trainer, the model protocol and losses see of one batch: token ids, labels, and the masks fine-tuning
// batches carry. Every loader yields these.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace tessera::data {

// The label of a token that carries no loss (LLM Foundry's CROSS_ENTROPY_IGNORE_INDEX, torch's ignore_index).
inline constexpr int32_t kIgnoreLabel = -100;

struct TokenBatch {
  at::Tensor input_ids;  // (B, T) int64
  at::Tensor labels;     // (B, T) int64: input_ids with kIgnoreLabel where no loss (padding, prompts)
  int64_t samples = 0;   // real samples in the batch (B unless the last batch is short)
  // Given to the model when defined: the padding mask (fine-tuning batches padded on the left) and the ids of
  // packed examples (fine-tuning with packing), so attention and positions reset per example.
  at::Tensor attention_mask;  // (B, T) int64, 1 = token
  at::Tensor sequence_id;     // (B, T) int64, -1 on padding
  // Defined only in a context-parallel shard (models/context_parallel.h), whose positions are not consecutive: each
  // position's next-token target (kIgnoreLabel where none), which losses and metrics read instead of shifting labels.
  at::Tensor targets;  // (B, T) int64
};

// Tokens that carry a next-token loss: labels[:, 1:] that are not kIgnoreLabel (position t predicts label t + 1), or
// the targets that are not when the batch has them.
inline int64_t loss_token_count(const TokenBatch& b) {
  if (b.targets.defined()) return b.targets.ne(kIgnoreLabel).sum().item<int64_t>();
  return b.labels.slice(1, 1).ne(kIgnoreLabel).sum().item<int64_t>();
}

}  // namespace tessera::data
