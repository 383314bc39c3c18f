// The training step's microbatches as one CUDA graph (`cuda_graphs: true`, docs/gpu.md#cuda-graphs). Internal to the
// trainer.
//
// A graph records every kernel of the forward, loss, backward and gradient reduction of all microbatches of a step
// once, and replays them with one launch: the host no longer issues each of the thousands of kernels of a step. The
// replay reads its inputs from fixed device buffers (the trainer copies each batch and its token scale into them) and
// writes the loss and the gradients into fixed buffers too, which the trainer reads after it. The optimizer step, the
// gradient clipping and every event outside the microbatches run eagerly as before.
//
// Life of a run: steps run eagerly until `warmup` consecutive batches of one shape have run on the graph's side stream
// (lazy initialisation of cuBLAS workspaces and the autograd engine happens there, outside any capture), then the next
// batch of that shape is captured and replayed; later batches of that shape replay, and a batch of another shape (the
// last partial batch, sequence-length warmup) runs eagerly without touching the graph. A capture that fails (the model
// synchronises with the host, e.g. a padding mask whose contents decide the attention path) is discarded: the run goes
// on eagerly and says why once.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessera/data/batch.h"

namespace tessera::trainer::detail {

// Why this build or `device` cannot capture CUDA graphs; empty when it can.
std::string cuda_graphs_unsupported(const at::Device& device);

class StepGraph {
 public:
  enum class Mode { kEager, kWarmup, kCapture, kReplay };

  // What a captured step writes and the trainer reads after each replay. The graph keeps them alive: a replay writes
  // into the same memory every time.
  struct Outputs {
    at::Tensor total;                                               // the step's loss, summed over its microbatches
    at::Tensor loss;                                                // the last microbatch's (State::loss)
    at::Tensor outputs;                                             // its model outputs (State::outputs)
    std::vector<at::Tensor> grads;                                  // per trainable parameter (undefined: none)
    std::map<std::string, at::Tensor> aux_losses;                   // a mixture of experts' auxiliary losses
    std::vector<std::pair<std::string, at::Tensor>> expert_counts;  // and its routing counts
  };

  StepGraph(const at::Device& device, int64_t warmup_steps);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // How to run a batch of this shape with this microbatch size (see above).
  Mode mode_for(const data::TokenBatch& batch, int64_t microbatch_size);
  // Runs `fn` on the side stream, after the work already queued on the current stream; the current stream then waits
  // for it.
  void on_side_stream(const std::function<void()>& fn);
  // Copies `batch` into the static inputs (made on the first call) and `token_scale` into the scale the captured loss
  // is multiplied by; returns the static inputs.
  const data::TokenBatch& load(const data::TokenBatch& batch, double token_scale);
  // The device scalar (fp32) that load() fills: the captured step multiplies each microbatch's summed loss by it.
  const at::Tensor& token_scale() const { return token_scale_; }
  // Captures `fn` on the side stream. Returns empty on success, else why the capture failed; a failed capture leaves
  // no graph, and every later batch runs eagerly.
  std::string capture(const std::function<void()>& fn);
  // After a successful capture: what the trainer reads after each replay.
  void keep(Outputs outputs) { outputs_ = std::move(outputs); }
  const Outputs& outputs() const { return outputs_; }
  // Runs the captured step on the current stream.
  void replay();
  // Drops the graph and its memory (a rollback replaced the weights' values; warmup and capture start again).
  void reset();
  int64_t replays() const { return replays_; }

 private:
  struct Impl;
  Impl& impl();          // made on first use: the bookkeeping above needs no GPU
  void release_graph();  // the backend's part of reset()
  at::Device device_;
  std::unique_ptr<Impl> impl_;
  int64_t warmup_steps_;
  std::vector<int64_t> key_;  // the shape the warmup counts (and the graph was captured) for
  int64_t warm_ = 0;          // consecutive warmup steps of that shape
  bool captured_ = false;
  bool failed_ = false;
  int64_t replays_ = 0;
  data::TokenBatch inputs_;
  at::Tensor token_scale_;
  Outputs outputs_;
};

}  // namespace tessera::trainer::detail
