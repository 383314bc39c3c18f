// StreamingDataset: stream weighting, per-epoch resampling and the random-batching epoch arrangement.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>

#include "tessera/data/streaming_dataset.h"
#include "tessera/storage/s3.h"
#include "tessera/storage/storage.h"
#include "tessera/util/error.h"
#include "tessera/util/numpy_random.h"

namespace tessera::data {
namespace {

constexpr const char* kDatasetComponent = "streaming";

// Stream.apply_weights: samples per epoch for each stream.
std::vector<int64_t> apply_weights(const std::vector<StreamSpec>& streams, const std::vector<int64_t>& samples,
                                   std::optional<int64_t> epoch_size, uint64_t seed, int64_t& choose_per_epoch) {
  const size_t n = streams.size();
  size_t relative = 0, absolute = 0;
  for (const auto& s : streams) {
    relative += s.proportion.has_value();
    absolute += s.repeat.has_value() || s.choose.has_value();
  }
  if (relative && relative != n) throw Error(kDatasetComponent, "give proportion for every stream or for none");
  if (relative && absolute)
    throw Error(kDatasetComponent, "relative (proportion) and absolute (repeat, choose) weights cannot be mixed");
  std::vector<int64_t> choose(n);
  const int64_t total = std::accumulate(samples.begin(), samples.end(), int64_t{0});
  if (relative || (!absolute && epoch_size)) {
    choose_per_epoch = epoch_size ? *epoch_size : total;
    std::vector<double> p(n);
    for (size_t i = 0; i < n; ++i) p[i] = relative ? *streams[i].proportion : static_cast<double>(samples[i]);
    const double sum = std::accumulate(p.begin(), p.end(), 0.0);
    int64_t chosen = 0;
    for (size_t i = 0; i < n; ++i) {
      choose[i] = static_cast<int64_t>(static_cast<double>(choose_per_epoch) * (p[i] / sum));
      chosen += choose[i];
    }
    util::NumpyGenerator rng(seed);
    for (int64_t i : rng.choice_without_replacement(static_cast<int64_t>(n), choose_per_epoch - chosen)) {
      ++choose[static_cast<size_t>(i)];
    }
    return choose;
  }
  if (epoch_size) throw Error(kDatasetComponent, "epoch_size needs relative (proportion) weights or none");
  choose_per_epoch = 0;
  for (size_t i = 0; i < n; ++i) {
    if (streams[i].repeat) {
      choose[i] = static_cast<int64_t>(*streams[i].repeat * static_cast<double>(samples[i]));
    } else if (streams[i].choose) {
      choose[i] = *streams[i].choose;
    } else {
      choose[i] = samples[i];
    }
    choose_per_epoch += choose[i];
  }
  return choose;
}

// Where a remote stream without `local` is cached: a folder under the system temporary directory named by a hash of
// the remote (Streaming uses a blake2s hash the same way, but refuses to reuse the folder; here it is a cache).
std::string default_local(const std::string& remote) {
  return (std::filesystem::temp_directory_path() / "tessera-streams" / storage::sigv4::sha256_hex(remote).substr(0, 32))
      .string();
}

}  // namespace

nlohmann::json ResumeState::to_json() const {
  return {
      {"epoch", epoch},
      {"initial_physical_nodes", initial_physical_nodes ? nlohmann::json(*initial_physical_nodes) : nlohmann::json()},
      {"num_canonical_nodes", num_canonical_nodes},
      {"sample_in_epoch", sample_in_epoch},
      {"shuffle_seed", shuffle_seed}};
}

ResumeState ResumeState::from_json(const nlohmann::json& j) {
  ResumeState s;
  try {
    s.epoch = j.at("epoch").get<int64_t>();
    s.sample_in_epoch = j.at("sample_in_epoch").get<int64_t>();
    s.num_canonical_nodes = j.at("num_canonical_nodes").get<int64_t>();
    s.shuffle_seed = j.at("shuffle_seed").get<uint64_t>();
    if (j.contains("initial_physical_nodes") && !j["initial_physical_nodes"].is_null()) {
      s.initial_physical_nodes = j["initial_physical_nodes"].get<int64_t>();
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(kDatasetComponent, fmt::format("data loader state: {}", e.what()));
  }
  return s;
}

StreamingDataset::StreamingDataset(StreamingOptions options, World world) : o_(std::move(options)), world_(world) {
  if (o_.streams.empty()) throw Error(kDatasetComponent, "a StreamingDataset needs at least one stream");
  if (o_.batch_size < 1) throw Error(kDatasetComponent, "batch_size must be positive");
  std::vector<int64_t> per_stream;
  int64_t total = 0;  // running sample offset over all streams and shards
  for (size_t i = 0; i < o_.streams.size(); ++i) {
    const StreamSpec& s = o_.streams[i];
    std::string local = s.local;
    if (local.empty() && s.remote) local = default_local(*s.remote);
    const std::string dir = s.split ? (std::filesystem::path(local) / *s.split).string() : local;
    mds::ReaderOptions reader;
    reader.verify_hashes = o_.verify_hashes;
    if (s.remote) {
      reader.remote = s.split ? storage::join(*s.remote, *s.split) : *s.remote;
      reader.keep_zip = s.keep_zip;
      reader.download_retry = s.download_retry;
      reader.download_timeout = s.download_timeout;
    }
    streams_.push_back(std::make_unique<mds::MDSDataset>(dir, reader));
    sample_offset_per_stream_.push_back(total);
    per_stream.push_back(streams_.back()->size());
    shards_per_stream_.push_back(static_cast<int64_t>(streams_.back()->shards().size()));
    for (const auto& shard : streams_.back()->shards()) {
      sample_offset_per_shard_.push_back(total);
      samples_per_shard_.push_back(shard.samples);
      total += shard.samples;
    }
  }
  if (o_.cache_limit) {
    // One limit over all remote streams, shared in proportion to their shard bytes.
    uint64_t total_bytes = 0;
    std::vector<uint64_t> bytes;
    for (const auto& st : streams_) {
      uint64_t b = 0;
      for (const auto& shard : st->shards()) b += shard.raw_bytes + shard.zip_bytes;
      bytes.push_back(st->is_remote() ? b : 0);
      total_bytes += bytes.back();
    }
    for (size_t i = 0; i < streams_.size(); ++i) {
      if (bytes[i] == 0) continue;
      const auto share = static_cast<uint64_t>(static_cast<long double>(*o_.cache_limit) * bytes[i] / total_bytes);
      streams_[i]->set_cache_limit(share);
    }
  }
  stream_choose_ = apply_weights(o_.streams, per_stream, o_.epoch_size, o_.shuffle_seed, epoch_size_);
  ncn_ = o_.num_canonical_nodes.value_or((o_.shuffle_algo == "py1s" ? 64 : 1) * world_.num_nodes);
  block_size_ = o_.shuffle_block_size.value_or(std::max<int64_t>(4000000 / ncn_, int64_t{1} << 18));
}

bool StreamingDataset::has_remote() const {
  return std::any_of(streams_.begin(), streams_.end(), [](const auto& s) { return s->is_remote(); });
}

void StreamingDataset::prefetch(int64_t sample) {
  const auto [s, id] = locate(sample);
  if (!streams_[s]->is_remote()) return;
  streams_[s]->prefetch(streams_[s]->locate(id).first);
}

int64_t StreamingDataset::num_unique_samples() const {
  return std::accumulate(samples_per_shard_.begin(), samples_per_shard_.end(), int64_t{0});
}

void StreamingDataset::resample(int64_t epoch, std::vector<int64_t>& units, std::vector<int64_t>& small) const {
  const bool balanced = o_.sampling_method == "balanced";
  util::NumpyGenerator rng(balanced ? o_.shuffle_seed + static_cast<uint64_t>(epoch) : o_.shuffle_seed);
  const bool use_epoch = o_.shuffle && balanced;
  size_t shard = 0;
  for (size_t s = 0; s < streams_.size(); ++s) {
    const std::vector<int64_t> sizes(samples_per_shard_.begin() + static_cast<long>(shard),
                                     samples_per_shard_.begin() + static_cast<long>(shard) + shards_per_stream_[s]);
    const std::vector<int64_t> choose = streaming::get_sampling(
        sizes, stream_choose_[s], o_.sampling_granularity, o_.shuffle_seed, static_cast<uint64_t>(epoch), use_epoch);
    for (size_t k = 0; k < sizes.size(); ++k, ++shard) {
      const int64_t n = sizes[k], c = choose[k], offset = sample_offset_per_shard_[shard];
      if (n == 0) continue;
      for (int64_t r = 0; r < c / n; ++r) {
        units.push_back(n);
        for (int64_t i = 0; i < n; ++i) small.push_back(offset + i);
      }
      if (c % n) {
        units.push_back(c % n);
        std::vector<int64_t> part = rng.choice_without_replacement(n, c % n);
        std::sort(part.begin(), part.end());
        for (int64_t i : part) small.push_back(offset + i);
      }
    }
  }
}

streaming::Partition StreamingDataset::epoch_ids(int64_t epoch, int64_t sample_in_epoch) const {
  std::vector<int64_t> units, small;
  resample(epoch, units, small);
  streaming::Partition part = streaming::get_partitions(o_.partition_algo, epoch_size_, ncn_, world_.num_nodes,
                                                        world_.ranks_per_node, world_.workers_per_rank, o_.batch_size,
                                                        sample_in_epoch, initial_physical_nodes_.value_or(0));
  std::vector<int64_t> perm;
  if (o_.shuffle)
    perm = streaming::get_shuffle(o_.shuffle_algo, units, ncn_, o_.shuffle_seed, static_cast<uint64_t>(epoch),
                                  block_size_);
  for (int64_t& id : part.ids) {
    if (id < 0) continue;
    if (o_.shuffle) id = perm[static_cast<size_t>(id)];
    id = small[static_cast<size_t>(id)];
  }
  return part;
}

std::pair<size_t, int64_t> StreamingDataset::locate(int64_t sample) const {
  const auto it = std::upper_bound(sample_offset_per_stream_.begin(), sample_offset_per_stream_.end(), sample);
  const size_t s = static_cast<size_t>(it - sample_offset_per_stream_.begin()) - 1;
  return {s, sample - sample_offset_per_stream_[s]};
}

mds::Sample StreamingDataset::get(int64_t sample) {
  const auto [s, id] = locate(sample);
  return streams_[s]->get(id);
}

ResumeState StreamingDataset::state(int64_t epoch, int64_t sample_in_epoch) const {
  ResumeState s;
  s.epoch = epoch;
  s.sample_in_epoch = sample_in_epoch;
  s.num_canonical_nodes = ncn_;
  s.shuffle_seed = o_.shuffle_seed;
  s.initial_physical_nodes = initial_physical_nodes_.value_or(world_.num_nodes);
  return s;
}

std::pair<int64_t, int64_t> StreamingDataset::load_state(const ResumeState& s) {
  ncn_ = s.num_canonical_nodes;
  o_.shuffle_seed = s.shuffle_seed;
  initial_physical_nodes_ = s.initial_physical_nodes;
  block_size_ = o_.shuffle_block_size.value_or(std::max<int64_t>(4000000 / ncn_, int64_t{1} << 18));
  return {s.epoch, s.sample_in_epoch};
}

}  // namespace tessera::data
