// Token batches for language-model training: LLM Foundry's text dataset over a StreamingDataset, read and collated
// by background threads. Samples are `tokens` columns (ndarray of any integer dtype, or legacy `bytes` holding
// `token_encoding_type` values), truncated to max_seq_len; a batch is input_ids (B, T) int64 and labels with padding
// masked as kIgnoreLabel (-100). Batches come in Streaming's order for this rank: worker w's batch k is the (k * W +
// w)-th batch.
#pragma once

#include <ATen/ATen.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tessera/data/batch.h"
#include "tessera/data/mds.h"
#include "tessera/data/streaming_dataset.h"

namespace tessera::data {

// One epoch's batches for one rank: TokenBatchLoader (text) or FinetuningBatches (finetuning).
class BatchIterator {
 public:
  virtual ~BatchIterator() = default;
  // The next batch, or nullopt at the end of the epoch.
  virtual std::optional<TokenBatch> next() = 0;
};

struct TokenLoaderOptions {
  int64_t max_seq_len = 2048;
  std::string column = "tokens";
  std::string token_encoding_type = "int64";  // for `bytes` columns: int8 .. uint64
  int64_t pad_token_id = 0;                   // fills samples shorter than the longest in their batch
  bool drop_last = true;                      // drop a final batch with fewer than batch_size samples
  int64_t prefetch_factor = 2;                // batches each worker keeps ready
};

// The tokens of an MDS column, 1-d in their stored dtype: an ndarray of any integer dtype as it is, or `bytes` of
// `encoding` values (int8 .. uint64: LLM Foundry's legacy layout). Errors name `where` (the sample and column).
at::Tensor token_column(const mds::Field& field, const std::string& encoding, const std::string& where);

// This rank's batches of an epoch, per worker: the sample ids of each batch (short final batches dropped when
// drop_last). batches_in_epoch counts them (the dataloader length).
std::vector<std::vector<std::vector<int64_t>>> worker_batches(const streaming::Partition& part, int64_t node,
                                                              int64_t rank_of_node, bool drop_last);
int64_t batches_in_epoch(const StreamingDataset& dataset, int64_t epoch, int64_t sample_in_epoch, int64_t node,
                         int64_t rank_of_node, bool drop_last);

// Iterates one rank's share of one epoch. The dataset's World must have workers_per_rank = the number of loader
// threads (at least 1). Not thread-safe (one consumer); the workers only read the dataset (thread-safe).
class TokenBatchLoader : public BatchIterator {
 public:
  TokenBatchLoader(StreamingDataset& dataset, int64_t workers, int64_t epoch, int64_t sample_in_epoch, int64_t node,
                   int64_t rank_of_node, TokenLoaderOptions options);
  ~TokenBatchLoader() override;
  TokenBatchLoader(const TokenBatchLoader&) = delete;
  TokenBatchLoader& operator=(const TokenBatchLoader&) = delete;

  // The next batch, or nullopt at the end of the epoch. A worker's error (a corrupt shard) is rethrown here.
  std::optional<TokenBatch> next() override;
  // Samples this rank has consumed in this epoch (for the resumption state: multiply by the number of ranks).
  int64_t samples_consumed() const { return consumed_; }

 private:
  struct Worker;
  void run(Worker& w);
  void prefetch(Worker& w);  // remote streams: fetches shards ahead of the worker
  TokenBatch collate(const std::vector<int64_t>& ids);

  StreamingDataset& ds_;
  TokenLoaderOptions o_;
  int64_t batch_size_;
  std::vector<std::unique_ptr<Worker>> workers_;
  size_t turn_ = 0;
  int64_t consumed_ = 0;
};

}  // namespace tessera::data
