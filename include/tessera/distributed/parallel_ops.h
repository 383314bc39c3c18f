// Tensor parallelism's primitives (Megatron-LM's scheme), which the sharding engine's styles (models/parallel_plan.h,
// distributed/parallel_styles.h) and context parallelism run a model's modules with. A family declares which of its
// modules split over a tensor-parallel group of T ranks and how (its plan); the engine keeps only this rank's slice of
// each split weight (TensorParallelSplit) and installs on each planned module a style built from these functions:
//   - a column-parallel Linear (weight split along its output rows, dim 0) takes the whole input and yields this
//     rank's share of the outputs -- attention's query/key/value projections hold whole heads, an MLP's up/gate
//     projections a share of the hidden units. Its input passes through enter() (identity forward, gradient summed
//     over the group in backward, since every rank's share of the outputs depends on the whole input);
//   - a row-parallel Linear (weight split along its input columns, dim 1) takes this rank's share of the inputs and
//     yields a partial sum of the whole output, summed over the group by exit() (all-reduce forward, identity
//     backward); its bias, whole on every rank, is added once after the sum.
// Norms, learned positions and row-parallel biases stay whole on every rank. The group's ranks see the same batch; only
// the split layers' work and weights are divided.
//
// Vocabulary parallelism (Megatron-LM's; torchtitan's loss parallel): where the vocabulary divides by T, the head's
// weight splits along the vocabulary (rank r holds rows r V/T .. (r+1) V/T), and with it the embedding table when the
// two are tied (vocab_parallel_embedding: each rank looks up its rows, the sum over the group gives every token's).
// A training forward whose loss takes shares returns this rank's share of the logits, which
// vocab_parallel_cross_entropy() turns into the loss without gathering them (the max, the sum of exponentials and each
// target's logit reduced over the group); otherwise the logits are gathered (vocab_gather).
//
// With sequence parallelism (Megatron-LM's, on by default), the decoder layers' residual stream, norms and dropout run
// on this rank's share of the positions (the sequence cut in T): the engine scatters the sequence before the first
// layer and gathers it after the last. A column-parallel layer's input is then all-gathered along the sequence (its
// gradient reduce-scattered), and a row-parallel layer's output reduce-scattered instead of all-reduced (its gradient
// all-gathered); the norms' weights and row-parallel biases, used on shards, have their gradients summed over the
// group. Activations between the split layers shrink by T; the communication volume is the same.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tessera::dist {

// How one parameter splits over a tensor-parallel group of T ranks: along `dim` (0: rows, a column-parallel weight or
// its bias; 1: columns, a row-parallel weight), as consecutive `blocks` along that dimension (their sizes; empty: one
// block, the whole dimension), each block cut into T equal parts of which rank r holds the r-th. A fused
// query/key/value weight is three blocks (the query heads, the key heads, the value heads), so each rank holds whole
// heads of each.
struct TensorParallelSplit {
  std::string param;  // a named_parameters() key
  int64_t dim = 0;
  std::vector<int64_t> blocks;
};

// The group's collectives, as the engine provides them.
class TensorParallelGroup {
 public:
  virtual ~TensorParallelGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sums `t` over the group, in place.
  virtual void all_reduce(at::Tensor& t) = 0;
  // Every rank's `t` (contiguous) stacked along dimension 0, in rank order.
  virtual at::Tensor all_gather(const at::Tensor& t) = 0;
  // `t` (contiguous, dimension 0 a multiple of size()) summed over the group; this rank's share of dimension 0.
  virtual at::Tensor reduce_scatter(const at::Tensor& t) = 0;
};

// Identity forward, gradient summed over the group in backward (the input of a column-parallel layer).
at::Tensor tensor_parallel_enter(const at::Tensor& x, const std::shared_ptr<TensorParallelGroup>& group);
// Sum over the group forward, identity backward (the output of a row-parallel layer).
at::Tensor tensor_parallel_exit(const at::Tensor& x, const std::shared_ptr<TensorParallelGroup>& group);

// This rank's share of dimension 1 (the sequence) of x (B, S, ...); the gradient is all-gathered in backward.
at::Tensor sequence_scatter(const at::Tensor& x, const std::shared_ptr<TensorParallelGroup>& group);
// Every rank's share of the sequence, joined: (B, S / T, ...) -> (B, S, ...). What follows runs alike on every rank,
// so backward keeps this rank's share of the gradient.
at::Tensor sequence_gather(const at::Tensor& x, const std::shared_ptr<TensorParallelGroup>& group);

// x's sum over the group, this rank's share of dimension 1 (the sequence) of it: a row-parallel layer's output under
// sequence parallelism. Backward all-gathers the gradient.
at::Tensor sequence_reduce_scatter(const at::Tensor& x, const std::shared_ptr<TensorParallelGroup>& group);

// ---- Vocabulary parallelism.

// The rows of a vocabulary of `vocab` this rank of `group` holds: [start, start + rows).
struct VocabShard {
  int64_t start = 0;
  int64_t rows = 0;
};
VocabShard vocab_shard(int64_t vocab, const TensorParallelGroup& group);

// The embedding of `ids` from this rank's rows `weight` (V / T, d) of a table of `vocab` rows: ids outside them
// contribute zeros, and the sum over the group (backward: identity) gives every id's row. `padding_idx`: the whole
// table's row that gets no gradient (-1: none).
at::Tensor vocab_parallel_embedding(const at::Tensor& weight, const at::Tensor& ids, int64_t vocab, int64_t padding_idx,
                                    const std::shared_ptr<TensorParallelGroup>& group);

// Every rank's x joined along `dim` in rank order. Backward: with `sum_gradient`, this rank's part of the gradient
// summed over the group (reduce-scatter: every rank's result depends on this rank's part, as keys gathered for
// context parallelism); without, this rank's part of its own gradient (what follows runs alike on every rank).
at::Tensor gather_along(const at::Tensor& x, int64_t dim, const std::shared_ptr<TensorParallelGroup>& group,
                        bool sum_gradient);

// This rank's share of the vocabulary's logits (B, S, V / T) joined over the group: (B, S, V). What follows runs
// alike on every rank, so backward keeps this rank's share of the gradient.
at::Tensor vocab_gather(const at::Tensor& local_logits, const std::shared_ptr<TensorParallelGroup>& group);

// Next-token cross-entropy summed over `targets` ((B * S), data::kIgnoreLabel ignored) from this rank's share of the
// vocabulary's logits (B, S, V / T) of a vocabulary of `vocab`, without gathering them; with torch's label smoothing
// and PaLM's z-loss as CrossEntropyLoss computes them. Every rank of the group returns the same value, and backward
// gives each its share of the logits' gradient.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& local_logits, const at::Tensor& targets, int64_t vocab,
                                        double label_smoothing, double z_loss,
                                        const std::shared_ptr<TensorParallelGroup>& group);

}  // namespace tessera::dist
