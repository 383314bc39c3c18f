// MDSDataset's remote side, as Streaming's Stream / StreamingDataset do it: index.json and shards fetched from the
// remote into the local directory on demand, compressed shards decompressed (the zip kept only with keep_zip), and a
// cache_limit enforced by evicting the least recently used shards first. Processes sharing the local directory (the
// ranks of a node) coordinate through file locks: each file is fetched once per node, and eviction decisions are
// serialized. "Recently used" is the raw file's modification time, which readers refresh (at most once a second).
#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "compression.h"
#include "hashes.h"
#include "tessera/data/mds.h"
#include "tessera/storage/storage.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"

namespace tessera::data::mds {
namespace {

namespace fs = std::filesystem;
constexpr const char* kRemoteComponent = "mds";

// An exclusive flock on `path` (created), waited for up to `timeout_s` seconds. Locks taken through different opens
// exclude each other, within one process as across processes.
class NodeLock {
 public:
  NodeLock(const fs::path& path, double timeout_s, const std::string& what) {
    fs::create_directories(path.parent_path());
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw Error(kRemoteComponent, fmt::format("{}: cannot open lock file: {}", path.string(), std::strerror(errno)));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::close(fd_);
        throw Error(kRemoteComponent,
                    fmt::format("{}: another process has been fetching it for over {} s (lock {}); raise "
                                "download_timeout or check that process",
                                what, timeout_s, path.string()));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(7));  // Streaming's TICK
    }
  }
  ~NodeLock() {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  NodeLock(const NodeLock&) = delete;
  NodeLock& operator=(const NodeLock&) = delete;

 private:
  int fd_ = -1;
};

// storage::download with Streaming's download_retry (total attempts) and backoff (2^i + U(0, 0.5) seconds).
void download_with_retry(const std::string& uri, const fs::path& path, int attempts) {
  std::mt19937 rng(std::random_device{}());
  for (int i = 0;; ++i) {
    try {
      storage::download(uri, path.string());
      return;
    } catch (const Error& e) {
      if (i + 1 >= attempts) throw;
      const double wait = std::pow(2.0, i) + std::uniform_real_distribution<double>(0, 0.5)(rng);
      spdlog::warn("[mds] fetching {} failed ({}); retrying in {:.1f} s", uri, e.message(), wait);
      std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    }
  }
}

bool present(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

}  // namespace

uint64_t parse_cache_limit(const std::string& text) {
  std::string s;
  for (const char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c)))
      s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  const auto bad = [&] {
    return ConfigError(kRemoteComponent,
                       fmt::format("cache_limit {}: unsupported value/suffix (an integer byte count, or a "
                                   "number with one of b, kb, mb, gb, tb, pb, eb, zb, yb)",
                                   text));
  };
  static const std::pair<const char*, int> kUnits[] = {{"kb", 1}, {"mb", 2}, {"gb", 3}, {"tb", 4},
                                                       {"pb", 5}, {"eb", 6}, {"zb", 7}, {"yb", 8}};
  for (const auto& [suffix, power] : kUnits) {
    if (s.size() > 2 && s.compare(s.size() - 2, 2, suffix) == 0) {
      size_t used = 0;
      double v = 0;
      try {
        v = std::stod(s.substr(0, s.size() - 2), &used);
      } catch (const std::exception&) {
        throw bad();
      }
      if (used != s.size() - 2 || v <= 0) throw bad();
      return static_cast<uint64_t>(v * std::pow(1024.0, power));
    }
  }
  if (!s.empty() && s.back() == 'b') s.pop_back();
  if (s.empty() || !std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
    throw bad();
  return std::stoull(s);
}

std::string MDSDataset::remote_file(const std::string& basename) const {
  return storage::join(*options_.remote, basename);
}

void MDSDataset::fetch_index() {
  const fs::path index = fs::path(dir_) / "index.json";
  if (present(index)) return;  // as Streaming: a local index.json is used as it is
  fs::create_directories(dir_);
  NodeLock lock(fs::path(dir_) / ".tessera-locks" / "index.json.lock", options_.download_timeout,
                remote_file("index.json"));
  if (present(index)) return;
  download_with_retry(remote_file("index.json"), index, options_.download_retry);
}

