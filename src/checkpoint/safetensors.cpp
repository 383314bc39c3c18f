// safetensors reading (mmap, validated header) and atomic writing, single-file and sharded.
#include "tessera/checkpoint/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tessera/util/error.h"
#include "tessera/util/file_io.h"
#include "tessera/util/safe_path.h"

namespace tessera::checkpoint {
namespace {

constexpr const char* kComponent = "safetensors";
constexpr uint64_t kMaxHeader = 100u << 20;  // the reference implementation's limit

[[noreturn]] void fail(const std::string& path, const std::string& message) {
  throw Error(kComponent, fmt::format("{}: {}", path, message));
}

const std::vector<std::pair<std::string, at::ScalarType>>& dtype_table() {
  static const std::vector<std::pair<std::string, at::ScalarType>> table = {{"F64", at::kDouble},
                                                                            {"F32", at::kFloat},
                                                                            {"F16", at::kHalf},
                                                                            {"BF16", at::kBFloat16},
                                                                            {"I64", at::kLong},
                                                                            {"I32", at::kInt},
                                                                            {"I16", at::kShort},
                                                                            {"I8", at::kChar},
                                                                            {"U8", at::kByte},
                                                                            {"BOOL", at::kBool},
                                                                            {"U16", at::kUInt16},
                                                                            {"U32", at::kUInt32},
                                                                            {"U64", at::kUInt64},
                                                                            {"F8_E4M3", at::kFloat8_e4m3fn},
                                                                            {"F8_E5M2", at::kFloat8_e5m2}};
  return table;
}

}  // namespace

std::string dtype_name(at::ScalarType dtype) {
  for (const auto& [name, t] : dtype_table()) {
    if (t == dtype) return name;
  }
  throw Error(kComponent, fmt::format("dtype {} cannot be stored in safetensors", c10::toString(dtype)));
}

at::ScalarType dtype_from_name(const std::string& name) {
  for (const auto& [n, t] : dtype_table()) {
    if (n == name) return t;
  }
  throw Error(kComponent, fmt::format("unknown dtype \"{}\"", name));
}

struct SafetensorsFile::Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr != nullptr && addr != MAP_FAILED) ::munmap(addr, size);
  }
};

std::string_view SafetensorsFile::bytes() const {
  return {static_cast<const char*>(mapping_->addr), mapping_->size};
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path), mapping_(std::make_shared<Mapping>()) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, fmt::format("cannot open: {}", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail(path, fmt::format("cannot stat: {}", std::strerror(errno)));
  }
  const auto file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    fail(path, fmt::format("truncated: {} bytes, not even the 8-byte header length", file_size));
  }
  mapping_->size = file_size;
  mapping_->addr = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapping_->addr == MAP_FAILED) fail(path, fmt::format("mmap failed: {}", std::strerror(errno)));
  const auto* bytes = static_cast<const unsigned char*>(mapping_->addr);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > kMaxHeader) fail(path, fmt::format("bad header: claims {} bytes of header", header_len));
  if (8 + header_len > file_size) {
    fail(path, fmt::format("truncated: header claims {} bytes but the file has {}", header_len, file_size - 8));
  }
  data_start_ = 8 + header_len;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(reinterpret_cast<const char*>(bytes + 8),
                                   reinterpret_cast<const char*>(bytes + data_start_));
  } catch (const nlohmann::json::exception& e) {
    fail(path, fmt::format("bad header: not valid JSON ({})", e.what()));
  }
  if (!header.is_object()) fail(path, "bad header: not a JSON object");
  const uint64_t data_size = file_size - data_start_;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(path, "bad header: __metadata__ is not an object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) fail(path, fmt::format("bad header: __metadata__.{} is not a string", k));
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    try {
      TensorInfo info;
      info.dtype = dtype_from_name(entry.at("dtype").get<std::string>());
      info.shape = entry.at("shape").get<std::vector<int64_t>>();
      const auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
      if (offsets.size() != 2) fail(path, fmt::format("tensor {}: data_offsets must have 2 entries", name));
      info.begin = offsets[0];
      info.end = offsets[1];
      // The element count and byte size in checked arithmetic: a header's shape can claim 2^62 elements, whose
      // byte size wraps around to a small number (or 0) and would pass the offsets check below. The element count
      // must also fit the int64 a tensor's sizes are.
      uint64_t numel = 1;
      for (int64_t d : info.shape) {
        if (d < 0) fail(path, fmt::format("tensor {}: negative dimension", name));
        if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel) ||
            numel > static_cast<uint64_t>(INT64_MAX)) {
          fail(path, fmt::format("tensor {}: shape {} has more elements than a tensor can hold", name,
                                 fmt::join(info.shape, "x")));
        }
      }
      uint64_t expected = 0;
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(c10::elementSize(info.dtype)), &expected)) {
        fail(path, fmt::format("tensor {}: shape {} of {} needs more than 2^64 bytes", name, fmt::join(info.shape, "x"),
                               dtype_name(info.dtype)));
      }
      if (info.end < info.begin || info.end - info.begin != expected) {
        fail(path, fmt::format("tensor {}: data_offsets [{}, {}] hold {} bytes, but shape and dtype need {}", name,
                               info.begin, info.end, info.end - info.begin, expected));
      }
      if (info.end > data_size) {
        fail(path,
             fmt::format("truncated: tensor {} ends at byte {} of a {}-byte data section", name, info.end, data_size));
      }
      ranges.emplace_back(info.begin, info.end);
      tensors_[name] = std::move(info);
    } catch (const nlohmann::json::exception& e) {
      fail(path, fmt::format("bad header entry for tensor {}: {}", name, e.what()));
    } catch (const Error& e) {
      if (e.message().starts_with(path)) throw;
      fail(path, fmt::format("tensor {}: {}", name, e.message()));
    }
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) fail(path, "bad header: tensor data ranges overlap");
  }
}

