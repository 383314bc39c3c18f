// StreamingDataset: several MDS streams mixed by proportion / repeat / choose, resampled every epoch, shuffled and
// partitioned over nodes, ranks and workers exactly as mosaicml-streaming's StreamingDataset does (random batching),
// with its resumption state. Resuming mid-epoch skips by arithmetic (the partition drops the consumed samples); no
// sample is read and discarded. Index memory grows with the number of shards, not samples.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/data/mds.h"
#include "tessera/data/streaming.h"

namespace tessera::data {

struct StreamSpec {
  std::string local;                  // dataset directory (index.json); with a remote, where files are fetched to
  std::optional<std::string> remote;  // s3://bucket/prefix (or a folder) the shards are fetched from on demand
  std::optional<std::string> split;   // sub-directory of `local` (and of `remote`)
  std::optional<double> proportion;   // relative weight (all streams or none)
  std::optional<double> repeat;       // absolute: repeat * samples per epoch
  std::optional<int64_t> choose;      // absolute: this many samples per epoch
  bool keep_zip = false;              // remote streams: keep compressed shards after decompressing them
  int download_retry = 2;             // remote streams: attempts per file
  double download_timeout = 60;       // remote streams: seconds to wait for another process fetching the same file
  std::string key = "dataset";        // where the recipe gives it, under the loader: "dataset.streams.<name>"
};

struct StreamingOptions {
  std::vector<StreamSpec> streams;
  int64_t batch_size = 1;  // per-device batch (Streaming requires it)
  bool shuffle = false;
  uint64_t shuffle_seed = 9176;
  std::string shuffle_algo = "py1e";           // naive | py1s | py1br | py1e
  std::optional<int64_t> shuffle_block_size;   // default max(4,000,000 / NCN, 2^18)
  std::optional<int64_t> num_canonical_nodes;  // default: physical nodes (64x for py1s)
  std::string partition_algo = "relaxed";      // orig | relaxed
  std::optional<int64_t> epoch_size;           // relative weighting only; default: all samples
  std::string sampling_method = "balanced";    // balanced (reseed per epoch) | fixed
  int64_t sampling_granularity = 1;
  bool verify_hashes = true;
  // Remote streams: bytes of shard files kept locally over all streams (each stream gets a share proportional to its
  // size); nullopt = unlimited. predownload: samples each loader worker fetches ahead (default 8 * batch_size).
  std::optional<uint64_t> cache_limit;
  std::optional<int64_t> predownload;
};

// Where this process sits: torchrun's RANK / LOCAL_WORLD_SIZE / WORLD_SIZE convention, plus loader workers.
struct World {
  int64_t num_nodes = 1;
  int64_t ranks_per_node = 1;
  int64_t workers_per_rank = 1;
};

// Streaming's state_dict: {"epoch", "sample_in_epoch", "num_canonical_nodes", "shuffle_seed",
// "initial_physical_nodes"}. sample_in_epoch counts global samples consumed in the epoch.
struct ResumeState {
  int64_t epoch = 0;
  int64_t sample_in_epoch = 0;
  int64_t num_canonical_nodes = 0;
  uint64_t shuffle_seed = 0;
  std::optional<int64_t> initial_physical_nodes;
  nlohmann::json to_json() const;
  static ResumeState from_json(const nlohmann::json& j);  // throws naming the missing key
};

class StreamingDataset {
 public:
  StreamingDataset(StreamingOptions options, World world);

  int64_t num_unique_samples() const;  // samples across all streams
  int64_t epoch_size() const { return epoch_size_; }
  int64_t num_canonical_nodes() const { return ncn_; }
  int64_t shuffle_block_size() const { return block_size_; }

  // The epoch's arrangement of sample ids (node, rank, worker, batch, element); -1 = padding. `sample_in_epoch`
  // global samples are skipped (resumption).
  streaming::Partition epoch_ids(int64_t epoch, int64_t sample_in_epoch = 0) const;
  // Where a global sample id lives: (stream, id within the stream).
  std::pair<size_t, int64_t> locate(int64_t sample) const;
  mds::MDSDataset& stream(size_t s) { return *streams_[s]; }
  bool has_remote() const;
  // Fetches the shard holding a global sample id into its stream's local directory (no-op for local streams).
  void prefetch(int64_t sample);
  int64_t predownload() const { return o_.predownload.value_or(8 * o_.batch_size); }

  mds::Sample get(int64_t sample);
  // The state after `sample_in_epoch` global samples of `epoch`, and the arguments to resume from it.
  ResumeState state(int64_t epoch, int64_t sample_in_epoch) const;
  // Adopts a saved state (seed, canonical nodes, initial nodes); returns (epoch, sample_in_epoch) to continue at.
  std::pair<int64_t, int64_t> load_state(const ResumeState& s);

 private:
  // Streaming's resample_streams: shuffle units and big-id -> sample-id map for an epoch.
  void resample(int64_t epoch, std::vector<int64_t>& units, std::vector<int64_t>& small_per_big) const;

  StreamingOptions o_;
  World world_;
  std::vector<std::unique_ptr<mds::MDSDataset>> streams_;
  std::vector<int64_t> stream_choose_;  // samples per epoch from each stream
  std::vector<int64_t> shards_per_stream_;
  std::vector<int64_t> samples_per_shard_;  // all shards of all streams, in order
  std::vector<int64_t> sample_offset_per_shard_;
  std::vector<int64_t> sample_offset_per_stream_;
  int64_t epoch_size_ = 0;
  int64_t ncn_ = 0;
  int64_t block_size_ = 0;
  std::optional<int64_t> initial_physical_nodes_;
};

}  // namespace tessera::data
