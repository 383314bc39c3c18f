// StepGraph's bookkeeping (step_graph.h): which batches warm up, capture or replay, and the static inputs. The CUDA
// side is step_graph_cuda.cpp (or no_cuda_graphs.cpp in a build without CUDA).
#include "tessera/trainer/step_graph.h"

namespace tessera::trainer::detail {

namespace {

// What a captured step is fixed to: the microbatch size and the shape of every input tensor (-1 for an absent one).
std::vector<int64_t> step_key(const data::TokenBatch& b, int64_t microbatch_size) {
  std::vector<int64_t> key{microbatch_size};
  for (const at::Tensor* t : {&b.input_ids, &b.labels, &b.attention_mask, &b.sequence_id}) {
    if (!t->defined()) {
      key.push_back(-1);
      continue;
    }
    key.push_back(static_cast<int64_t>(t->scalar_type()));
    key.insert(key.end(), t->sizes().begin(), t->sizes().end());
  }
  return key;
}

}  // namespace

StepGraph::Mode StepGraph::mode_for(const data::TokenBatch& batch, int64_t microbatch_size) {
  // A context-parallel shard's targets are not part of the static inputs (and context parallelism is refused).
  if (failed_ || batch.targets.defined()) return Mode::kEager;
  std::vector<int64_t> key = step_key(batch, microbatch_size);
  if (captured_) return key == key_ ? Mode::kReplay : Mode::kEager;
  if (key != key_) {
    key_ = std::move(key);
    warm_ = 0;
  }
  if (warm_ < warmup_steps_) {
    ++warm_;
    return Mode::kWarmup;
  }
  return Mode::kCapture;
}

void StepGraph::reset() {
  outputs_ = Outputs{};
  release_graph();  // the pool is freed once the outputs above are gone
  captured_ = false;
  warm_ = 0;
  key_.clear();
}

const data::TokenBatch& StepGraph::load(const data::TokenBatch& batch, double token_scale) {
  auto copy = [](at::Tensor& into, const at::Tensor& from) {
    if (!from.defined()) {
      into = at::Tensor();
    } else if (!into.defined()) {
      into = from.clone(at::MemoryFormat::Contiguous);
    } else {
      into.copy_(from, /*non_blocking=*/true);
    }
  };
  copy(inputs_.input_ids, batch.input_ids);
  copy(inputs_.labels, batch.labels);
  copy(inputs_.attention_mask, batch.attention_mask);
  copy(inputs_.sequence_id, batch.sequence_id);
  inputs_.samples = batch.samples;
  if (!token_scale_.defined()) token_scale_ = at::empty({}, batch.input_ids.options().dtype(at::kFloat));
  // The same float the eager step's `loss * (double)` rounds its factor to.
  token_scale_.fill_(static_cast<float>(token_scale));
  return inputs_;
}

}  // namespace tessera::trainer::detail
