// MDSWriter: shards and index.json byte-identical to mosaicml-streaming's MDSWriter.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>

#include "compression.h"
#include "tessera/data/mds.h"
#include "tessera/storage/storage.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"
#include "tessera/util/hashing.h"
#include "tessera/util/python_json.h"

namespace tessera::data::mds {
namespace {

namespace fs = std::filesystem;
constexpr const char* kComponent = "mds";

void put_u32(std::string& out, uint64_t v) {
  const auto x = static_cast<uint32_t>(v);
  out.append(reinterpret_cast<const char*>(&x), 4);
}

}  // namespace

MDSWriter::MDSWriter(WriterOptions options) : o_(std::move(options)) {
  if (o_.columns.empty()) throw Error(kComponent, "an MDS dataset needs at least one column");
  for (const auto& [name, enc] : o_.columns) {  // std::map: sorted by name, as Streaming sorts columns
    names_.push_back(name);
    encodings_.push_back(enc);
    sizes_.push_back(encoded_size(enc));
  }
  if (!std::is_sorted(o_.hashes.begin(), o_.hashes.end())) {
    throw Error(kComponent, "hashes must be given in sorted order (as Streaming requires)");
  }
  for (const std::string& h : o_.hashes) {
    if (!util::hash_supported(h))
      throw Error(kComponent,
                  fmt::format("hash \"{}\" is not supported ({})", h, fmt::join(util::supported_hashes(), ", ")));
  }
  if (o_.size_limit && *o_.size_limit >= (uint64_t{1} << 32)) {
    throw Error(kComponent, "size_limit must be below 4 GiB: shard offsets are uint32");
  }
  if (o_.compression) detail::compression_extension(*o_.compression);  // validates
  if (storage::is_remote(o_.out)) {
    if (!o_.exist_ok && storage::stat(storage::join(o_.out, "index.json"))) {
      throw Error(kComponent,
                  fmt::format("{}: already holds a dataset (index.json; set exist_ok to write over it)", o_.out));
    }
    if (o_.local) {
      dir_ = *o_.local;
    } else {
      dir_ = util::make_temp_dir("tessera-mds", kComponent);
    }
  } else {
    dir_ = o_.out;
  }
  if (fs::exists(dir_) && !fs::is_empty(dir_) && !o_.exist_ok) {
    throw Error(kComponent, fmt::format("{}: directory exists and is not empty (set exist_ok to write into it)", dir_));
  }
  fs::create_directories(dir_);
  if (o_.resume_shards) {
    if (storage::is_remote(o_.out))
      throw Error(kComponent, fmt::format("{}: resuming needs a local directory", o_.out));
    shards_ = *o_.resume_shards;
    for (const auto& shard : shards_) total_samples_ += shard.at("samples").get<int64_t>();
  }
  config_ = config_json();  // constant for the dataset: every shard embeds it
  pending_bytes_ = 8 + config_.size();
}

MDSWriter::~MDSWriter() {
  if (!finished_ && (total_samples_ > 0 || !pending_.empty())) {
    spdlog::warn("[mds] {}: writer destroyed without finish(); no index.json was written", o_.out);
  }
}

std::string MDSWriter::config_json() const {
  nlohmann::ordered_json cfg = {
      {"column_encodings", encodings_},
      {"column_names", names_},
      {"column_sizes", nlohmann::ordered_json::array()},
      {"compression", o_.compression ? nlohmann::ordered_json(*o_.compression) : nlohmann::ordered_json()},
      {"format", "mds"},
      {"hashes", o_.hashes},
      {"size_limit", o_.size_limit ? nlohmann::ordered_json(*o_.size_limit) : nlohmann::ordered_json()},
      {"version", 2}};
  for (const auto& s : sizes_) cfg["column_sizes"].push_back(s ? nlohmann::ordered_json(*s) : nlohmann::ordered_json());
  return util::python_json_dumps(cfg, /*sort_keys=*/true);
}

void MDSWriter::write(const Sample& sample) {
  if (finished_) throw Error(kComponent, fmt::format("{}: write after finish()", o_.out));
  std::string head, body;
  for (size_t i = 0; i < names_.size(); ++i) {
    auto it = sample.find(names_[i]);
    if (it == sample.end())
      throw Error(kComponent, fmt::format("sample {}: missing column \"{}\"", total_samples_, names_[i]));
    const std::string bytes = encode(encodings_[i], it->second);
    if (sizes_[i]) {
      if (static_cast<int64_t>(bytes.size()) != *sizes_[i]) {
        throw Error(kComponent, fmt::format("sample {}: column \"{}\" ({}) encodes to {} bytes, expected {}",
                                            total_samples_, names_[i], encodings_[i], bytes.size(), *sizes_[i]));
      }
    } else {
      put_u32(head, bytes.size());
    }
    body += bytes;
  }
  if (sample.size() != names_.size()) {
    for (const auto& [name, v] : sample) {
      if (!o_.columns.count(name))
        throw Error(kComponent, fmt::format("sample {}: unknown column \"{}\"", total_samples_, name));
    }
  }
  std::string encoded = head + body;
  // Streaming's rule: flush first if this sample would push the shard past size_limit (an oversized first sample
  // therefore flushes an empty shard).
  if (o_.size_limit && *o_.size_limit < pending_bytes_ + encoded.size() + 4) flush_shard();
  pending_bytes_ += encoded.size() + 4;
  if (pending_bytes_ >= (uint64_t{1} << 32)) {
    throw Error(kComponent, fmt::format("{}: shard would reach 4 GiB (uint32 offsets); use a size_limit", o_.out));
  }
  pending_.push_back(std::move(encoded));
  ++total_samples_;
}

void MDSWriter::flush_shard() {
  const std::string& config = config_;
  const uint64_t n = pending_.size();
  std::string raw;
  put_u32(raw, n);
  uint64_t offset = 4 + 4 * (n + 1) + config.size();
  put_u32(raw, offset);
  for (const std::string& s : pending_) put_u32(raw, offset += s.size());
  raw += config;
  for (const std::string& s : pending_) raw += s;
  const size_t index = shards_.size();
  const std::string raw_name = fmt::format("shard.{:05d}.mds", index);
  nlohmann::ordered_json raw_info = {
      {"basename", raw_name}, {"bytes", raw.size()}, {"hashes", nlohmann::ordered_json::object()}};
  for (const std::string& h : o_.hashes) raw_info["hashes"][h] = util::hex_digest(h, raw);
  nlohmann::ordered_json zip_info;  // null
  if (o_.compression) {
    const std::string zip = detail::compress(*o_.compression, raw);
    const std::string zip_name = raw_name + "." + detail::compression_extension(*o_.compression);
    zip_info = {{"basename", zip_name}, {"bytes", zip.size()}, {"hashes", nlohmann::ordered_json::object()}};
    for (const std::string& h : o_.hashes) zip_info["hashes"][h] = util::hex_digest(h, zip);
    publish(zip_name, zip);
  } else {
    publish(raw_name, raw);
  }
  nlohmann::ordered_json shard = nlohmann::ordered_json::parse(config);
  shard["raw_data"] = raw_info;
  shard["samples"] = n;
  shard["zip_data"] = zip_info;
  shards_.push_back(std::move(shard));
  pending_.clear();
  pending_bytes_ = 8 + config.size();
  if (o_.index_every_shard) {
    publish("index.json", util::python_json_dumps({{"shards", shards_}, {"version", 2}}, /*sort_keys=*/true));
  }
  if (o_.on_shard) o_.on_shard(static_cast<int64_t>(shards_.size()), total_samples_);
}

void MDSWriter::finish() {
  if (finished_) return;
  if (!pending_.empty()) flush_shard();
  const nlohmann::ordered_json index = {{"shards", shards_}, {"version", 2}};
  publish("index.json", util::python_json_dumps(index, /*sort_keys=*/true));
  if (storage::is_remote(o_.out) && !o_.keep_local) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  finished_ = true;
}

void MDSWriter::publish(const std::string& name, std::string_view bytes) {
  const std::string path = (fs::path(dir_) / name).string();
  util::write_file_atomically(path, bytes, kComponent);
  if (!storage::is_remote(o_.out)) return;
  storage::upload(path, storage::join(o_.out, name));
  if (!o_.keep_local) fs::remove(path);
}

}  // namespace tessera::data::mds