SafetensorsFile::~SafetensorsFile() = default;

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [name, info] : tensors_) out.push_back(name);
  return out;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail(path_, fmt::format("no tensor named {}", name));
  return it->second;
}

at::Tensor SafetensorsFile::view(const std::string& name) const {
  const TensorInfo& i = info(name);
  auto* base = static_cast<char*>(mapping_->addr) + data_start_ + i.begin;
  std::shared_ptr<Mapping> keep = mapping_;
  return at::from_blob(
      base, i.shape, [keep](void*) mutable { keep.reset(); }, at::TensorOptions().dtype(i.dtype));
}

void SafetensorsFile::release(const std::string& name) const {
  const TensorInfo& t = info(name);
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = (data_start_ + t.begin + page - 1) / page * page;
  const uint64_t end = (data_start_ + t.end) / page * page;
  if (end > begin) ::madvise(static_cast<char*>(mapping_->addr) + begin, end - begin, MADV_DONTNEED);
}

at::Tensor SafetensorsFile::load(const std::string& name, std::optional<at::ScalarType> dtype) const {
  const at::Tensor v = view(name);
  return v.to(dtype.value_or(v.scalar_type()), /*non_blocking=*/false, /*copy=*/true);
}

std::string safetensors_header(const std::vector<TensorLayout>& layout,
                               const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorLayout& t : layout) {
    uint64_t n = c10::elementSize(t.dtype);
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string json = header.dump();
  while ((8 + json.size()) % 8 != 0) json.push_back(' ');  // align the data section to 8 bytes
  std::string out(8, '\0');
  uint64_t h = json.size();
  for (char& b : out) b = static_cast<char>(h & 0xff), h >>= 8;
  return out + json;
}

void save_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<TensorLayout> layout;
  std::vector<at::Tensor> data;
  for (const auto& [name, t] : tensors) {
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    layout.push_back({name, c.scalar_type(), c.sizes().vec()});
    data.push_back(std::move(c));
  }
  const std::string header = safetensors_header(layout, metadata);
  std::vector<std::string_view> parts = {header};
  for (const at::Tensor& c : data) {
    parts.emplace_back(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.numel() * c.element_size()));
  }
  util::write_file_atomically(path, parts, kComponent);
}

std::vector<std::string> save_sharded_safetensors(const std::string& dir,
                                                  const std::map<std::string, at::Tensor>& tensors,
                                                  uint64_t max_shard_bytes,
                                                  const std::map<std::string, std::string>& metadata) {
  std::vector<TensorLayout> layout;
  std::vector<const at::Tensor*> data;
  for (const auto& [name, t] : tensors) {
    layout.push_back({name, t.scalar_type(), t.sizes().vec()});
    data.push_back(&t);
  }
  return save_sharded_safetensors_streamed(
      dir, layout, [&](size_t i) { return *data[i]; }, max_shard_bytes, metadata);
}

