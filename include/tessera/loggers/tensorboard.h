// TensorBoard event files, written without TensorFlow or a protobuf library: each record is a hand-encoded
// `tensorflow.Event` protobuf message in TFRecord framing. What is written is described in docs/formats/tensorboard.md.
//
//   EventFileWriter w("runs/x/tensorboard");          // creates events.out.tfevents.<time>.<host>.<pid>.<n>
//   w.add_scalars({{"loss/train/total", 5.1}}, 10);   // one Event with one summary value per metric
//   w.flush();                                         // records reach the file only here (whole records only)
//
// Not thread-safe. The writer owns its file; it is flushed and closed by the destructor.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

#include "tessera/core/callback.h"
#include "tessera/loggers/options.h"

namespace tessera::loggers {

namespace tensorboard {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord uses.
uint32_t crc32c(std::string_view data);
// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(std::string_view data);
// One TFRecord: uint64 length (little endian), masked CRC of those 8 bytes, the data, masked CRC of the data.
std::string frame_record(std::string_view data);

// Serialized `Event` messages (tensorflow/core/util/event.proto):
//   the first record of every file: wall_time, file_version "brain.Event:2";
std::string file_version_event(double wall_time);
//   scalars: wall_time, step, summary { value { tag, simple_value (float32) } ... };
std::string scalars_event(double wall_time, int64_t step, const core::Metrics& scalars);
//   a text summary (the text plugin's format: a DT_STRING scalar tensor with plugin_name "text", markdown).
std::string text_event(double wall_time, int64_t step, std::string_view tag, std::string_view markdown);

}  // namespace tensorboard

// Appends events to one new file in `log_dir` (created if missing), named as TensorBoard's own writers name them:
// events.out.tfevents.<%010d unix seconds>.<hostname>.<pid>.<n>. Records are buffered in memory and written whole at
// flush(), so a reader never sees a torn record. Throws tessera::Error when the file cannot be created or written.
class EventFileWriter {
 public:
  explicit EventFileWriter(const std::string& log_dir);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  void add_scalars(const core::Metrics& scalars, int64_t step);
  void add_text(std::string_view tag, std::string_view markdown, int64_t step);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void append(const std::string& event);
  std::string path_;
  std::FILE* file_ = nullptr;
  std::string pending_;
};

// `tensorboard` (Composer's TensorboardLogger): scalars of every log call at step = the batch count, and the resolved
// recipe as a text summary `hyperparameters` (JSON in a markdown code block) at step 0. The file is opened at INIT in
// `log_dir` ({run_name} and {rank} filled in); with rank_zero_only, ranks other than 0 write nothing. Flushed every
// `flush_interval` batches (at BATCH_END), at EPOCH_END, EVAL_END, FIT_END and close().
class TensorBoardLogger : public core::LoggerDestination {
 public:
  TensorBoardLogger(TensorBoardLoggerOptions options, std::string run_name);
  std::string name() const override { return "TensorBoardLogger"; }
  void log_metrics(const core::Metrics& metrics, int64_t step) override;
  void log_hyperparameters(const nlohmann::json& hparams) override;
  void run_event(core::Event event, core::State& state, core::Logger& logger) override;
  void close(core::State& state, core::Logger& logger) override;
  // The event file's path; empty until INIT (or the first log call), and on ranks that do not write.
  std::string path() const { return writer_ ? writer_->path() : std::string(); }

 private:
  void open(int64_t rank);
  TensorBoardLoggerOptions o_;
  std::string run_name_;
  bool opened_ = false;
  std::unique_ptr<EventFileWriter> writer_;
};

}  // namespace tessera::loggers
