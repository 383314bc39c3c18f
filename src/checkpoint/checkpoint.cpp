// The sharded checkpoint format (see checkpoint.h): rank files, receipts, atomic publication, the save folder's
// listing, cleanup and validation. The resharding reads are in checkpoint_reader.cpp.
#include "tessera/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "checkpoint_detail.h"
#include "tessera/checkpoint/safetensors.h"
#include "tessera/storage/storage.h"
#include "tessera/util/error.h"
#include "tessera/util/file_env.h"
#include "tessera/util/file_io.h"
#include "tessera/util/safe_path.h"

namespace tessera::checkpoint {
namespace detail {

[[noreturn]] void fail_checkpoint(const std::string& path, const std::string& message) {
  throw Error(kCheckpointComponent, fmt::format("{}: {}", path, message));
}

}  // namespace detail

using namespace detail;  // NOLINT(google-build-using-namespace): the format's own helpers (checkpoint_detail.h)

namespace {

namespace fs = std::filesystem;

std::string rank_file_name(int rank) {
  return fmt::format("rank{}.safetensors", rank);
}

std::string receipt_name(int rank) {
  return fmt::format("rank{}.receipt.json", rank);
}

std::string piece_key(const Piece& p) {
  return p.cols > 0 ? fmt::format("{}@c{}@{}", p.tensor, p.col_start, p.start)
                    : fmt::format("{}@{}", p.tensor, p.start);
}

std::string xxh64_hex(uint64_t h) {
  return fmt::format("{:016x}", h);
}

// fsync of a directory, so that a rename or a new entry in it is durable.
void sync_dir(const std::string& dir) {
  util::FileEnv& env = util::file_env();
  const int fd = env.open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
  if (fd < 0) fail_checkpoint(dir, fmt::format("cannot open directory to fsync: {}", std::strerror(errno)));
  const int rc = env.fsync(fd, dir);
  const int err = errno;
  env.close(fd, dir);
  if (rc != 0) fail_checkpoint(dir, fmt::format("fsync failed: {}", std::strerror(err)));
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail_checkpoint(path, "cannot open");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail_checkpoint(path, fmt::format("not valid JSON ({})", e.what()));
  }
}

// metadata.json's file names are joined onto the checkpoint's folder (a remote one's also onto the reader's download
// folder): each must be a safe relative name, checked as the file is read, before anything is fetched or written.
void check_file_names(const nlohmann::json& m, const std::string& dir, const std::string& path) {
  if (!m.is_object() || !m.contains("files")) return;
  const nlohmann::json& files = m.at("files");
  if (!files.is_array()) fail_checkpoint(path, "\"files\" is not a list");
  for (const nlohmann::json& f : files) {
    if (!f.is_object() || !f.contains("name") || !f.at("name").is_string())
      fail_checkpoint(path, fmt::format("an entry of \"files\" has no \"name\" string: {}", f.dump()));
    util::confined_path(dir, f.at("name").get_ref<const std::string&>(), path, kCheckpointComponent, "file name",
                        util::Confine::kLexical);
  }
}

// A checkpoint's batch for ordering (its metadata's timestamp, -1 without one), or nullopt when `dir` is not a
// Tessera checkpoint: no metadata.json, one that does not parse, or one without the format marker (a folder of the
// user's that happens to hold a metadata.json).
std::optional<int64_t> checkpoint_batch(const std::string& dir) {
  try {
    const nlohmann::json m = read_metadata(dir);
    if (!m.is_object() || m.value("format", "") != "tessera-checkpoint") return std::nullopt;
    const nlohmann::json& t = m.value("timestamp", nlohmann::json::object());
    return t.is_object() && t.contains("batch") && t.at("batch").is_number_integer() ? t.at("batch").get<int64_t>()
                                                                                     : -1;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// xxh64 of a remote object, read in ranges of 64 MiB (memory stays bounded whatever its size).
std::string remote_xxh64(const std::string& uri, uint64_t size) {
  constexpr uint64_t kRange = uint64_t{64} << 20;
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  try {
    for (uint64_t off = 0; off < size; off += kRange) {
      const std::string bytes = storage::read_range(uri, off, std::min(kRange, size - off));
      XXH64_update(st, bytes.data(), bytes.size());
    }
  } catch (...) {
    XXH64_freeState(st);
    throw;
  }
  const uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  return xxh64_hex(h);
}

// The metadata.json publish_checkpoint writes: the caller's fields plus the format's, built from the ranks' receipts.
nlohmann::json merge_receipts(const std::string& where, nlohmann::json metadata,
                              const std::vector<nlohmann::json>& receipts) {
  const int world_size = static_cast<int>(receipts.size());
  nlohmann::json tensors = nlohmann::json::object();
  nlohmann::json files = nlohmann::json::array();
  nlohmann::json locals = nlohmann::json::object();
  for (int r = 0; r < world_size; ++r) {
    const nlohmann::json& rc = receipts[static_cast<size_t>(r)];
    if (rc.value("file", "") != rank_file_name(r)) {
      fail_checkpoint(where, fmt::format("rank {}'s receipt names the file {}, not {}", r,
                                         rc.value("file", nlohmann::json()).dump(), rank_file_name(r)));
    }
    files.push_back({{"rank", r}, {"name", rc.at("file")}, {"bytes", rc.at("bytes")}, {"xxh64", rc.at("xxh64")}});
    if (!rc.at("local").empty()) locals[std::to_string(r)] = rc.at("local");
    for (const nlohmann::json& pc : rc.at("pieces")) {
      const std::string name = pc.at("tensor").get<std::string>();
      nlohmann::json& t = tensors[name];
      if (t.is_null()) t = {{"shape", pc.at("shape")}, {"dtype", pc.at("dtype")}, {"pieces", nlohmann::json::array()}};
      if (t.at("shape") != pc.at("shape"))
        fail_checkpoint(where, fmt::format("ranks disagree on the shape of {}", name));
      nlohmann::json entry = {{"rank", r}, {"key", pc.at("key")}, {"start", pc.at("start")}, {"numel", pc.at("numel")}};
      if (pc.contains("cols")) {
        if (pc.at("shape").size() != 2)
          fail_checkpoint(where, fmt::format("{}: a column window on a tensor that is not 2-D", name));
        entry["col_start"] = pc.at("col_start");
        entry["cols"] = pc.at("cols");
      }
      t["pieces"].push_back(std::move(entry));
    }
  }
  metadata["format"] = "tessera-checkpoint";
  metadata["format_version"] = kFormatVersion;
  metadata["world_size"] = world_size;
  metadata["tensors"] = std::move(tensors);
  metadata["local_tensors"] = std::move(locals);
  metadata["files"] = std::move(files);
  return metadata;
}

// Polls until `ready` (up to `deadline`, or until `*stop`), sleeping 5 ms at first and up to 100 ms (remote polls
// cost a request).
template <class Ready>
bool poll_until(const Ready& ready, std::chrono::steady_clock::time_point deadline,
                const std::atomic<bool>* stop = nullptr) {
  auto pause = std::chrono::milliseconds(5);
  while (!ready()) {
    if (std::chrono::steady_clock::now() > deadline || (stop != nullptr && stop->load())) return false;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
  return true;
}

// ---- Remote save folders (s3://) ----------------------------------------------------------------------------------
// No directories and no rename: the ranks upload their files straight to folder/name/, each followed by a receipt
// naming the save's attempt; rank 0 waits for this attempt's receipts, writes metadata.json (the object that makes the
// checkpoint count), removes the receipts and anything else under the prefix, and writes the `latest` object (the
// checkpoint's name) last.

// Why rank `r`'s receipt is missing: the wait ended at the timeout, or the run is ending (`*stop`).
std::string missing_receipt(int r, const std::string& what, std::chrono::milliseconds timeout,
                            const std::atomic<bool>* stop) {
  if (stop != nullptr && stop->load()) {
    return fmt::format("rank {} had not finished {} {} when this run ended on an error; the save is abandoned", r, what,
                       rank_file_name(r));
  }
  return fmt::format("rank {} did not finish {} {} within {} s", r, what, rank_file_name(r), timeout.count() / 1000);
}

// The `latest` object of a remote folder: written over the version this process found or wrote there last, never
// over another writer's (storage::write_if: checked by the store on S3, Azure, OCI, GCS and the Hub). A second run
// saving into the same folder would otherwise point `latest` at its checkpoints between this run's saves, and each
// run's autoresume at the other's; it fails this run's save instead, naming the folder.
void write_latest(const std::string& uri, const std::string& name) {
  static std::mutex mutex;
  static std::map<std::string, std::optional<std::string>> seen;  // uri -> the ETag last written (nullopt: none)
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = seen.find(uri);
  if (it == seen.end()) {  // the first save of this process: whatever is there now
    const std::optional<storage::ObjectInfo> now = storage::stat(uri);
    it = seen.emplace(uri, now ? std::optional<std::string>(now->etag) : std::nullopt).first;
  }
  const std::optional<std::string> etag = storage::write_if(uri, name, it->second);
  if (!etag) {
    const std::optional<storage::ObjectInfo> now = storage::stat(uri);
    const std::string holds = now ? fmt::format("now names \"{}\"", storage::read(uri).substr(0, 200)) : "is gone";
    fail_checkpoint(uri, fmt::format("was changed by another writer since this run last wrote it (it {}): two runs "
                                     "save into this folder, and each would resume from the other's checkpoints; "
                                     "give each run its own save_folder ({} was saved, `latest` not moved)",
                                     holds, name));
  }
  it->second = etag;
}

void publish_remote(const PendingCheckpoint& p, nlohmann::json metadata, int world_size,
                    std::chrono::milliseconds timeout, const std::string& latest_name, const std::atomic<bool>* stop) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<nlohmann::json> receipts(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    const std::string uri = storage::join(p.final_dir, receipt_name(r));
    nlohmann::json& receipt = receipts[static_cast<size_t>(r)];
    const bool came = poll_until(
        [&] {
          if (!storage::stat(uri)) return false;
          receipt = nlohmann::json::parse(storage::read(uri), nullptr, /*allow_exceptions=*/false);
          // A receipt of an earlier, interrupted attempt at this checkpoint does not count.
          return receipt.is_object() && receipt.value("attempt", "") == p.attempt;
        },
        deadline, stop);
    if (!came) fail_checkpoint(p.final_dir, missing_receipt(r, "uploading", timeout, stop));
  }
  metadata = merge_receipts(p.final_dir, std::move(metadata), receipts);
  storage::write(storage::join(p.final_dir, kMetadata), metadata.dump(1) + "\n");
  // Receipts, and files of earlier attempts (e.g. of ranks beyond this world size).
  std::set<std::string> keep = {storage::join(p.final_dir, kMetadata)};
  for (const nlohmann::json& f : metadata.at("files"))
    keep.insert(storage::join(p.final_dir, f.at("name").get<std::string>()));
  for (const storage::ObjectInfo& o : storage::list(p.final_dir + "/")) {
    if (!keep.count(o.uri)) storage::remove(o.uri);
  }
  if (!latest_name.empty()) write_latest(storage::join(p.folder, latest_name), p.name);
}

// Every object folder/<name>/<file> of a remote folder as (folder/<name>, <file>), from one listing.
std::vector<std::pair<std::string, std::string>> remote_children(const std::string& folder) {
  std::vector<std::pair<std::string, std::string>> out;
  const std::string prefix = storage::join(folder, "");
  for (const storage::ObjectInfo& o : storage::list(prefix)) {
    const std::string rest = o.uri.substr(prefix.size());
    const size_t slash = rest.find('/');
    if (slash == std::string::npos || slash == 0) continue;
    // A listing is not trusted: a "." or ".." segment names no prefix of this folder.
    if (util::unsafe_name_reason(rest.substr(0, slash))) continue;
    out.emplace_back(storage::join(folder, rest.substr(0, slash)), rest.substr(slash + 1));
  }
  return out;
}

// The checkpoint `latest_name` points at (a symlink locally; remotely an object holding the name), if any. What it
// holds must be one safe name, of a folder beside it: a pointer that leads elsewhere is an error naming it.
std::optional<std::string> latest_target(const std::string& folder, const std::string& latest_name) {
  if (latest_name.empty()) return std::nullopt;
  const std::string latest = storage::join(folder, latest_name);
  std::string target;
  if (remote(folder)) {
    if (!storage::stat(latest)) return std::nullopt;
    target = storage::read(latest);
    while (!target.empty() && std::isspace(static_cast<unsigned char>(target.back()))) target.pop_back();
    if (target.empty()) return std::nullopt;
  } else {
    std::error_code ec;
    const fs::path link = fs::path(folder) / latest_name;
    if (!fs::is_symlink(link, ec)) return std::nullopt;
    target = fs::read_symlink(link, ec).string();
    if (ec) return std::nullopt;
  }
  const std::optional<std::string> why = target.find('/') != std::string::npos ? std::optional<std::string>("has a '/'")
                                                                               : util::unsafe_name_reason(target);
  if (why) {
    fail_checkpoint(latest, fmt::format("points at \"{}\", which {}: refusing to follow it (Tessera's latest pointer "
                                        "holds the name of one checkpoint in the folder)",
                                        target, *why));
  }
  return storage::join(folder, target);
}

// How candidates are compared: lexically normal local paths, URIs as they are.
std::string normal(const std::string& dir) {
  return remote(dir) ? dir : fs::path(dir).lexically_normal().string();
}

}  // namespace

namespace detail {

bool remote(const std::string& location) {
  return storage::is_remote(location);
}

// xxh64 of a mapped file. A helper thread faults its pages in, 8 MiB at a time (MADV_POPULATE_READ, Linux 5.14+;
// a read-ahead hint elsewhere), while this thread hashes the chunks already in: the disk and the hash run at once. The
// pages stay mapped, so the tensor copies that follow read memory instead of faulting again: verifying and loading
// cost about one pass over the disk, not two.
std::string mapped_xxh64(std::string_view bytes) {
#ifndef MADV_POPULATE_READ
  constexpr int MADV_POPULATE_READ = 22;
#endif
  constexpr size_t kChunk = size_t{8} << 20;
  auto* base = const_cast<char*>(bytes.data());
  ::madvise(base, bytes.size(), MADV_SEQUENTIAL);
  std::mutex mutex;
  std::condition_variable ready;
  size_t populated = 0;  // bytes faulted in (or hinted) so far
  // Joined when this function returns or unwinds (declared after what it uses, so destroyed before it).
  std::jthread reader([&] {
    for (size_t off = 0; off < bytes.size();) {
      size_t n = std::min(kChunk, bytes.size() - off);
      if (::madvise(base + off, n, MADV_POPULATE_READ) != 0) {
        n = bytes.size() - off;  // an older kernel: read-ahead for the rest, faulted in as it is hashed
        ::madvise(base + off, n, MADV_WILLNEED);
      }
      off += n;
      {
        std::lock_guard<std::mutex> lock(mutex);
        populated = off;
      }
      ready.notify_one();
    }
  });
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  for (size_t off = 0; off < bytes.size(); off += kChunk) {
    const size_t n = std::min(kChunk, bytes.size() - off);
    {
      std::unique_lock<std::mutex> lock(mutex);
      ready.wait(lock, [&] { return populated >= off + n; });
    }
    XXH64_update(st, base + off, n);
  }
  const uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  return xxh64_hex(h);
}

// A checkpoint's metadata.json, local or remote, its file names checked.
nlohmann::json read_metadata(const std::string& dir) {
  const std::string path = storage::join(dir, kMetadata);
  nlohmann::json m;
  if (!remote(dir)) {
    m = read_json(path);
  } else {
    const std::string text = storage::read(path);
    try {
      m = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      fail_checkpoint(path, fmt::format("not valid JSON ({})", e.what()));
    }
  }
  check_file_names(m, dir, path);
  return m;
}

// The path of a file metadata.json lists (its name checked by read_metadata): folder/name, URIs as they are.
std::string listed_file(const std::string& dir, const std::string& name) {
  if (remote(dir)) return storage::join(dir, name);
  return util::confined_path(dir, name, storage::join(dir, kMetadata), kCheckpointComponent, "file name",
                             util::Confine::kLexical)
      .string();
}

}  // namespace detail

PendingCheckpoint begin_checkpoint(const std::string& folder, const std::string& name, int rank,
                                   std::chrono::milliseconds timeout, const std::string& attempt) {
  PendingCheckpoint p;
  p.folder = folder;
  p.name = name;
  p.attempt = attempt;
  if (remote(folder)) {
    p.final_dir = p.temp_dir = storage::join(folder, name);
    // A checkpoint saved again under the same name stops counting before any of its files is replaced.
    if (rank == 0) storage::remove(storage::join(p.final_dir, kMetadata));
    return p;
  }
  p.final_dir = (fs::path(folder) / name).string();
  p.temp_dir = (fs::path(folder) / (".tmp-" + name)).string();
  if (rank == 0) {
    util::FileEnv& env = util::file_env();
    if (env.create_directories(folder) != 0) {
      fail_checkpoint(folder, fmt::format("cannot create the save folder: {}", std::strerror(errno)));
    }
    env.remove_all(p.temp_dir);  // left over from a crashed save of the same name
    if (env.mkdir(p.temp_dir, 0755) != 0)
      fail_checkpoint(p.temp_dir, fmt::format("cannot create: {}", std::strerror(errno)));
    return p;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!fs::is_directory(p.temp_dir)) {
    if (std::chrono::steady_clock::now() > deadline) {
      fail_checkpoint(p.temp_dir,
                      fmt::format("rank 0 did not create it within {} s (is the save folder on a filesystem every "
                                  "rank shares?)",
                                  timeout.count() / 1000));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return p;
}

uint64_t write_rank_file(const PendingCheckpoint& p, int rank, const RankPayload& payload) {
  // safetensors layout: header length, JSON header, data; tensors in key order.
  std::map<std::string, at::Tensor> tensors;
  nlohmann::json pieces = nlohmann::json::array();
  for (const auto& [piece, values] : payload.pieces) {
    if (values.numel() != piece.numel) {
      throw Error(kCheckpointComponent,
                  fmt::format("piece {} of {} has {} values", piece_key(piece), piece.numel, values.numel()));
    }
    const std::string key = piece_key(piece);
    tensors[key] = values.detach().reshape({-1});
    pieces.push_back({{"tensor", piece.tensor},
                      {"shape", piece.shape},
                      {"dtype", dtype_name(values.scalar_type())},
                      {"start", piece.start},
                      {"numel", piece.numel},
                      {"key", key}});
    if (piece.cols > 0) {
      pieces.back()["col_start"] = piece.col_start;
      pieces.back()["cols"] = piece.cols;
    }
  }
  nlohmann::json locals = nlohmann::json::array();
  for (const auto& [key, t] : payload.local) {
    tensors["local/" + key] = t.detach();
    locals.push_back(key);
  }
  // The safetensors bytes, hashed from memory as they are written: no second pass over the file.
  std::vector<TensorLayout> layout;
  std::vector<at::Tensor> data;
  for (const auto& [key, t] : tensors) {
    at::Tensor c = t.to(at::kCPU).contiguous();
    layout.push_back({key, c.scalar_type(), c.sizes().vec()});
    data.push_back(std::move(c));
  }
  const std::string header = safetensors_header(layout);
  std::vector<std::string_view> parts = {header};
  for (const at::Tensor& c : data) parts.emplace_back(static_cast<const char*>(c.data_ptr()), c.nbytes());
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  uint64_t bytes = 0;
  const auto hash = [&](std::string_view chunk) {
    XXH64_update(st, chunk.data(), chunk.size());
    bytes += chunk.size();
  };
  const std::string path = storage::join(p.temp_dir, rank_file_name(rank));
  try {
    if (remote(path)) {
      // Uploaded from the host copy, no local file: hashed from memory first (the receipt needs the digest).
      for (std::string_view part : parts) hash(part);
      storage::write_parts(path, parts);
    } else {
      util::write_file_atomically(path, parts, kCheckpointComponent, hash);
    }
  } catch (...) {
    XXH64_freeState(st);
    throw;
  }
  const std::string digest = xxh64_hex(XXH64_digest(st));
  XXH64_freeState(st);
  const nlohmann::json receipt = {{"rank", rank},        {"file", rank_file_name(rank)}, {"bytes", bytes},
                                  {"xxh64", digest},     {"pieces", std::move(pieces)},  {"local", std::move(locals)},
                                  {"attempt", p.attempt}};
  const std::string receipt_path = storage::join(p.temp_dir, receipt_name(rank));
  if (remote(receipt_path)) {
    storage::write(receipt_path, receipt.dump());
  } else {
    util::write_file_atomically(receipt_path, receipt.dump(), kCheckpointComponent);
  }
  return bytes;
}

void publish_checkpoint(const PendingCheckpoint& p, nlohmann::json metadata, int world_size,
                        std::chrono::milliseconds timeout, const std::string& latest_name,
                        const std::atomic<bool>* stop) {
  try {
    if (remote(p.folder)) {
      publish_remote(p, std::move(metadata), world_size, timeout, latest_name, stop);
      return;
    }
    // Every rank's receipt: its file is complete and fsynced.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::vector<nlohmann::json> receipts(static_cast<size_t>(world_size));
    for (int r = 0; r < world_size; ++r) {
      const fs::path rp = fs::path(p.temp_dir) / receipt_name(r);
      if (!poll_until([&] { return fs::exists(rp); }, deadline, stop)) {
        fail_checkpoint(p.temp_dir, missing_receipt(r, "writing", timeout, stop));
      }
      receipts[static_cast<size_t>(r)] = read_json(rp.string());
    }
    metadata = merge_receipts(p.temp_dir, std::move(metadata), receipts);
    util::write_file_atomically((fs::path(p.temp_dir) / kMetadata).string(), metadata.dump(1) + "\n",
                                kCheckpointComponent);
    util::FileEnv& env = util::file_env();
    for (int r = 0; r < world_size; ++r) {
      const std::string receipt = (fs::path(p.temp_dir) / receipt_name(r)).string();
      if (env.unlink(receipt) != 0) fail_checkpoint(receipt, fmt::format("cannot remove: {}", std::strerror(errno)));
    }
    sync_dir(p.temp_dir);
    if (fs::exists(p.final_dir)) {
      // save_overwrite (or a re-save at the same batch after a restart): move the old one aside first, so that a
      // crash in between still leaves one complete copy.
      const std::string old = (fs::path(p.folder) / (".old-" + p.name)).string();
      env.remove_all(old);
      if (env.rename(p.final_dir, old) != 0) {
        fail_checkpoint(p.final_dir,
                        fmt::format("cannot move the existing checkpoint aside: {}", std::strerror(errno)));
      }
      if (env.rename(p.temp_dir, p.final_dir) != 0) {
        fail_checkpoint(p.final_dir, fmt::format("rename from {} failed: {}", p.temp_dir, std::strerror(errno)));
      }
      env.remove_all(old);
    } else if (env.rename(p.temp_dir, p.final_dir) != 0) {
      fail_checkpoint(p.final_dir, fmt::format("rename from {} failed: {}", p.temp_dir, std::strerror(errno)));
    }
    sync_dir(p.folder);
    if (!latest_name.empty()) {
      // A relative symlink, replaced atomically by renaming a new link over it.
      const std::string link = (fs::path(p.folder) / latest_name).string();
      const std::string tmp_link = (fs::path(p.folder) / (".tmp-" + latest_name)).string();
      env.unlink(tmp_link);
      if (env.symlink(p.name, tmp_link) != 0) {
        fail_checkpoint(link, fmt::format("cannot create the symlink: {}", std::strerror(errno)));
      }
      if (env.rename(tmp_link, link) != 0)
        fail_checkpoint(link, fmt::format("cannot update the symlink: {}", std::strerror(errno)));
      sync_dir(p.folder);
    }
  } catch (...) {
    abandon_checkpoint(p);
    throw;
  }
}

void abandon_checkpoint(const PendingCheckpoint& p) {
  if (remote(p.folder)) {
    try {
      // Unless it was published after all (only the `latest` object failed), its objects go.
      if (!storage::stat(storage::join(p.final_dir, kMetadata))) {
        for (const storage::ObjectInfo& o : storage::list(p.final_dir + "/")) storage::remove(o.uri);
      }
    } catch (const std::exception& e) {
      spdlog::warn("[checkpoint] {}: could not remove the interrupted save's objects: {}", p.final_dir, e.what());
    }
    return;
  }
  util::file_env().remove_all(p.temp_dir);
}

void remove_checkpoint(const std::string& dir) {
  if (!remote(dir)) {
    if (util::file_env().remove_all(dir) != 0)
      fail_checkpoint(dir, fmt::format("cannot remove: {}", std::strerror(errno)));
    return;
  }
  // metadata.json first: from then on the checkpoint no longer counts, whatever remains.
  const std::string meta = storage::join(dir, kMetadata);
  storage::remove(meta);
  const std::string prefix = dir + "/";
  for (const storage::ObjectInfo& o : storage::list(prefix)) {
    if (o.uri.rfind(prefix, 0) == 0) storage::remove(o.uri);  // a listing is not trusted to stay under the prefix
  }
}

std::vector<std::string> incomplete_checkpoints(const std::string& folder) {
  if (!remote(folder)) return {};
  // Only prefixes holding nothing but rank files and receipts: anything else under the folder (another tool's
  // output, an hf_checkpointer export) is not a checkpoint of ours and is left alone.
  const auto ours = [](const std::string& file) {
    size_t i = 4;
    if (file.rfind("rank", 0) != 0) return false;
    while (i < file.size() && std::isdigit(static_cast<unsigned char>(file[i]))) ++i;
    const std::string rest = file.substr(i);
    return i > 4 && (rest == ".safetensors" || rest == ".receipt.json");
  };
  std::set<std::string> candidates, excluded;
  for (const auto& [dir, file] : remote_children(folder)) (ours(file) ? candidates : excluded).insert(dir);
  std::vector<std::string> out;
  for (const std::string& d : candidates) {
    if (!excluded.count(d)) out.push_back(d);
  }
  return out;
}

std::vector<std::string> list_checkpoints(const std::string& folder, std::vector<std::string>* others) {
  std::set<std::string> dirs;
  if (remote(folder)) {
    // Only prefixes with a metadata.json are read (a request each); the rest are not checkpoints.
    std::set<std::string> all;
    for (const auto& [dir, file] : remote_children(folder)) {
      if (fs::path(dir).filename().string()[0] == '.') continue;  // hidden, as locally
      (file == kMetadata ? dirs : all).insert(dir);
    }
    if (others != nullptr) {
      for (const std::string& d : all) {
        if (!dirs.count(d)) others->push_back(d);
      }
    }
  } else {
    std::error_code ec;
    if (!fs::is_directory(folder, ec)) return {};
    for (const fs::directory_entry& e : fs::directory_iterator(folder, ec)) {
      const std::string name = e.path().filename().string();
      if (name.empty() || name[0] == '.' || e.is_symlink() || !e.is_directory()) continue;
      dirs.insert(e.path().string());
    }
  }
  std::vector<std::pair<int64_t, std::string>> found;
  for (const std::string& d : dirs) {
    if (const std::optional<int64_t> batch = checkpoint_batch(d)) {
      found.emplace_back(*batch, d);
    } else if (others != nullptr) {
      others->push_back(d);
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

bool is_checkpoint(const std::string& dir) {
  return checkpoint_batch(dir).has_value();
}

std::vector<std::string> restore_moved_aside(const std::string& folder) {
  std::vector<std::string> restored;
  if (remote(folder)) return restored;
  try {
    std::error_code ec;
    if (!fs::is_directory(folder, ec)) return restored;
    std::vector<fs::path> old;
    for (const fs::directory_entry& e : fs::directory_iterator(folder)) {
      if (e.path().filename().string().rfind(".old-", 0) == 0 && !e.is_symlink() && e.is_directory()) {
        old.push_back(e.path());
      }
    }
    for (const fs::path& o : old) {
      const std::string base = o.filename().string().substr(5);
      const fs::path name = fs::path(folder) / base;
      // Only when NAME is missing: otherwise the re-save finished, and .old-NAME is the stale copy.
      if (base.empty() || fs::symlink_status(name, ec).type() != fs::file_type::not_found) continue;
      const std::string why = validate_checkpoint(o.string(), /*verify_checksums=*/false);
      if (!why.empty()) {
        spdlog::warn(
            "[checkpoint] {} is missing, and {} is not a complete checkpoint to restore it from ({}); leaving "
            "both as they are",
            name.string(), o.string(), why);
        continue;
      }
      if (util::file_env().rename(o.string(), name.string()) != 0)
        fail_checkpoint(name.string(), fmt::format("cannot restore it from {}: {}", o.string(), std::strerror(errno)));
      sync_dir(folder);
      spdlog::warn(
          "[checkpoint] restored {} from {}: a crash interrupted its re-save between moving it aside and "
          "renaming the new one into place",
          name.string(), o.string());
      restored.push_back(name.string());
    }
  } catch (const std::exception& e) {
    spdlog::warn("[checkpoint] {}: checking for checkpoints moved aside by an interrupted re-save failed: {}", folder,
                 e.what());
  }
  return restored;
}

std::string validate_checkpoint(const std::string& dir, bool verify_checksums) {
  try {
    const nlohmann::json m = read_metadata(dir);
    if (m.value("format", "") != "tessera-checkpoint")
      return fmt::format("{}/{}: not a Tessera checkpoint", dir, kMetadata);
    if (m.value("format_version", 0) > kFormatVersion) {
      return fmt::format("{}/{}: format version {} is newer than this build reads ({})", dir, kMetadata,
                         m.value("format_version", 0), kFormatVersion);
    }
    for (const nlohmann::json& f : m.at("files")) {
      if (remote(dir)) {
        const std::string uri = listed_file(dir, f.at("name").get<std::string>());
        const auto info = storage::stat(uri);
        const uint64_t want = f.at("bytes").get<uint64_t>();
        if (!info) return fmt::format("{}: missing", uri);
        if (info->size != want)
          return fmt::format("{}: {} bytes, metadata says {} (truncated?)", uri, info->size, want);
        if (verify_checksums) {
          const std::string h = remote_xxh64(uri, want);
          if (h != f.at("xxh64").get<std::string>()) {
            return fmt::format("{}: xxh64 checksum {} does not match the metadata's {} (corrupted)", uri, h,
                               f.at("xxh64").get<std::string>());
          }
        }
        continue;
      }
      const fs::path path = listed_file(dir, f.at("name").get<std::string>());
      std::error_code ec;
      const uint64_t size = fs::file_size(path, ec);
      if (ec) return fmt::format("{}: missing ({})", path.string(), ec.message());
      if (size != f.at("bytes").get<uint64_t>()) {
        return fmt::format("{}: {} bytes, metadata says {} (truncated?)", path.string(), size,
                           f.at("bytes").get<uint64_t>());
      }
      if (verify_checksums) {
        const std::string h = mapped_xxh64(SafetensorsFile(path.string()).bytes());
        if (h != f.at("xxh64").get<std::string>()) {
          return fmt::format("{}: xxh64 checksum {} does not match the metadata's {} (corrupted)", path.string(), h,
                             f.at("xxh64").get<std::string>());
        }
      }
    }
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::vector<std::string> checkpoint_candidates(const std::string& folder, const std::string& latest_name) {
  std::vector<std::string> candidates;
  if (const auto latest = latest_target(folder, latest_name)) candidates.push_back(normal(*latest));
  std::vector<std::string> all = list_checkpoints(folder);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const std::string p = normal(*it);
    if (std::find(candidates.begin(), candidates.end(), p) == candidates.end()) candidates.push_back(p);
  }
  return candidates;
}

std::optional<std::string> find_latest_valid_checkpoint(const std::string& folder, const std::string& latest_name,
                                                        bool verify_checksums) {
  for (const std::string& c : checkpoint_candidates(folder, latest_name)) {
    const std::string why = validate_checkpoint(c, verify_checksums);
    if (why.empty()) return c;
    spdlog::warn("[checkpoint] skipping {}: {}", c, why);
  }
  return std::nullopt;
}

}  // namespace tessera::checkpoint
