// `wandb` (Composer's WandBLogger) without Python or a server: the run is written as the `wandb` package writes an
// offline run, so that `wandb sync` uploads it unchanged (docs/formats/wandb.md):
//
//   <dir>/wandb/offline-run-<YYYYMMDD_HHMMSS>-<id>/run-<id>.wandb   the transaction log
//   <dir>/wandb/offline-run-.../files/                               (empty: nothing to upload beside the log)
//   <dir>/wandb/latest-run -> offline-run-...
//
// The log holds, as wandb_internal.Record protobuf messages in LevelDB log framing: the run (id, project, entity,
// group, name, tags, notes, job type, host, start time, the resolved recipe as config, resume), one history row per
// step (every metric logged at that step, with _step, _runtime and _timestamp) followed by the summary's update, and at
// the end the summary's runtime and the exit record (0, or 1 when an error ended the run).
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>

#include "tessera/core/callback.h"
#include "tessera/loggers/options.h"

namespace tessera::loggers {

namespace wandb {

// The standard CRC-32 (zlib's) of `type` followed by `data`: a chunk's checksum.
uint32_t chunk_crc(uint8_t type, std::string_view data);

// Appends records to a new .wandb file: the 7-byte header (":W&B", 0xBEE1, version 0), then each record in 32 KiB
// blocks as FULL, or FIRST, MIDDLE... LAST chunks. Records reach the file at flush() (whole records only).
class RecordWriter {
 public:
  explicit RecordWriter(const std::string& path);
  ~RecordWriter();
  RecordWriter(const RecordWriter&) = delete;
  RecordWriter& operator=(const RecordWriter&) = delete;
  void append(std::string_view record);
  void flush();

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  uint64_t offset_ = 0;  // of the next byte, counting what is pending
  std::string pending_;
};

// A JSON number as wandb writes it (NaN, Infinity and -Infinity as Python's json does).
std::string number_json(double v);

}  // namespace wandb

// The folder holding the runs' wandb/ folder: init_kwargs.dir, else WANDB_DIR, else the working directory.
std::string wandb_root(const WandbLoggerOptions& options);

class WandbLogger : public core::LoggerDestination {
 public:
  WandbLogger(WandbLoggerOptions options, const core::RunContext& run);
  ~WandbLogger() override;
  std::string name() const override { return "WandBLogger"; }
  void log_metrics(const core::Metrics& metrics, int64_t step) override;
  void log_hyperparameters(const nlohmann::json& hparams) override;
  void run_event(core::Event event, core::State& state, core::Logger& logger) override;
  void close(core::State& state, core::Logger& logger) override;
  // The run's folder and id (set once the run has started, at FIT_START or EVAL_STANDALONE_START).
  const std::string& run_dir() const { return run_dir_; }
  const std::string& run_id() const { return id_; }

 private:
  void start(bool resumed);
  void write_row();

  WandbLoggerOptions o_;
  core::RunContext run_;
  std::string config_;  // the serialized ConfigRecord (log_hyperparameters)
  std::string id_;
  std::string run_dir_;
  std::unique_ptr<wandb::RecordWriter> writer_;
  int64_t num_ = 0;  // records written
  double started_ = 0;
  int64_t row_step_ = -1;
  std::map<std::string, double> row_;  // the current step's metrics
  // The last fit or standalone evaluation started reached its end: the run finished (else it failed or stopped).
  bool finished_ = false;
  bool closed_ = false;
};

}  // namespace tessera::loggers
