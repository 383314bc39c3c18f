// MosaicML Streaming's MDS format, byte-compatible in both directions (../shared/specs/streaming-mds.md; format
// notes in docs/formats/mds.md). A dataset directory holds index.json and shards shard.NNNNN.mds[.zstd|.gz]:
//   [uint32 n][uint32 offsets[n+1]][config JSON][samples], each sample = [uint32 size per variable column][columns].
//
// Writing: MDSWriter produces the same bytes (and so the same hashes) as streaming.MDSWriter for the same samples.
// Reading: MDSDataset reads shards written by either, verifying the hashes recorded in index.json.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace tessera::data::mds {

// One column value. Which alternatives an encoding takes (writing) or gives (reading):
//   bytes, str, str_decimal: std::string (raw bytes / UTF-8)    int, int8..int64, uint8..uint64, str_int: int64_t
//   float16/32/64, str_float: double     json: nlohmann::ordered_json     ndarray[:dtype[:shape]]: at::Tensor (CPU)
// As in Python, a std::string given to any encoding is written through unchanged (LLM Foundry writes UTF-8 bytes
// into `str` columns this way).
using Field = std::variant<std::string, int64_t, double, nlohmann::ordered_json, at::Tensor>;
using Sample = std::map<std::string, Field>;

// Validates an encoding name ("ndarray:int32:2048" too); returns its fixed byte size, or nullopt if variable.
// Throws tessera::Error for an unknown or malformed encoding.
std::optional<int64_t> encoded_size(const std::string& encoding);
std::string encode(const std::string& encoding, const Field& value);
Field decode(const std::string& encoding, std::string_view bytes);

struct WriterOptions {
  // Directory (created; must be empty unless exist_ok), or a remote location (s3://bucket/prefix): shards are then
  // written to `local` (default: a new temporary directory), uploaded as each is finished, and index.json last, so
  // a reader never sees an index naming a shard that is not there yet.
  std::string out;
  std::map<std::string, std::string> columns;              // name -> encoding
  std::optional<std::string> compression;                  // "zstd", "zstd:7", "gz", "gz:6"; nullopt = none
  std::vector<std::string> hashes;                         // sorted subset of sha1, xxh64, xxh3_64
  std::optional<uint64_t> size_limit = uint64_t{1} << 26;  // raw shard bytes; < 2^32; nullopt = unlimited
  bool exist_ok = false;
  std::optional<std::string> local;  // remote `out` only: staging directory
  bool keep_local = false;           // remote `out` only: keep the staged files
  // Resuming an interrupted dataset: the index.json entries of the shards already written (their files are kept;
  // numbering continues after them). Local `out` only.
  std::optional<nlohmann::ordered_json> resume_shards;
  // Rewrite index.json after every shard (listing the finished shards), so an interrupted writer can be resumed.
  bool index_every_shard = false;
  // Called after each shard is published (and, with index_every_shard, index.json): shards and samples in them.
  std::function<void(int64_t shards, int64_t samples)> on_shard;
};

// Writes samples into shards, flushing a shard when the next sample would exceed size_limit, and index.json on
// finish(). Each file is written to a temporary name and renamed, so a crash never leaves a partial shard under its
// final name. Not thread-safe.
class MDSWriter {
 public:
  explicit MDSWriter(WriterOptions options);
  ~MDSWriter();  // does NOT finish: an unfinished dataset has no index.json (call finish())
  MDSWriter(const MDSWriter&) = delete;
  MDSWriter& operator=(const MDSWriter&) = delete;

  void write(const Sample& sample);
  void finish();  // flushes the last shard and writes index.json; idempotent
  int64_t samples_written() const { return total_samples_; }
  int64_t shards_written() const { return static_cast<int64_t>(shards_.size()); }

 private:
  void flush_shard();
  std::string config_json() const;
  void publish(const std::string& name, std::string_view bytes);  // writes (and uploads) one file

  WriterOptions o_;
  std::string dir_;  // where files are written: `out`, or the staging directory of a remote `out`
  std::vector<std::string> names_, encodings_;
  std::vector<std::optional<int64_t>> sizes_;
  std::string config_;                // the shard config JSON embedded in every shard
  std::vector<std::string> pending_;  // encoded samples of the open shard
  uint64_t pending_bytes_ = 0;        // raw size the open shard would have now
  nlohmann::ordered_json shards_ = nlohmann::ordered_json::array();
  int64_t total_samples_ = 0;
  bool finished_ = false;
};

// Column layout of a shard; consecutive shards with the same layout share one instance.
struct ShardColumns {
  std::vector<std::string> names, encodings;
  std::vector<std::optional<int64_t>> sizes;  // fixed byte size, or nullopt for variable size
  bool operator==(const ShardColumns&) const = default;
};

