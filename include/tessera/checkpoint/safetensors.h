// The safetensors format (Hugging Face): an 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}, then the raw little-endian data.
// Reading memory-maps the file and checks the header against the file before any tensor is touched; loading never
// runs code. Sharded checkpoints add model.safetensors.index.json: {"metadata": {"total_size": N},
// "weight_map": {name: file}}.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::checkpoint {

struct TensorInfo {
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets inside the data section
  uint64_t end = 0;
};

// A memory-mapped safetensors file. Opening validates the whole header (size, JSON, dtypes, shapes, offsets inside
// the file, byte counts matching shapes, no overlaps); every problem throws tessera::Error naming the file (and the
// tensor). Thread-safe for concurrent reads once opened.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return tensors_.count(name) > 0; }
  const TensorInfo& info(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The whole file as mapped (header included), for checksumming it through the same mapping the views read.
  std::string_view bytes() const;

  // The tensor as stored, viewing the mapped file (no copy). It keeps the mapping alive; do not write to it.
  at::Tensor view(const std::string& name) const;
  // A copy converted to `dtype` (or the stored dtype), owning its memory.
  at::Tensor load(const std::string& name, std::optional<at::ScalarType> dtype = std::nullopt) const;
  // Drops the resident pages that lie wholly inside the tensor's bytes from this process (madvise MADV_DONTNEED; they
  // stay in the page cache and are read again if a view touches them). Loaders call it once a tensor is copied, so
  // that reading a folder tensor by tensor holds at most about one stored tensor in memory besides the model.
  void release(const std::string& name) const;

 private:
  struct Mapping;
  std::string path_;
  std::shared_ptr<Mapping> mapping_;
  uint64_t data_start_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The start of a safetensors file whose tensors `layout` (name, dtype, shape) follow it back to back in that order:
// the 8-byte header length and the JSON header, padded so the data section starts 8-byte aligned. For writers that
// stream the data themselves.
struct TensorLayout {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
};
std::string safetensors_header(const std::vector<TensorLayout>& layout,
                               const std::map<std::string, std::string>& metadata = {});

// Writes `tensors` to `path` atomically (a temporary file in the same directory, fsync, rename): a crash leaves either
// the old file or the complete new one. Tensors are stored contiguous, little-endian, in name order.
void save_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Writes `tensors` into `dir` as model.safetensors, or, when they exceed `max_shard_bytes`, as
// model-0000k-of-0000n.safetensors plus model.safetensors.index.json (Hugging Face's layout). Returns the file names.
std::vector<std::string> save_sharded_safetensors(const std::string& dir,
                                                  const std::map<std::string, at::Tensor>& tensors,
                                                  uint64_t max_shard_bytes,
                                                  const std::map<std::string, std::string>& metadata = {});

// The streamed form of save_sharded_safetensors: the tensors are described by `layout` (in file order) and produced
// one at a time by `produce(i)` (converted to layout[i]'s dtype and shape), so no more than one tensor is in memory:
// a model larger than host memory can be written. Each file is written to a temporary name, fsynced and renamed; the
// index is written last, and files of an earlier layout in `dir` (model.safetensors, an index or shards of another
// count) are removed after it. Returns the file names.
std::vector<std::string> save_sharded_safetensors_streamed(const std::string& dir,
                                                           const std::vector<TensorLayout>& layout,
                                                           const std::function<at::Tensor(size_t)>& produce,
                                                           uint64_t max_shard_bytes,
                                                           const std::map<std::string, std::string>& metadata = {});

// Opens every tensor of a model directory: model.safetensors.index.json if present, else model.safetensors. Returns
// name -> (file, so views stay valid). Throws naming the index or file for a missing shard or a tensor listed in the
// index but absent from its shard.
std::map<std::string, std::shared_ptr<SafetensorsFile>> open_safetensors_dir(const std::string& dir);

// "F32", "BF16", ... <-> at::ScalarType. Throws for types safetensors cannot express or unknown names.
std::string dtype_name(at::ScalarType dtype);
at::ScalarType dtype_from_name(const std::string& name);

}  // namespace tessera::checkpoint