void MDSDataset::touch(size_t k) {
  const int64_t now =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  if (touched_[k] == now) return;
  touched_[k] = now;
  const fs::path raw = fs::path(dir_) / shards_[k].raw_basename;
  ::utimensat(AT_FDCWD, raw.c_str(), nullptr, AT_SYMLINK_NOFOLLOW);  // a missing file is fine: it was evicted
}

uint64_t MDSDataset::cache_usage() const {
  std::error_code ec;
  uint64_t usage = fs::file_size(fs::path(dir_) / "index.json", ec);
  if (ec) usage = 0;
  for (const auto& s : shards_) {
    if (present(fs::path(dir_) / s.raw_basename)) usage += s.raw_bytes;
    if (s.zip_basename && present(fs::path(dir_) / *s.zip_basename)) usage += s.zip_bytes;
  }
  return usage;
}

void MDSDataset::make_room(size_t k) {
  const uint64_t limit = *options_.cache_limit;
  const uint64_t need = shards_[k].raw_bytes + shards_[k].zip_bytes;
  NodeLock lock(fs::path(dir_) / ".tessera-locks" / "cache.lock", options_.download_timeout, dir_ + " (cache)");
  uint64_t usage = cache_usage();
  while (usage + need > limit) {
    // The least recently used shard with files here (ties: the lowest id, as Streaming's argmin).
    std::optional<size_t> victim;
    fs::file_time_type oldest;
    for (size_t j = 0; j < shards_.size(); ++j) {
      if (j == k) continue;
      std::error_code ec;
      auto t = fs::last_write_time(fs::path(dir_) / shards_[j].raw_basename, ec);
      if (ec && shards_[j].zip_basename) t = fs::last_write_time(fs::path(dir_) / *shards_[j].zip_basename, ec);
      if (ec) continue;
      if (!victim || t < oldest) {
        victim = j;
        oldest = t;
      }
    }
    if (!victim) {
      throw Error(kRemoteComponent,
                  fmt::format("{}: cache_limit ({} bytes) is too low: nothing is left to evict to make "
                              "room for shard {} ({} bytes)",
                              dir_, limit, k, need));
    }
    const ShardInfo& v = shards_[*victim];
    std::error_code ec;
    if (fs::remove(writable_path(v.raw_basename), ec)) usage -= v.raw_bytes;
    if (v.zip_basename && fs::remove(writable_path(*v.zip_basename), ec)) usage -= v.zip_bytes;
    spdlog::debug("[mds] {}: evicted shard {} to make room for shard {}", dir_, *victim, k);
  }
}

void MDSDataset::fetch(size_t k) {
  const ShardInfo& info = shards_[k];
  const fs::path raw = writable_path(info.raw_basename);
  if (present(raw)) return;
  NodeLock lock(writable_path(".tessera-locks/" + info.raw_basename + ".lock"), options_.download_timeout,
                remote_file(info.raw_basename));
  if (present(raw)) return;  // another process of the node fetched it meanwhile
  if (options_.cache_limit) make_room(k);
  if (!info.zip_basename) {
    download_with_retry(remote_file(info.raw_basename), raw, options_.download_retry);
    return;  // verified when opened
  }
  const fs::path zip_path = writable_path(*info.zip_basename);
  if (!present(zip_path)) download_with_retry(remote_file(*info.zip_basename), zip_path, options_.download_retry);
  const std::string zip = util::read_file(zip_path.string(), kRemoteComponent);
  const auto corrupt = [&](const std::string& why) {
    fs::remove(zip_path);  // so that the next attempt fetches it again
    return Error(kRemoteComponent, fmt::format("{}: {} (fetched from {}; deleted)", zip_path.string(), why,
                                               remote_file(*info.zip_basename)));
  };
  if (zip.size() != info.zip_bytes) {
    throw corrupt(fmt::format("{} bytes, index.json says {}", zip.size(), info.zip_bytes));
  }
  if (options_.verify_hashes) {
    if (auto problem = detail::hash_problem(info.zip_hashes, zip)) throw corrupt(*problem);
  }
  util::write_file_atomically(
      raw.string(), detail::decompress(*info.compression, zip, info.raw_bytes, zip_path.string()), kRemoteComponent);
  if (!options_.keep_zip) fs::remove(zip_path);
}

void MDSDataset::prefetch(size_t k) {
  if (!options_.remote) return;
  if (!present(fs::path(dir_) / shards_[k].raw_basename)) fetch(k);
}

}  // namespace tessera::data::mds