struct ShardInfo {
  std::string raw_basename;  // may contain subdirectories (merged indexes)
  std::optional<std::string> zip_basename;
  std::optional<std::string> compression;
  uint64_t raw_bytes = 0, zip_bytes = 0;
  std::vector<std::pair<std::string, std::string>> raw_hashes, zip_hashes;  // algorithm -> hex digest
  int64_t samples = 0;
  std::shared_ptr<const ShardColumns> columns;
};

struct ReaderOptions {
  // Check the digests index.json lists when a shard is first opened: every name Streaming writes (hashlib's and
  // xxhash's, util::supported_hashes); a name Tessera cannot compute is skipped beside one it can, and refused alone.
  bool verify_hashes = true;
  // A remote copy of the dataset (s3://bucket/prefix, file://, or another folder). index.json and shards missing
  // from the local directory are fetched from it on first use (or ahead, by prefetch()); one process per node
  // fetches each file while the others wait (file locks in <dir>/.tessera-locks).
  std::optional<std::string> remote;
  // Bytes of index.json plus shard files kept in the local directory; before a fetch would exceed it, the least
  // recently used shards are deleted (raw and compressed files both). nullopt: unlimited. Must be at least four
  // times the largest shard (raw + compressed), as Streaming requires.
  std::optional<uint64_t> cache_limit;
  bool keep_zip = false;         // keep a fetched compressed shard next to its decompressed copy
  int download_retry = 2;        // attempts per file fetch (Streaming's meaning: total tries, at least 1)
  double download_timeout = 60;  // seconds to wait for another process of the node fetching the same file
};

// Streaming's cache_limit strings: an integer byte count, or a number with a base-1024 suffix b, kb, mb, gb, tb,
// pb, eb, zb, yb ("10gb" = 10 * 1024^3). Throws naming the value otherwise.
uint64_t parse_cache_limit(const std::string& text);

// One MDS directory (a "stream"). Index memory is O(shards) and small per shard (the column layout is shared and
// index.json is parsed one shard at a time); samples are located by binary search over cumulative shard sizes. Shards
// are opened (fetched from the remote if there is one, decompressed to the raw name if needed, hash-checked,
// memory-mapped) on first use and stay mapped; with a cache_limit, a shard whose files were evicted is unmapped when
// no reader holds it. Thread-safe for concurrent reads, and for several processes sharing one local directory.
class MDSDataset {
 public:
  explicit MDSDataset(std::string dir, ReaderOptions options = {});
  ~MDSDataset();

  const std::string& dir() const { return dir_; }
  int64_t size() const { return cumulative_.empty() ? 0 : cumulative_.back(); }
  const std::vector<ShardInfo>& shards() const { return shards_; }
  // (shard, index within shard) of a global sample id; throws naming the dataset when out of range.
  std::pair<size_t, int64_t> locate(int64_t sample) const;

  // The raw bytes of one sample, the decoded sample, and the undecoded bytes of one of its columns.
  std::string raw_sample(int64_t sample);
  Sample get(int64_t sample);
  std::string column(int64_t sample, const std::string& name);

  // With a remote: fetches a shard's files into the local directory if they are not there (no-op otherwise).
  void prefetch(size_t shard);
  bool is_remote() const { return options_.remote.has_value(); }
  // Sets (or clears) the cache limit, checking it as the constructor does. Not to be called while reading.
  void set_cache_limit(std::optional<uint64_t> limit);
  // Bytes the local directory holds now by Streaming's accounting (index.json + shard files, by index.json sizes).
  uint64_t cache_usage() const;

 private:
  struct OpenShard;
  std::shared_ptr<OpenShard> open(size_t shard);
  void fetch(size_t shard);      // remote.cpp
  void make_room(size_t shard);  // remote.cpp: evicts until the shard fits in cache_limit
  void fetch_index();            // remote.cpp
  void touch(size_t shard);      // remote.cpp: marks a shard used now (LRU order across the node)
  std::string remote_file(const std::string& basename) const;
  // dir_/basename for a file this reader creates, replaces or deletes: refused (naming index.json) if it would leave
  // dir_ through a symbolic link (index.json's names are checked lexically when it is read).
  std::string writable_path(const std::string& basename) const;

  std::string dir_;
  ReaderOptions options_;
  std::vector<ShardInfo> shards_;
  std::vector<int64_t> cumulative_;  // cumulative_[k] = samples in shards 0..k
  std::mutex mutex_;
  std::vector<std::shared_ptr<OpenShard>> open_;
  std::vector<int64_t> touched_;  // when each shard's access time was last written (steady seconds)
};

}  // namespace tessera::data::mds
