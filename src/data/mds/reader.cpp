// MDSDataset: index parsing, shard opening (decompress, verify, mmap) and sample access.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "compression.h"
#include "hashes.h"
#include "tessera/data/mds.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"
#include "tessera/util/safe_path.h"

namespace tessera::data::mds {
namespace {

namespace fs = std::filesystem;
constexpr const char* kReaderComponent = "mds";

std::string read_file(const fs::path& p) {
  return util::read_file(p.string(), kReaderComponent);
}

uint32_t u32_at(std::string_view b, size_t pos) {
  uint32_t v;
  std::memcpy(&v, b.data() + pos, 4);
  return v;
}

void verify(const std::vector<std::pair<std::string, std::string>>& expected, std::string_view data,
            const std::string& file) {
  if (auto problem = detail::hash_problem(expected, data)) throw Error(kReaderComponent, file + ": " + *problem);
}

}  // namespace

struct MDSDataset::OpenShard {
  void* addr = nullptr;
  size_t size = 0;
  ino_t inode = 0;  // of the raw file when mapped: gone or replaced means evicted
  std::string path;
  std::string_view bytes() const { return {static_cast<const char*>(addr), size}; }
  ~OpenShard() {
    if (addr != nullptr && addr != MAP_FAILED) ::munmap(addr, size);
  }
};

namespace {

std::vector<std::pair<std::string, std::string>> hashes_of(const nlohmann::json& file_info) {
  std::vector<std::pair<std::string, std::string>> out;
  if (file_info.contains("hashes")) {
    for (const auto& [algo, digest] : file_info.at("hashes").items()) out.emplace_back(algo, digest.get<std::string>());
  }
  return out;
}

// A shard's file name from index.json becomes a path under the dataset's folder: it must be a relative name that
// stays there (Streaming's merged indexes name shards "<subfolder>/shard.00000.mds"), and not one of the reader's own
// files.
void check_basename(const std::string& name, const std::string& where, size_t k, const char* key) {
  const auto first_segment = name.substr(0, name.find('/'));
  std::optional<std::string> why = util::unsafe_name_reason(name);
  if (!why && (name == "index.json" || first_segment == ".tessera-locks")) why = "is one of the reader's own files";
  if (why) {
    throw Error(kReaderComponent, fmt::format("{}: shard {}: {} \"{}\" {}: refusing to use it as a path under the "
                                              "dataset's folder",
                                              where, k, key, name.substr(0, 200), *why));
  }
}

}  // namespace

std::string MDSDataset::writable_path(const std::string& basename) const {
  return util::confined_path(dir_, basename, (fs::path(dir_) / "index.json").string(), kReaderComponent, "shard file")
      .string();
}

MDSDataset::MDSDataset(std::string dir, ReaderOptions options) : dir_(std::move(dir)), options_(std::move(options)) {
  const fs::path index_path = fs::path(dir_) / "index.json";
  if (options_.remote) fetch_index();
  if (!fs::exists(index_path))
    throw Error(kReaderComponent, fmt::format("{}: no index.json (not an MDS dataset?)", dir_));
  const std::string where = index_path.string();
  int64_t total = 0;
  std::shared_ptr<const ShardColumns> last_columns;
  // Each shard object is converted as soon as it is parsed and then dropped from the DOM, so a million-shard index
  // needs memory for one shard's JSON at a time, not the whole document.
  auto add_shard = [&](const nlohmann::json& s) {
    const size_t k = shards_.size();
    try {
      if (s.at("format").get<std::string>() != "mds") {
        throw Error(kReaderComponent, fmt::format("{}: shard {}: format \"{}\" is not supported (only mds)", where, k,
                                                  s.at("format").get<std::string>()));
      }
      if (s.at("version").get<int>() != 2)
        throw Error(kReaderComponent, fmt::format("{}: shard {}: version must be 2", where, k));
      ShardColumns cols;
      cols.names = s.at("column_names").get<std::vector<std::string>>();
      cols.encodings = s.at("column_encodings").get<std::vector<std::string>>();
      for (const auto& size : s.at("column_sizes")) {
        cols.sizes.push_back(size.is_null() ? std::nullopt : std::optional<int64_t>(size.get<int64_t>()));
      }
      if (!last_columns || !(*last_columns == cols)) {
        if (cols.names.size() != cols.encodings.size() || cols.names.size() != cols.sizes.size()) {
          throw Error(kReaderComponent, fmt::format("{}: shard {}: column lists differ in length", where, k));
        }
        for (size_t c = 0; c < cols.encodings.size(); ++c) {
          if (encoded_size(cols.encodings[c]) != cols.sizes[c]) {
            throw Error(kReaderComponent,
                        fmt::format("{}: shard {}: column_sizes disagree with the encodings", where, k));
          }
        }
        last_columns = std::make_shared<const ShardColumns>(std::move(cols));
      }
      ShardInfo info;
      info.columns = last_columns;
      info.samples = s.at("samples").get<int64_t>();
      if (!s.at("compression").is_null()) info.compression = s.at("compression").get<std::string>();
      const auto& raw = s.at("raw_data");
      info.raw_basename = raw.at("basename").get<std::string>();
      check_basename(info.raw_basename, where, k, "raw_data.basename");
      info.raw_bytes = raw.at("bytes").get<uint64_t>();
      if (info.raw_bytes > detail::kMaxRawShardBytes) {
        throw Error(kReaderComponent, fmt::format("{}: shard {}: raw_data.bytes {} is more than an MDS shard can hold "
                                                  "({}: its offsets are 32-bit)",
                                                  where, k, info.raw_bytes, detail::kMaxRawShardBytes));
      }
      info.raw_hashes = hashes_of(raw);
      if (!s.at("zip_data").is_null()) {
        const auto& zip = s.at("zip_data");
        info.zip_basename = zip.at("basename").get<std::string>();
        check_basename(*info.zip_basename, where, k, "zip_data.basename");
        info.zip_bytes = zip.at("bytes").get<uint64_t>();
        info.zip_hashes = hashes_of(zip);
        if (!info.compression)
          throw Error(kReaderComponent, fmt::format("{}: shard {}: zip_data without compression", where, k));
      }
      if (info.samples < 0) throw Error(kReaderComponent, fmt::format("{}: shard {}: negative sample count", where, k));
      total += info.samples;
      shards_.push_back(std::move(info));
      cumulative_.push_back(total);
    } catch (const nlohmann::json::exception& e) {
      throw Error(kReaderComponent, fmt::format("{}: shard {}: missing or malformed key ({})", where, k, e.what()));
    }
  };
  bool in_shards = false;
  nlohmann::json index;
  try {
    std::ifstream in(index_path, std::ios::binary);
    index = nlohmann::json::parse(in, [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
      if (event == nlohmann::json::parse_event_t::key && depth == 1) in_shards = parsed == "shards";
      if (event == nlohmann::json::parse_event_t::object_end && depth == 2 && in_shards) {
        add_shard(parsed);
        return false;  // drop the converted shard object
      }
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    throw Error(kReaderComponent, fmt::format("{}: not valid JSON ({})", where, e.what()));
  }
  if (!index.is_object() || index.value("version", 0) != 2) {
    throw Error(kReaderComponent,
                fmt::format("{}: unsupported index version {} (expected 2)", where,
                            index.is_object() && index.contains("version") ? index["version"].dump() : "none"));
  }
  if (!index.contains("shards") || !index["shards"].is_array()) {
    throw Error(kReaderComponent, fmt::format("{}: missing the \"shards\" list", where));
  }
  shards_.shrink_to_fit();
  cumulative_.shrink_to_fit();
  open_.resize(shards_.size());
  touched_.resize(shards_.size(), 0);
  set_cache_limit(options_.cache_limit);
}

MDSDataset::~MDSDataset() = default;

void MDSDataset::set_cache_limit(std::optional<uint64_t> limit) {
  options_.cache_limit = limit;
  if (!limit) return;
  // Streaming's checks (streaming/base/dataset.py): room for the index, and for four of the largest shards.
  const uint64_t index_bytes = fs::file_size(fs::path(dir_) / "index.json");
  uint64_t largest = 0;
  for (const auto& s : shards_) largest = std::max(largest, s.raw_bytes + s.zip_bytes);
  if (*limit <= index_bytes) {
    throw ConfigError(
        kReaderComponent,
        fmt::format("{}: cache_limit ({} bytes) is not larger than index.json ({} bytes)", dir_, *limit, index_bytes));
  }
  if (*limit < 4 * largest) {
    throw ConfigError(kReaderComponent,
                      fmt::format("{}: cache_limit ({} bytes) is too low: it must be at least four times "
                                  "the largest shard ({} bytes, raw plus compressed)",
                                  dir_, *limit, largest));
  }
}

std::pair<size_t, int64_t> MDSDataset::locate(int64_t sample) const {
  if (sample < 0 || sample >= size()) {
    throw Error(kReaderComponent,
                fmt::format("{}: sample {} is out of range (the dataset has {} samples)", dir_, sample, size()));
  }
  const size_t shard =
      static_cast<size_t>(std::upper_bound(cumulative_.begin(), cumulative_.end(), sample) - cumulative_.begin());
  const int64_t before = shard == 0 ? 0 : cumulative_[shard - 1];
  return {shard, sample - before};
}

std::shared_ptr<MDSDataset::OpenShard> MDSDataset::open(size_t k) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (options_.cache_limit) touch(k);
    if (open_[k]) return open_[k];
  }
  const ShardInfo& info = shards_[k];
  const fs::path raw_path = fs::path(dir_) / info.raw_basename;
  int fd = -1;
  // With a remote, fetch outside the lock (other threads keep reading mapped shards); another process may evict the
  // files before they are opened under a small cache_limit, so fetch again a few times (Streaming retries 7 times).
  for (int attempt = 0; options_.remote && fd < 0 && attempt < 8; ++attempt) {
    fetch(k);
    std::lock_guard<std::mutex> lock(mutex_);
    if (open_[k]) return open_[k];
    fd = ::open(raw_path.c_str(), O_RDONLY | O_CLOEXEC);
  }
  if (options_.remote && fd < 0) {
    throw Error(kReaderComponent, fmt::format("{}: shard {} was evicted again before it could be opened, 8 times: the "
                                              "cache_limit is too low for this many readers (thrashing)",
                                              raw_path.string(), k));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (open_[k]) {
    if (fd >= 0) ::close(fd);
    return open_[k];
  }
  if (options_.cache_limit) {
    // Unmap shards whose files a fetch evicted, once nobody reads them.
    for (auto& shard : open_) {
      struct stat st {};
      if (shard && shard.use_count() == 1 && (::stat(shard->path.c_str(), &st) != 0 || st.st_ino != shard->inode)) {
        shard.reset();
      }
    }
  }
  if (fd < 0 && !fs::exists(raw_path)) {
    if (!info.zip_basename) throw Error(kReaderComponent, fmt::format("{}: shard {} is missing", raw_path.string(), k));
    const fs::path zip_path = fs::path(dir_) / *info.zip_basename;
    if (!fs::exists(zip_path))
      throw Error(kReaderComponent, fmt::format("{}: shard {} is missing", zip_path.string(), k));
    const std::string zip = read_file(zip_path);
    if (zip.size() != info.zip_bytes) {
      throw Error(kReaderComponent, fmt::format("{}: {} bytes, index.json says {}: truncated or replaced",
                                                zip_path.string(), zip.size(), info.zip_bytes));
    }
    if (options_.verify_hashes) verify(info.zip_hashes, zip, zip_path.string());
    const std::string raw = detail::decompress(*info.compression, zip, info.raw_bytes, zip_path.string());
    // As Streaming: decompress to <raw>.tmp and rename, so a crash never leaves a partial raw shard; keep the zip.
    util::write_file_atomically(writable_path(info.raw_basename), raw, kReaderComponent);
  }
  if (fd < 0) fd = ::open(raw_path.c_str(), O_RDONLY | O_CLOEXEC);
  auto shard = std::make_shared<OpenShard>();
  if (fd < 0)
    throw Error(kReaderComponent, fmt::format("{}: cannot open: {}", raw_path.string(), std::strerror(errno)));
  struct stat st {};
  ::fstat(fd, &st);
  shard->size = static_cast<size_t>(st.st_size);
  shard->inode = st.st_ino;
  shard->path = raw_path.string();
  if (shard->size > 0) shard->addr = ::mmap(nullptr, shard->size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (shard->addr == MAP_FAILED) throw Error(kReaderComponent, fmt::format("{}: mmap failed", raw_path.string()));
  const std::string file = raw_path.string();
  const std::string_view b = shard->bytes();
  if (b.size() != info.raw_bytes) {
    if (options_.remote) fs::remove(writable_path(info.raw_basename));  // fetched: fetch it again next time
    throw Error(kReaderComponent,
                fmt::format("{}: {} bytes, index.json says {}: truncated or replaced", file, b.size(), info.raw_bytes));
  }
  if (options_.verify_hashes) {
    try {
      verify(info.raw_hashes, b, file);
    } catch (const Error&) {
      if (options_.remote) fs::remove(writable_path(info.raw_basename));  // fetched: fetch it again next time
      throw;
    }
  }
  const uint64_t n = static_cast<uint64_t>(info.samples);
  if (b.size() < 4 + 4 * (n + 1) || u32_at(b, 0) != n) {
    throw Error(kReaderComponent, fmt::format("{}: header says {} samples, index.json says {}", file,
                                              b.size() >= 4 ? u32_at(b, 0) : 0, n));
  }
  uint32_t prev = u32_at(b, 4);
  if (prev < 4 + 4 * (n + 1)) throw Error(kReaderComponent, fmt::format("{}: corrupt offsets", file));
  for (uint64_t i = 1; i <= n; ++i) {
    const uint32_t cur = u32_at(b, 4 + 4 * i);
    if (cur < prev) throw Error(kReaderComponent, fmt::format("{}: corrupt offsets at sample {}", file, i - 1));
    prev = cur;
  }
  if (prev != b.size())
    throw Error(kReaderComponent, fmt::format("{}: offsets end at {}, the file has {} bytes", file, prev, b.size()));
  open_[k] = shard;
  return shard;
}

namespace {

std::string_view sample_bytes(std::string_view shard, int64_t idx) {
  const uint32_t begin = u32_at(shard, 4 + 4 * static_cast<size_t>(idx));
  const uint32_t end = u32_at(shard, 8 + 4 * static_cast<size_t>(idx));
  return shard.substr(begin, end - begin);
}

}  // namespace

std::string MDSDataset::raw_sample(int64_t sample) {
  const auto [k, idx] = locate(sample);
  return std::string(sample_bytes(open(k)->bytes(), idx));
}

namespace {

// Splits a sample into its columns' bytes; `file` and `sample` name it in errors.
std::vector<std::string_view> split_columns(const ShardInfo& info, std::string_view s, const std::string& where) {
  size_t head = 0;
  for (const auto& size : info.columns->sizes) head += size ? 0 : 4;
  if (s.size() < head) throw Error(kReaderComponent, fmt::format("{}: sample shorter than its size prefixes", where));
  std::vector<std::string_view> out;
  size_t pos = head, var = 0;
  for (const auto& size : info.columns->sizes) {
    const size_t n = size ? static_cast<size_t>(*size) : u32_at(s, 4 * var++);
    if (pos + n > s.size()) throw Error(kReaderComponent, fmt::format("{}: column sizes exceed the sample", where));
    out.push_back(s.substr(pos, n));
    pos += n;
  }
  if (pos != s.size())
    throw Error(kReaderComponent, fmt::format("{}: {} bytes left after the last column", where, s.size() - pos));
  return out;
}

}  // namespace

Sample MDSDataset::get(int64_t sample) {
  const auto [k, idx] = locate(sample);
  const ShardInfo& info = shards_[k];
  const std::string where = fmt::format("{}/{}: sample {}", dir_, info.raw_basename, idx);
  const auto shard = open(k);  // held while decoding: an evicted shard stays mapped until released
  const auto cols = split_columns(info, sample_bytes(shard->bytes(), idx), where);
  Sample out;
  for (size_t c = 0; c < cols.size(); ++c) {
    try {
      out[info.columns->names[c]] = decode(info.columns->encodings[c], cols[c]);
    } catch (const Error& e) {
      throw Error(kReaderComponent, fmt::format("{}: column {}: {}", where, info.columns->names[c], e.message()));
    }
  }
  return out;
}

std::string MDSDataset::column(int64_t sample, const std::string& name) {
  const auto [k, idx] = locate(sample);
  const ShardInfo& info = shards_[k];
  const auto& names = info.columns->names;
  const auto it = std::find(names.begin(), names.end(), name);
  if (it == names.end()) {
    throw Error(kReaderComponent, fmt::format("{}/{}: no column \"{}\"", dir_, info.raw_basename, name));
  }
  const std::string where = fmt::format("{}/{}: sample {}", dir_, info.raw_basename, idx);
  const auto shard = open(k);
  return std::string(
      split_columns(info, sample_bytes(shard->bytes(), idx), where)[static_cast<size_t>(it - names.begin())]);
}

}  // namespace tessera::data::mds
