// CheckpointReader (see checkpoint.h): a published checkpoint's metadata.json checked, its rank files opened (fetched
// from object storage into a temporary folder, their sizes and checksums verified), and any slice of a logical tensor
// read from the pieces that cover it, whatever world size and sharding strategy wrote them.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "checkpoint_detail.h"
#include "tessera/checkpoint/checkpoint.h"
#include "tessera/checkpoint/safetensors.h"
#include "tessera/storage/storage.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"
#include "tessera/util/safe_path.h"

namespace tessera::checkpoint {

using namespace detail;  // NOLINT(google-build-using-namespace): the format's own helpers (checkpoint_detail.h)
namespace {
namespace fs = std::filesystem;
}  // namespace

CheckpointReader::CheckpointReader(std::string dir, bool verify_checksums)
    : dir_(std::move(dir)), verify_(verify_checksums) {
  const std::string path = storage::join(dir_, kMetadata);
  if (remote(dir_)) {
    if (!storage::stat(path)) {
      fail_checkpoint(dir_, storage::list(dir_ + "/").empty()
                                ? "does not exist"
                                : "no metadata.json: not a (complete) Tessera checkpoint");
    }
  } else if (!fs::exists(path)) {
    fail_checkpoint(dir_,
                    fs::exists(dir_) ? "no metadata.json: not a (complete) Tessera checkpoint" : "does not exist");
  }
  meta_ = read_metadata(dir_);
  if (meta_.value("format", "") != "tessera-checkpoint") fail_checkpoint(path, "not a Tessera checkpoint (\"format\")");
  const int version = meta_.value("format_version", 0);
  if (version < 1 || version > kFormatVersion) {
    fail_checkpoint(path,
                    fmt::format("format version {} is not one this build reads (1..{})", version, kFormatVersion));
  }
  for (const char* key : {"world_size", "tensors", "files"}) {
    if (!meta_.contains(key)) fail_checkpoint(path, fmt::format("missing \"{}\"", key));
  }
}

CheckpointReader::~CheckpointReader() {
  files_.clear();  // unmapped before their folder goes
  if (!cache_.empty()) {
    std::error_code ec;
    fs::remove_all(cache_, ec);
  }
}

std::vector<std::string> CheckpointReader::tensor_names(const std::string& prefix) const {
  std::vector<std::string> out;
  for (const auto& [name, t] : meta_.at("tensors").items()) {
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int64_t> CheckpointReader::shape(const std::string& name) const {
  if (!has_tensor(name)) fail_checkpoint(dir_, fmt::format("has no tensor {}", name));
  return meta_.at("tensors").at(name).at("shape").get<std::vector<int64_t>>();
}

at::ScalarType CheckpointReader::dtype(const std::string& name) const {
  if (!has_tensor(name)) fail_checkpoint(dir_, fmt::format("has no tensor {}", name));
  return dtype_from_name(meta_.at("tensors").at(name).at("dtype").get<std::string>());
}

SafetensorsFile& CheckpointReader::file(int rank) {
  auto it = files_.find(rank);
  if (it != files_.end()) return *it->second;
  const nlohmann::json* entry = nullptr;
  for (const nlohmann::json& f : meta_.at("files")) {
    if (f.at("rank").get<int>() == rank) entry = &f;
  }
  if (entry == nullptr) fail_checkpoint(dir_, fmt::format("metadata.json lists no file for rank {}", rank));
  const std::string& name = entry->at("name").get_ref<const std::string&>();  // checked as metadata.json was read
  const std::string shown = listed_file(dir_, name);                          // for messages
  std::string path = shown;
  if (remote(path)) {
    if (cache_.empty()) cache_ = util::make_temp_dir("tessera-checkpoint", kCheckpointComponent);
    const std::string local =
        util::confined_path(cache_, name, storage::join(dir_, kMetadata), kCheckpointComponent, "file name").string();
    storage::download(shown, local);
    path = local;
  }
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec) fail_checkpoint(shown, fmt::format("missing ({})", ec.message()));
  if (size != entry->at("bytes").get<uint64_t>()) {
    fail_checkpoint(
        shown, fmt::format("{} bytes, metadata.json says {} (truncated?)", size, entry->at("bytes").get<uint64_t>()));
  }
  auto f = std::make_shared<SafetensorsFile>(path);
  if (verify_) {
    // Before any of its bytes are used.
    const std::string h = mapped_xxh64(f->bytes());
    if (h != entry->at("xxh64").get<std::string>()) {
      fail_checkpoint(shown, fmt::format("xxh64 checksum {} does not match metadata.json's {} (corrupted)", h,
                                         entry->at("xxh64").get<std::string>()));
    }
  }
  files_[rank] = f;
  return *f;
}

at::Tensor CheckpointReader::piece_values(const nlohmann::json& pc, int64_t numel) {
  SafetensorsFile& f = file(pc.at("rank").get<int>());
  const std::string key = pc.at("key").get<std::string>();
  if (!f.contains(key)) fail_checkpoint(f.path(), fmt::format("has no piece {} (listed in metadata.json)", key));
  const at::Tensor src = f.view(key).view({-1});
  if (src.numel() != numel) {
    fail_checkpoint(f.path(), fmt::format("piece {} has {} elements, metadata.json says {}", key, src.numel(), numel));
  }
  return src;
}

void CheckpointReader::read(const std::string& name, int64_t start, at::Tensor dst) {
  if (!has_tensor(name)) fail_checkpoint(dir_, fmt::format("has no tensor {}", name));
  const nlohmann::json& t = meta_.at("tensors").at(name);
  int64_t total = 1;
  for (int64_t d : t.at("shape").get<std::vector<int64_t>>()) total *= d;
  const int64_t n = dst.numel();
  if (start < 0 || start + n > total) {
    fail_checkpoint(dir_,
                    fmt::format("{}: elements [{}, {}) are outside its {} elements", name, start, start + n, total));
  }
  TORCH_CHECK(dst.is_contiguous(), "CheckpointReader::read: dst must be contiguous");
  at::Tensor out = dst.view({-1});
  int64_t covered = 0;
  at::NoGradGuard no_grad;
  const std::vector<int64_t> shape = t.at("shape").get<std::vector<int64_t>>();
  for (const nlohmann::json& pc : t.at("pieces")) {
    const int64_t ps = pc.at("start").get<int64_t>();
    const int64_t pn = pc.at("numel").get<int64_t>();
    const int64_t pcols = pc.value("cols", int64_t{0});
    if (pcols == 0) {
      const int64_t lo = std::max(start, ps), hi = std::min(start + n, ps + pn);
      if (lo >= hi) continue;
      const at::Tensor src = piece_values(pc, pn);
      out.narrow(0, lo - start, hi - lo).copy_(src.narrow(0, lo - ps, hi - lo));
      covered += hi - lo;
      continue;
    }
    // A column window: row r of the sub-matrix holds global elements [r W + c0, r W + c0 + cols) of a (rows, W)
    // tensor; the piece has its elements [ps, ps + pn) counted row-major.
    if (shape.size() != 2) fail_checkpoint(dir_, fmt::format("{}: a column window on a tensor that is not 2-D", name));
    const int64_t width = shape[1], c0 = pc.at("col_start").get<int64_t>();
    if (pn == 0) continue;
    const int64_t first = std::max(ps / pcols, start / width),
                  last = std::min((ps + pn - 1) / pcols, (start + n - 1) / width);
    at::Tensor src;
    for (int64_t r = first; r <= last; ++r) {
      const int64_t a = std::max(ps, r * pcols) - r * pcols, b = std::min(ps + pn, (r + 1) * pcols) - r * pcols;
      const int64_t lo = std::max(start, r * width + c0 + a), hi = std::min(start + n, r * width + c0 + b);
      if (lo >= hi) continue;
      if (!src.defined()) src = piece_values(pc, pn);
      out.narrow(0, lo - start, hi - lo).copy_(src.narrow(0, r * pcols + (lo - r * width - c0) - ps, hi - lo));
      covered += hi - lo;
    }
  }
  if (covered != n) {
    fail_checkpoint(dir_, fmt::format("{}: its pieces cover {} of the {} elements [{}, {}) asked for", name, covered, n,
                                      start, start + n));
  }
}

void CheckpointReader::read_window(const std::string& name, int64_t col_start, int64_t cols, int64_t start,
                                   at::Tensor dst) {
  if (!has_tensor(name)) fail_checkpoint(dir_, fmt::format("has no tensor {}", name));
  const std::vector<int64_t> shape = this->shape(name);
  const int64_t n = dst.numel();
  if (shape.size() != 2 || cols <= 0 || col_start < 0 || col_start + cols > shape[1] || start < 0 ||
      start + n > shape[0] * cols) {
    fail_checkpoint(dir_, fmt::format("{} (shape [{}]): elements [{}, {}) of columns [{}, {}) are outside it", name,
                                      fmt::join(shape, ", "), start, start + n, col_start, col_start + cols));
  }
  TORCH_CHECK(dst.is_contiguous(), "CheckpointReader::read_window: dst must be contiguous");
  at::Tensor out = dst.view({-1});
  // The same window stored whole by one piece (a resume on the same mesh): one copy.
  for (const nlohmann::json& pc : meta_.at("tensors").at(name).at("pieces")) {
    if (pc.value("cols", int64_t{0}) != cols || pc.at("col_start").get<int64_t>() != col_start) continue;
    const int64_t ps = pc.at("start").get<int64_t>(), pn = pc.at("numel").get<int64_t>();
    if (ps <= start && start + n <= ps + pn) {
      at::NoGradGuard no_grad;
      out.copy_(piece_values(pc, pn).narrow(0, start - ps, n));
      return;
    }
  }
  // Otherwise row by row of the window, each a contiguous range of the whole tensor.
  for (int64_t at = start; at < start + n;) {
    const int64_t r = at / cols, c = at % cols, len = std::min(cols - c, start + n - at);
    read(name, r * shape[1] + col_start + c, out.narrow(0, at - start, len));
    at += len;
  }
}

at::Tensor CheckpointReader::read_full(const std::string& name) {
  at::Tensor out = at::empty(shape(name), at::TensorOptions().dtype(dtype(name)));
  read(name, 0, out);
  return out;
}

at::Tensor CheckpointReader::read_local(int rank, const std::string& key) {
  const nlohmann::json& locals = meta_.value("local_tensors", nlohmann::json::object());
  const std::string r = std::to_string(rank);
  if (!locals.contains(r)) return {};
  const auto& keys = locals.at(r);
  if (std::find(keys.begin(), keys.end(), key) == keys.end()) return {};
  SafetensorsFile& f = file(rank);
  return f.load("local/" + key);
}

}  // namespace tessera::checkpoint
