// Checkpoints of a training run: State <-> the sharded checkpoint format (tessera/checkpoint/checkpoint.h).
//
// What a checkpoint holds: the model (this rank's parameter shards, or rank 0's whole parameters without sharding),
// the optimizer state (same layout), the state of algorithms and callbacks (e.g. EMA's weights), the timestamp, each
// rank's RNG state, the data loader's resumption state and the trainer's own counters (loss scale), plus the resolved
// recipe and the model's HF config. Loading reshards: any world size and strategy reads any checkpoint.
//
// The trainer creates a CheckpointSaver when the recipe has save_folder, and calls load_checkpoint for load_path
// and autoresume; see docs/checkpointing.md.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/checkpoint/checkpoint.h"
#include "tessera/config/time.h"
#include "tessera/core/callback.h"
#include "tessera/core/state.h"

namespace tessera::callbacks {

struct SaveOptions {
  std::string folder;                                   // save_folder, {run_name} filled in
  std::string filename = "ep{epoch}-ba{batch}";         // save_filename: names each checkpoint directory
  std::string latest_filename = "latest";               // save_latest_filename: symlink to the newest checkpoint
  config::Time interval = config::Time::batches(1000);  // save_interval; the end of training always saves
  // -1: all; otherwise the newest max(1, K) in the folder of the Tessera checkpoints named by `filename` (anything
  // else there is left alone, and logged once)
  int64_t num_checkpoints_to_keep = -1;
  bool overwrite = false;     // false: a folder holding checkpoints later than the run's start is an error
  bool weights_only = false;  // save_weights_only: the model only (no optimizer, RNG or data position)
  bool async = true;          // save_async: write in a background thread after copying the state to host memory
  std::chrono::milliseconds timeout{600000};  // how long rank 0 waits for every rank's file
};

// Trainer state saved with each checkpoint (data-loader position, loss scale, ...), taken on the main thread.
using ExtraState = std::function<nlohmann::json()>;

// Saves the run every `interval` (at BATCH_CHECKPOINT, or EPOCH_CHECKPOINT for epoch intervals; at most once per
// batch) and at the end of training. Every rank writes its part; rank 0 publishes (see checkpoint.h). With `async`,
// the blocking part is copying the tensors to host memory ("checkpoint/blocking_seconds" is logged); the files are
// written by a background thread while training goes on, and the next save, FIT_END or close() waits for it. A failed
// write (e.g. a full disk) raises tessera::Error naming the file and the OS error at the next of those points; the
// previous checkpoint and `latest` stay as they were. FIT_END waits for a save to be published; close() without it
// (the run is ending on an error, e.g. a collective failed because a rank died) lets this rank's own write finish but
// does not wait for other ranks' files: rank 0 abandons that save at once rather than after `timeout`.
class CheckpointSaver : public core::Callback {
 public:
  CheckpointSaver(SaveOptions options, ExtraState extra);
  ~CheckpointSaver() override;
  std::string name() const override { return "CheckpointSaver"; }
  void run_event(core::Event event, core::State& state, core::Logger& logger) override;
  void close(core::State& state, core::Logger& logger) override;

  // Saves now (all ranks together).
  void save(core::State& state, core::Logger& logger);
  // Waits for a background write; rethrows its error.
  void wait();
  const SaveOptions& options() const { return o_; }
  // The latest save, once its write finished (after wait()): bytes of this rank's file, seconds from the start of
  // the save to the end of the write (rank 0: to publication), and the blocking part.
  struct SaveReport {
    uint64_t bytes = 0;
    double seconds = 0;
    double blocking_seconds = 0;
  };
  const SaveReport& last_save() const { return last_save_; }
  // Checkpoint directories this saver published (rank 0; others: the names it wrote parts of).
  const std::vector<std::string>& saved() const { return saved_; }

 private:
  bool due(core::Event event, const core::State& state) const;
  // Logs, once per path, what in the save folder this saver leaves alone (not a checkpoint it names).
  void mention_left_alone(const std::vector<std::string>& others);
  SaveOptions o_;
  ExtraState extra_;
  std::thread writer_;
  std::atomic<bool> closing_{false};  // close() before FIT_END: rank 0 stops waiting for other ranks' files
  std::exception_ptr error_;
  std::optional<int64_t> last_saved_batch_;
  std::vector<std::string> saved_;
  SaveReport last_save_;
  std::set<std::string> mentioned_;  // rank 0: paths mention_left_alone logged
};

struct LoadOptions {
  bool weights_only = false;         // load_weights_only: the model only
  bool strict_model_weights = true;  // load_strict_model_weights: missing or unexpected weights are errors
  bool restore_progress = true;      // timestamp, RNG and data position (false: a rollback keeps going forward)
};

struct LoadedCheckpoint {
  std::string path;
  nlohmann::json metadata;  // empty for an HF folder
  bool full_state = false;  // optimizer, timestamp and the rest were restored (not weights only)
};

// Restores `state` from `path`: a Tessera checkpoint directory, or a Hugging Face folder (config.json +
// safetensors; weights only). Every rank calls it. Each rank verifies the size and checksum of every file it reads
// from, before using its bytes, and the ranks agree on the outcome: if any rank fails, every rank throws
// tessera::Error (the failing rank's names the file, tensor or key; the others name that rank).
LoadedCheckpoint load_checkpoint(core::State& state, const std::string& path, const LoadOptions& options);

// autoresume: loads the newest loadable checkpoint in `folder`: latest_filename's target first, then the others from
// newest to oldest, skipping each that fails to load (corrupt, truncated, incomplete) with a warning naming the file.
// nullopt when the folder holds no checkpoint. When it holds some and none loads, throws: the state may be partly
// overwritten by then, so the run must not go on from it.
std::optional<LoadedCheckpoint> load_newest_checkpoint(core::State& state, const std::string& folder,
                                                       const std::string& latest_filename, const LoadOptions& options);

nlohmann::json timestamp_to_json(const config::Timestamp& t);
config::Timestamp timestamp_from_json(const nlohmann::json& j);

}  // namespace tessera::callbacks
