// Helpers the Trainer's source files share (trainer.cpp, trainer_eval.cpp). Internal to the trainer.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "tessera/core/state.h"
#include "tessera/data/batch.h"
#include "tessera/distributed/sharding.h"
#include "tessera/models/causal_lm.h"

namespace tessera::trainer::detail {

// The ranks that read different batches (dist::ShardingOptions::data_rank): a tensor- or context-parallel group's
// ranks read the same batch, and so do the ranks at the same position of every pipeline stage. Sums over every rank
// of values that these ranks share are then that many times the data-parallel sums, which the means and ratios logged
// cancel.
int64_t data_rank(const core::State& s, const dist::ShardingOptions& o);
int64_t data_world(const core::State& s, const dist::ShardingOptions& o);

// `values` summed over every rank, in one all-reduce (doubles: exact for counts below 2^53).
std::vector<double> sum_over_ranks(const core::State& s, const std::vector<double>& values);

// The batch's loss-generating tokens (labels not ignored).
int64_t count_tokens(const data::TokenBatch& b);
// Rows [start, end) of a batch.
data::TokenBatch slice(const data::TokenBatch& b, int64_t start, int64_t end);
// The model's forward options for a batch: its attention mask and packed-document ids.
models::ForwardOptions forward_options(const data::TokenBatch& b);
// The batch on `device` (a copy only for a GPU).
data::TokenBatch to_device(data::TokenBatch b, const at::Device& device, bool non_blocking);

}  // namespace tessera::trainer::detail
