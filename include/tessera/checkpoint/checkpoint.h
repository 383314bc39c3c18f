// Tessera's sharded checkpoint format (docs/formats/checkpoint.md, format version 1): a directory holding
// metadata.json and one rank{r}.safetensors per rank. Every logical tensor (a model parameter, an optimizer state
// tensor, ...) is stored as pieces: contiguous element ranges of its row-major flattening, each in some rank's file.
// metadata.json maps every tensor to its pieces, so a checkpoint written by N ranks with one sharding strategy is
// read by M ranks with another: each reader asks for the element ranges it holds and gets them from whichever
// pieces overlap (resharding). No pickle: loading never runs code.
//
// Publishing is atomic. Every rank writes its file (and a small receipt with its checksum) into a hidden temporary
// directory; rank 0 waits for all receipts, writes metadata.json, fsyncs, renames the directory to its final name,
// and then moves the `latest` symlink. A crash at any moment leaves the previous checkpoint loadable and `latest`
// pointing at a complete checkpoint. The save folder must be shared by all ranks (one filesystem).
//
// The save folder may also be an object store prefix (s3://bucket/prefix, storage/storage.h). There is no rename: each
// rank uploads its file straight to folder/name/ from memory, then a receipt naming the save's attempt; rank 0 waits
// for this attempt's receipts, writes metadata.json, and writes the `latest` object (holding the checkpoint's name)
// last. A checkpoint counts only once metadata.json exists, and loads only when every file it lists has its size and
// checksum, so an interrupted upload is never taken for a checkpoint. Readers download the files they need.
//
//   PendingCheckpoint p = begin_checkpoint(folder, "ep0-ba10", rank, world);
//   write_rank_file(p, rank, payload);              // every rank
//   if (rank == 0) publish_checkpoint(p, meta, world, timeout, "latest");
//   ...
//   CheckpointReader r(find_latest_valid_checkpoint(folder, "latest").value());
//   r.read("model/transformer.wte.weight", start, numel, dst);  // any element range
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tessera::checkpoint {

class SafetensorsFile;

inline constexpr int kFormatVersion = 1;

// Elements [start, start + numel) of the row-major flattening of the logical tensor `tensor` (global `shape`). With a
// column window (cols > 0; a 2-D tensor split by columns, as tensor parallelism's row-parallel weights are), of the
// sub-matrix tensor[:, col_start : col_start + cols] instead.
struct Piece {
  std::string tensor;
  std::vector<int64_t> shape;
  int64_t start = 0;
  int64_t numel = 0;
  int64_t col_start = 0;
  int64_t cols = 0;
};

// What one rank stores: pieces of logical tensors (each with its values, `numel` elements, any dtype), and tensors
// that belong to this rank alone and are not resharded (e.g. its RNG state).
struct RankPayload {
  std::vector<std::pair<Piece, at::Tensor>> pieces;
  std::map<std::string, at::Tensor> local;
};

// A checkpoint being written: its final directory and the hidden temporary one the ranks write into.
struct PendingCheckpoint {
  std::string folder;     // the save folder
  std::string name;       // e.g. "ep0-ba10"
  std::string final_dir;  // folder/name
  std::string temp_dir;   // folder/.tmp-name (remote folders: folder/name, written in place)
  std::string attempt;    // identifies this save among interrupted earlier ones of the same name (remote receipts)
};

// Names the directories (creating the folder and, on rank 0, a fresh temporary directory; other ranks wait up to
// `timeout` for it to appear). Throws tessera::Error("checkpoint") naming the path on failure.
// A remote folder needs no directory: rank 0 removes an earlier checkpoint's metadata.json of the same name (so it
// stops counting before its files are replaced), and every rank must pass the same `attempt` (e.g. a random number
// rank 0 broadcast), which publish_checkpoint expects in the receipts.
PendingCheckpoint begin_checkpoint(const std::string& folder, const std::string& name, int rank,
                                   std::chrono::milliseconds timeout, const std::string& attempt = "");

// Writes rank{rank}.safetensors into p.temp_dir (fsynced), then its receipt. Returns the bytes written. Throws
// tessera::Error("checkpoint") naming the file and the OS error (e.g. "No space left on device"); nothing partial is
// left under a final name.
uint64_t write_rank_file(const PendingCheckpoint& p, int rank, const RankPayload& payload);

// Rank 0: waits (up to `timeout`) for the receipts of all `world_size` ranks, writes metadata.json from `metadata`
// (the caller's fields: timestamp, config, ...) plus "format", "format_version", "world_size", "tensors" and
// "files", renames the temporary directory to its final name, and points `latest_name` (a relative symlink in the
// folder; empty: none) at it. Throws naming the rank whose receipt never came or the file that failed; the temporary
// directory is then removed and `latest` is unchanged. Once `*stop` (if given) is true, a receipt still missing is
// not waited for: the save fails at once as it would at the timeout (a run ending on an error does not wait for a
// rank that may be dead; the previous checkpoint stays the latest).
void publish_checkpoint(const PendingCheckpoint& p, nlohmann::json metadata, int world_size,
                        std::chrono::milliseconds timeout, const std::string& latest_name,
                        const std::atomic<bool>* stop = nullptr);

// Removes a failed checkpoint's temporary directory (remote: its objects, unless metadata.json was written) (best
// effort).
void abandon_checkpoint(const PendingCheckpoint& p);

// Deletes a published checkpoint (remote: metadata.json first, so that it stops counting at once).
void remove_checkpoint(const std::string& dir);

// Remote folders: prefixes folder/name/ holding rank files and receipts and nothing else, no metadata.json in
// particular (saves a crash interrupted). Empty for local folders (their interrupted saves are hidden .tmp-
// directories).
std::vector<std::string> incomplete_checkpoints(const std::string& folder);

// Published checkpoints in `folder`, oldest first by (batch, name): its subfolders (remote: prefixes) whose
// metadata.json parses and carries Tessera's format marker ("format": "tessera-checkpoint"). Hidden entries (.tmp-,
// .old-) and symlinks are never listed. Anything else there is not a checkpoint (a user's notes holding a
// metadata.json of their own, an export): when `others` is given, those subfolders are appended to it, so that a
// caller about to delete checkpoints can say what it leaves alone.
std::vector<std::string> list_checkpoints(const std::string& folder, std::vector<std::string>* others = nullptr);

// Whether `dir` holds a metadata.json with Tessera's format marker (that parses, and whose file names are safe).
bool is_checkpoint(const std::string& dir);

// Local folders: publish_checkpoint moves a checkpoint re-saved under its own name aside to .old-NAME before renaming
// the new one into place, so a crash between the two renames leaves NAME missing (and `latest` pointing at nothing).
// Renames back each .old-NAME whose NAME is missing and which is a complete checkpoint (sizes checked), with a
// warning, and returns the restored paths; an .old-NAME that is not complete is left as it is, with a warning. Never
// throws for a folder it cannot read or a rename that fails (warnings). Nothing for remote folders (no rename there).
std::vector<std::string> restore_moved_aside(const std::string& folder);

// The published checkpoints in `folder` in the order to try them when resuming: `latest_name`'s target first, then
// the others from newest to oldest (paths lexically normal, no duplicates). `latest_name` must hold (point at) one
// safe name, of an entry of `folder`: anything else ("../x", "/abs", "a/b") throws tessera::Error naming it.
std::vector<std::string> checkpoint_candidates(const std::string& folder, const std::string& latest_name);

// The newest checkpoint in `folder` that validates (metadata parses, every file exists with its size and checksum):
// `latest_name`'s target first, then the others from newest to oldest. Each invalid one is skipped with a warning
// naming the file and the problem. nullopt when there is none. Without `verify_checksums` only sizes are checked (for
// remote folders, where a checksum costs a download; CheckpointReader verifies them as it reads).
std::optional<std::string> find_latest_valid_checkpoint(const std::string& folder, const std::string& latest_name,
                                                        bool verify_checksums = true);

// Empty when `dir` is a complete, uncorrupted checkpoint; otherwise what is wrong, naming the file. metadata.json's
// file names must be safe relative names ("rank0.safetensors"; never "../x" or "/abs"), wherever it is read.
std::string validate_checkpoint(const std::string& dir, bool verify_checksums = true);

// Reads element ranges of a checkpoint's logical tensors, whatever the world size and sharding that wrote it.
// Opening checks the metadata (format, version and file names); files are memory-mapped on first use and their size
// and checksum verified then, before any of their bytes are returned (set verify_checksums false to skip the
// checksum). The checksum is computed through the same mapping the reads copy from, so verifying and reading cost one
// pass over the disk. A remote checkpoint's files are downloaded (parallel byte ranges) into a temporary folder the
// reader owns and removes, then read the same way. Not thread-safe.
class CheckpointReader {
 public:
  explicit CheckpointReader(std::string dir, bool verify_checksums = true);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& dir() const { return dir_; }
  const nlohmann::json& metadata() const { return meta_; }
  int world_size() const { return meta_.at("world_size").get<int>(); }
  bool has_tensor(const std::string& name) const { return meta_.at("tensors").contains(name); }
  // Logical tensor names starting with `prefix` (e.g. "model/"), sorted.
  std::vector<std::string> tensor_names(const std::string& prefix = "") const;
  std::vector<int64_t> shape(const std::string& name) const;
  at::ScalarType dtype(const std::string& name) const;

  // Copies elements [start, start + dst.numel()) of tensor `name` into `dst` (contiguous, any dtype: converted).
  // Throws naming the tensor when it is absent, the range is out of bounds or not fully covered by the pieces.
  void read(const std::string& name, int64_t start, at::Tensor dst);
  // The same for elements [start, start + dst.numel()) of the sub-matrix name[:, col_start : col_start + cols] of a
  // 2-D tensor, counted row-major in it.
  void read_window(const std::string& name, int64_t col_start, int64_t cols, int64_t start, at::Tensor dst);
  // The whole tensor, in its stored dtype and shape.
  at::Tensor read_full(const std::string& name);
  // Rank `rank`'s own tensor `key` (RankPayload::local), or an undefined tensor when that rank stored none.
  at::Tensor read_local(int rank, const std::string& key);

 private:
  SafetensorsFile& file(int rank);
  // A piece's `numel` values (its metadata.json entry `piece`), checked against its file.
  at::Tensor piece_values(const nlohmann::json& piece, int64_t numel);
  std::string dir_;
  bool verify_;
  nlohmann::json meta_;
  std::map<int, std::shared_ptr<SafetensorsFile>> files_;
  std::string cache_;  // remote checkpoints: where their files are downloaded ("" until the first)
};

}  // namespace tessera::checkpoint
