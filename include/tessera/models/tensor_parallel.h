// Tensor parallelism inside a model (Megatron-LM's scheme): a model declares which of its Linear layers split over a
// tensor-parallel group and how (CausalLM::tensor_parallel_plan), the sharding engine (dist/fsdp.h) keeps only this
// rank's slice of each of those weights, and the model, told the group (CausalLM::set_tensor_parallel), runs on its
// slices:
//   - a column-parallel Linear (weight split along its output rows, dim 0) takes the whole input and yields this
//     rank's share of the outputs -- attention's query/key/value projections hold whole heads, an MLP's up/gate
//     projections a share of the hidden units. Its input passes through enter() (identity forward, gradient summed
//     over the group in backward, since every rank's share of the outputs depends on the whole input);
//   - a row-parallel Linear (weight split along its input columns, dim 1) takes this rank's share of the inputs and
//     yields a partial sum of the whole output, summed over the group by exit() (all-reduce forward, identity
//     backward); its bias, whole on every rank, is added once after the sum.
// Everything else (embeddings, norms, the head, row-parallel biases) stays whole on every rank and computes the same
// values there. The group's ranks see the same batch; only the split layers' work and weights are divided.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tessera::models {

class LinearImpl;

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
};

// Identity forward, gradient summed over the group in backward (the input of a column-parallel layer).
at::Tensor tensor_parallel_enter(const at::Tensor& x, const std::shared_ptr<TensorParallelGroup>& group);
// Sum over the group forward, identity backward (the output of a row-parallel layer).
at::Tensor tensor_parallel_exit(const at::Tensor& x, const std::shared_ptr<TensorParallelGroup>& group);

// `layer` (holding this rank's rows) on the whole input `x`: enter(x) W^T + b. Without a group: layer(x).
at::Tensor column_parallel(LinearImpl& layer, const at::Tensor& x, const std::shared_ptr<TensorParallelGroup>& group);
// `layer` (holding this rank's columns) on this rank's share of the inputs: exit(x W^T) + b. Without a group:
// layer(x).
at::Tensor row_parallel(LinearImpl& layer, const at::Tensor& x, const std::shared_ptr<TensorParallelGroup>& group);

// The splits of `prefix`.weight (and .bias when the layer has one) as a column-parallel layer with `blocks`.
void add_column_parallel(std::vector<TensorParallelSplit>& plan, const std::string& prefix, const LinearImpl& layer,
                         std::vector<int64_t> blocks = {});
// The split of `prefix`.weight as a row-parallel layer (its bias stays whole).
void add_row_parallel(std::vector<TensorParallelSplit>& plan, const std::string& prefix);

}  // namespace tessera::models
