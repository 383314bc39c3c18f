// mosaicml-streaming's epoch construction: shuffles (streaming/base/shuffle), partitions (streaming/base/partition)
// and stream sampling (streaming/base/sampling.py), reproduced exactly so that Tessera visits samples in the order
// Streaming does for the same seed, shuffle, canonical nodes and world shape (../shared/specs/streaming-mds.md §5).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::data::streaming {

// A permutation of [0, sum(shard_sizes)) for `algo` in naive | py1s | py1br | py1e. `shard_sizes` are the shuffle
// units of the epoch (an upsampled shard counts once per repeat).
std::vector<int64_t> get_shuffle(const std::string& algo, const std::vector<int64_t>& shard_sizes,
                                 int64_t num_canonical_nodes, uint64_t seed, uint64_t epoch, int64_t block_size);

// Sample ids per (physical node, rank of node, worker of rank, batch of worker, element of batch); -1 is padding.
struct Partition {
  std::array<int64_t, 5> shape{};  // nodes, ranks per node, workers per rank, batches per worker, batch size
  std::vector<int64_t> ids;        // row-major over `shape`
  int64_t at(int64_t node, int64_t rank, int64_t worker, int64_t batch, int64_t element) const;
  // The global traversal order: batch-in-worker, worker, node, rank, element (transpose(3, 2, 0, 1, 4)).
  std::vector<int64_t> traversal() const;
};

// partition_algo orig | relaxed. `drop_first` is the number of samples of the epoch already consumed (resumption).
// `initial_physical_nodes` is 0 for a first run. Throws tessera::Error for incompatible node counts.
Partition get_partitions(const std::string& algo, int64_t num_samples, int64_t num_canonical_nodes,
                         int64_t num_physical_nodes, int64_t ranks_per_node, int64_t workers_per_rank,
                         int64_t batch_size, int64_t drop_first = 0, int64_t initial_physical_nodes = 0);

// How many samples to take from each shard of a stream when `choose` of its samples are wanted (sampling.py).
std::vector<int64_t> get_sampling(const std::vector<int64_t>& samples_per_shard, int64_t choose, int64_t granularity,
                                  uint64_t seed, uint64_t epoch, bool use_epoch);

}  // namespace tessera::data::streaming
