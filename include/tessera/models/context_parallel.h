// Context parallelism inside a model, for sequences too long for one rank (Llama 3's all-gather scheme; torchtitan's
// context_parallel_rotate_method "allgather"). The C ranks of a context-parallel group read the same samples and each
// runs the decoder layers, the head and the loss on its share of the positions:
//   - load balancing: the sequence is cut into 2C equal chunks and rank r holds chunks r and 2C - 1 - r, so that under
//     causal masking every rank has the same attention work;
//   - each attention layer takes the keys and values of the whole sequence from the group (ContextExchange below, which
//     the sharding engine provides: gathered over the group, their gradients summed back in backward) and attends from
//     this rank's queries, with the mask's rows at this rank's positions and its columns in the gathered keys' order
//     (context_parallel_inputs, attention.h);
//   - rotary tables, learned positions and packed-document masks are computed for the whole sequence before the cut,
//     so every token keeps its own position and document;
//   - the logits and the loss are this rank's positions only (a long sequence's logits are never whole on one rank);
//     the batch the loss sees carries each position's next-token target (data::TokenBatch::targets).
// Parameters stay whole on every rank; each rank's gradients cover its positions, and the trainer scales the loss so
// that the engine's average over all ranks sums them over the group.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "tessera/data/batch.h"

namespace tessera::models {

// What a forward on a context shard needs from the other ranks of its group, provided by the sharding engine
// (distributed/: dist::context_exchange()), so that model code runs no collective. Every rank of the group makes the
// same calls in the same order.
class ContextExchange {
 public:
  virtual ~ContextExchange() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank's `t` joined along `dim` in rank order (a layer's keys or values of the whole sequence); backward sums
  // each rank's part of the gradient over the group, since every rank's queries attend to it.
  virtual at::Tensor whole_sequence(const at::Tensor& t, int64_t dim) = 0;
};

// One forward's cut of a sequence over a context-parallel group.
struct ContextShard {
  std::shared_ptr<ContextExchange> exchange;  // the group's side of the forward
  at::Tensor positions;                       // (S / C,) int64: this rank's positions, its two chunks in order
  at::Tensor key_order;  // (S,) int64: every rank's positions in rank order (the order of the gathered keys)
};

// The positions rank `rank` of `degree` holds of a sequence of `seq_len` tokens (a multiple of 2 * degree): chunks
// rank and 2 * degree - 1 - rank of 2 * degree equal chunks, in order.
std::vector<int64_t> context_parallel_positions(int64_t seq_len, int64_t degree, int64_t rank);

// This rank's shard of a sequence of `seq_len` tokens over `exchange`'s group, its index tensors on `device`. Throws
// Error naming the length when it is not a multiple of 2 * the group's size.
std::shared_ptr<const ContextShard> make_context_shard(std::shared_ptr<ContextExchange> exchange, int64_t seq_len,
                                                       const at::Device& device);

// `batch` (the whole sequence) cut to `shard`'s positions: input ids, labels, masks and sequence ids at those
// positions, and `targets` set to each one's next-token target (the loss's and metrics' view of the logits the model
// returns under the shard).
data::TokenBatch context_shard_batch(const data::TokenBatch& batch, const ContextShard& shard);

}  // namespace tessera::models