namespace {

uint64_t nbytes(const TensorLayout& t) {
  uint64_t n = c10::elementSize(t.dtype);
  for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
  return n;
}

// Writes layout[first, last) to `path` through a temporary file, one produced tensor at a time.
void write_streamed(const std::string& path, const std::vector<TensorLayout>& layout, size_t first, size_t last,
                    const std::function<at::Tensor(size_t)>& produce,
                    const std::map<std::string, std::string>& metadata) {
  const std::vector<TensorLayout> part(layout.begin() + static_cast<std::ptrdiff_t>(first),
                                       layout.begin() + static_cast<std::ptrdiff_t>(last));
  const std::string header = safetensors_header(part, metadata);
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(tmp, fmt::format("cannot create: {}", std::strerror(errno)));
  auto abandon = [&](const std::string& why) {
    ::close(fd);
    ::unlink(tmp.c_str());
    fail(path, why);
  };
  auto write_all = [&](const void* data, size_t size) {
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t w = ::write(fd, p, size);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) abandon(fmt::format("write failed: {}", std::strerror(errno)));
      p += w;
      size -= static_cast<size_t>(w);
    }
  };
  write_all(header.data(), header.size());
  for (size_t i = first; i < last; ++i) {
    at::Tensor t;
    try {
      t = produce(i).detach().to(at::kCPU, layout[i].dtype).contiguous();
    } catch (...) {
      ::close(fd);
      ::unlink(tmp.c_str());
      throw;
    }
    if (t.sizes().vec() != layout[i].shape) abandon(fmt::format("tensor {} has an unexpected shape", layout[i].name));
    write_all(t.data_ptr(), static_cast<size_t>(t.nbytes()));
  }
  if (::fsync(fd) != 0) abandon(fmt::format("fsync failed: {}", std::strerror(errno)));
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    fail(path, fmt::format("close failed: {}", std::strerror(errno)));
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace

std::vector<std::string> save_sharded_safetensors_streamed(const std::string& dir,
                                                           const std::vector<TensorLayout>& layout,
                                                           const std::function<at::Tensor(size_t)>& produce,
                                                           uint64_t max_shard_bytes,
                                                           const std::map<std::string, std::string>& metadata) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  // Shards: [begin, end) ranges of layout, a new one when the next tensor would pass the limit.
  std::vector<std::pair<size_t, size_t>> shards = {{0, 0}};
  uint64_t in_shard = 0, total = 0;
  for (size_t i = 0; i < layout.size(); ++i) {
    const uint64_t n = nbytes(layout[i]);
    if (in_shard > 0 && in_shard + n > max_shard_bytes) {
      shards.emplace_back(i, i);
      in_shard = 0;
    }
    shards.back().second = i + 1;
    in_shard += n;
    total += n;
  }
  std::vector<std::string> files;
  for (size_t k = 0; k < shards.size(); ++k) {
    files.push_back(shards.size() == 1 ? std::string("model.safetensors")
                                       : fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, shards.size()));
    write_streamed((fs::path(dir) / files.back()).string(), layout, shards[k].first, shards[k].second, produce,
                   metadata);
  }
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  if (shards.size() > 1) {
    nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}},
                                    {"weight_map", nlohmann::ordered_json::object()}};
    for (size_t k = 0; k < shards.size(); ++k) {
      for (size_t i = shards[k].first; i < shards[k].second; ++i) index["weight_map"][layout[i].name] = files[k];
    }
    util::write_file_atomically(index_path.string(), index.dump(2) + "\n", kComponent);
  } else {
    fs::remove(index_path);
  }
  // Files of an earlier save in another layout: they would shadow or contradict the new one.
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const bool ours = name == "model.safetensors" || (name.starts_with("model-") && name.ends_with(".safetensors"));
    if (ours && std::find(files.begin(), files.end(), name) == files.end()) fs::remove(entry.path());
  }
  return files;
}

std::map<std::string, std::shared_ptr<SafetensorsFile>> open_safetensors_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::map<std::string, std::shared_ptr<SafetensorsFile>> out;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index_path)) {
    nlohmann::json index;
    try {
      std::ifstream in(index_path);
      index = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      fail(index_path.string(), fmt::format("not valid JSON ({})", e.what()));
    }
    if (!index.contains("weight_map") || !index["weight_map"].is_object()) {
      fail(index_path.string(), "missing the \"weight_map\" object");
    }
    std::map<std::string, std::shared_ptr<SafetensorsFile>> files;
    for (const auto& [name, file] : index["weight_map"].items()) {
      if (!file.is_string()) fail(index_path.string(), fmt::format("weight_map: {} is not a file name", name));
      const std::string f = file.get<std::string>();
      if (!files.count(f)) {
        // A safe relative name; lexical only: a hub snapshot's files are symlinks into ../../blobs.
        const fs::path p =
            util::confined_path(dir, f, index_path.string(), kComponent, "shard file name", util::Confine::kLexical);
        if (!fs::exists(p)) fail(index_path.string(), fmt::format("shard {} (holding {}) does not exist", f, name));
        files[f] = std::make_shared<SafetensorsFile>(p.string());
      }
      if (!files[f]->contains(name)) {
        fail(index_path.string(), fmt::format("tensor {} is listed in shard {} but not stored there", name, f));
      }
      out[name] = files[f];
    }
    return out;
  }
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (!fs::exists(single)) fail(dir, "no model.safetensors or model.safetensors.index.json");
  auto file = std::make_shared<SafetensorsFile>(single.string());
  for (const std::string& name : file->names()) out[name] = file;
  return out;
}

}  // namespace tessera::checkpoint
