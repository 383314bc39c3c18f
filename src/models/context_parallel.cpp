// Context parallelism's cut of the sequence and the attention inputs of a shard (see context_parallel.h).
#include "tessera/models/context_parallel.h"

#include <fmt/format.h>

#include <limits>
#include <utility>

#include "tessera/models/blocks/attention.h"
#include "tessera/models/causal_lm.h"
#include "tessera/util/error.h"

namespace tessera::models {
namespace {

at::Tensor take_positions(const at::Tensor& t, const at::Tensor& positions) {
  return t.defined() ? t.index_select(1, positions.to(t.device())) : t;
}

}  // namespace

std::vector<int64_t> context_parallel_positions(int64_t seq_len, int64_t degree, int64_t rank) {
  const int64_t chunk = seq_len / (2 * degree);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(2 * chunk));
  for (const int64_t c : {rank, 2 * degree - 1 - rank}) {
    for (int64_t i = 0; i < chunk; ++i) out.push_back(c * chunk + i);
  }
  return out;
}

std::shared_ptr<const ContextShard> make_context_shard(std::shared_ptr<ContextExchange> exchange, int64_t seq_len,
                                                       const at::Device& device) {
  const int64_t degree = exchange->size();
  if (seq_len % (2 * degree) != 0) {
    throw Error("model",
                fmt::format("parallelism.context_parallel_degree {}: a sequence of {} tokens does not cut into "
                            "{} equal chunks (2 per rank, for load balancing); use a max_seq_len that is a "
                            "multiple of {}",
                            degree, seq_len, 2 * degree, 2 * degree));
  }
  auto shard = std::make_shared<ContextShard>();
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(seq_len));
  for (int64_t r = 0; r < degree; ++r) {
    const std::vector<int64_t> p = context_parallel_positions(seq_len, degree, r);
    if (r == exchange->rank()) shard->positions = at::tensor(p, at::kLong).to(device);
    order.insert(order.end(), p.begin(), p.end());
  }
  shard->key_order = at::tensor(order, at::kLong).to(device);
  shard->exchange = std::move(exchange);
  return shard;
}

data::TokenBatch context_shard_batch(const data::TokenBatch& batch, const ContextShard& shard) {
  data::TokenBatch out = batch;
  const int64_t b = batch.labels.size(0);
  out.targets = take_positions(next_token_targets(batch.labels).view({b, -1}), shard.positions);
  out.input_ids = take_positions(batch.input_ids, shard.positions);
  out.labels = take_positions(batch.labels, shard.positions);
  out.attention_mask = take_positions(batch.attention_mask, shard.positions);
  out.sequence_id = take_positions(batch.sequence_id, shard.positions);
  return out;
}

AttentionInputs context_parallel_inputs(const AttentionInputs& in, std::shared_ptr<const ContextShard> shard,
                                        at::ScalarType dtype) {
  TORCH_CHECK(in.past == 0, "context parallelism runs without a KV cache");
  AttentionInputs out = in;
  const at::Device device = shard->positions.device();
  const at::Tensor& rows = shard->positions;
  const at::Tensor& cols = shard->key_order;
  if (in.mask) {
    // Every family's mask (ALiBi, sliding windows, padding, packed documents) at this rank's query rows, its key
    // columns in the gathered order.
    const at::Tensor& m = *in.mask;  // (B or 1, H or 1, S, S)
    out.mask = m.index_select(m.dim() - 2, rows.to(m.device())).index_select(m.dim() - 1, cols.to(m.device()));
  } else if (in.is_causal) {
    // Plain causal attention, which SDPA's is_causal expresses for whole sequences only: query p sees keys k <= p.
    const at::Tensor blocked = cols.view({1, -1}) > rows.view({-1, 1});
    out.mask = at::zeros(blocked.sizes(), at::TensorOptions().device(device).dtype(at::kFloat))
                   .masked_fill(blocked, std::numeric_limits<float>::lowest())
                   .to(dtype)
                   .view({1, 1, rows.size(0), cols.size(0)});
  }
  out.is_causal = false;
  for (at::Tensor* t : {&out.rope_cos, &out.rope_sin}) {
    if (t->defined()) *t = t->index_select(t->dim() - 2, rows.to(t->device()));  // (S, half) or (B or 1, S, half)
  }
  out.context = std::move(shard);
  return out;
}

}  // namespace tessera::models
