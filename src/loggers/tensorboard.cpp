// TensorBoard event files: hand-encoded Event/Summary protobuf messages in TFRecord framing (no protobuf library).
#include "tessera/loggers/tensorboard.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <utility>

#include "protobuf_wire.h"
#include "tessera/core/state.h"
#include "tessera/loggers/loggers.h"
#include "tessera/util/device.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"

namespace tessera::loggers {
namespace {

using core::Event;

constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1U) != 0 ? (c >> 1) ^ 0x82F63B78U : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

using wire::kVarint;
using wire::put_bytes;
using wire::put_double;
using wire::put_float;
using wire::put_int;
using wire::put_key;
using wire::put_le;
using wire::put_varint;

// Event fields (event.proto).
constexpr uint32_t kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5;
// Summary (summary.proto): repeated Value value = 1; Value: tag = 1, simple_value = 2, tensor = 8, metadata = 9.
constexpr uint32_t kSummaryValue = 1, kValueTag = 1, kValueSimple = 2, kValueTensor = 8, kValueMetadata = 9;
// SummaryMetadata.plugin_data = 1; PluginData.plugin_name = 1.
constexpr uint32_t kMetadataPluginData = 1, kPluginName = 1;
// TensorProto: dtype = 1, tensor_shape = 2, string_val = 8; DataType DT_STRING = 7.
constexpr uint32_t kTensorDtype = 1, kTensorShape = 2, kTensorStringVal = 8, kDtString = 7;

// Fields are written in field-number order and proto3 defaults (step 0) are left out, as protobuf's own serializer
// does, so the bytes equal the reference implementation's (tested).
std::string event_header(double wall_time, int64_t step) {
  std::string e;
  put_double(e, kEventWallTime, wall_time);
  if (step != 0) put_int(e, kEventStep, step);
  return e;
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

namespace tensorboard {

uint32_t crc32c(std::string_view data) {
  uint32_t c = 0xFFFFFFFFU;
  for (const char ch : data) c = kCrc32cTable[(c ^ static_cast<uint8_t>(ch)) & 0xFFU] ^ (c >> 8);
  return c ^ 0xFFFFFFFFU;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8U;
}

std::string frame_record(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  put_le(out, data.size(), 8);
  put_le(out, masked_crc32c(out), 4);
  out.append(data);
  put_le(out, masked_crc32c(data), 4);
  return out;
}

std::string file_version_event(double wall_time) {
  std::string e;
  put_double(e, kEventWallTime, wall_time);
  put_bytes(e, kEventFileVersion, "brain.Event:2");
  return e;
}

std::string scalars_event(double wall_time, int64_t step, const core::Metrics& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    put_bytes(v, kValueTag, tag);
    put_float(v, kValueSimple, static_cast<float>(value));
    put_bytes(summary, kSummaryValue, v);
  }
  std::string e = event_header(wall_time, step);
  put_bytes(e, kEventSummary, summary);
  return e;
}

std::string text_event(double wall_time, int64_t step, std::string_view tag, std::string_view markdown) {
  std::string plugin;
  put_bytes(plugin, kPluginName, "text");
  std::string metadata;
  put_bytes(metadata, kMetadataPluginData, plugin);
  std::string tensor;
  put_key(tensor, kTensorDtype, kVarint);
  put_varint(tensor, kDtString);
  put_bytes(tensor, kTensorShape, "");  // a scalar: no dimensions
  put_bytes(tensor, kTensorStringVal, markdown);
  std::string v;
  put_bytes(v, kValueTag, tag);
  put_bytes(v, kValueTensor, tensor);
  put_bytes(v, kValueMetadata, metadata);
  std::string summary;
  put_bytes(summary, kSummaryValue, v);
  std::string e = event_header(wall_time, step);
  put_bytes(e, kEventSummary, summary);
  return e;
}

}  // namespace tensorboard

EventFileWriter::EventFileWriter(const std::string& log_dir) {
  static std::atomic<int> counter{0};
  std::error_code ec;
  std::filesystem::create_directories(log_dir, ec);
  const double now = wall_seconds();
  path_ =
      (std::filesystem::path(log_dir) / fmt::format("events.out.tfevents.{:010d}.{}.{}.{}", static_cast<int64_t>(now),
                                                    util::host_name(), getpid(), counter++))
          .string();
  file_ = std::fopen(path_.c_str(), "wb");
  if (file_ == nullptr) {
    throw Error("tensorboard logger", fmt::format("{}: cannot open for writing: {}", path_, std::strerror(errno)));
  }
  append(tensorboard::file_version_event(now));
  flush();
}

EventFileWriter::~EventFileWriter() {
  try {
    flush();
  } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch): destructors must not throw
  }
  std::fclose(file_);
}

void EventFileWriter::append(const std::string& event) {
  pending_ += tensorboard::frame_record(event);
}

void EventFileWriter::add_scalars(const core::Metrics& scalars, int64_t step) {
  if (!scalars.empty()) append(tensorboard::scalars_event(wall_seconds(), step, scalars));
}

void EventFileWriter::add_text(std::string_view tag, std::string_view markdown, int64_t step) {
  append(tensorboard::text_event(wall_seconds(), step, tag, markdown));
}

void EventFileWriter::flush() {
  if (pending_.empty()) return;
  const size_t n = std::fwrite(pending_.data(), 1, pending_.size(), file_);
  pending_.erase(0, n);
  if (!pending_.empty() || std::fflush(file_) != 0) {
    throw Error("tensorboard logger", fmt::format("{}: write failed: {}", path_, std::strerror(errno)));
  }
}

TensorBoardLogger::TensorBoardLogger(TensorBoardLoggerOptions options, std::string run_name)
    : o_(std::move(options)), run_name_(std::move(run_name)) {}

void TensorBoardLogger::open(int64_t rank) {
  if (opened_) return;
  opened_ = true;
  if (o_.rank_zero_only && rank != 0) return;
  writer_ = std::make_unique<EventFileWriter>(util::fill_path_pattern(o_.log_dir, run_name_, rank));
}

void TensorBoardLogger::log_metrics(const core::Metrics& metrics, int64_t step) {
  open(0);
  if (writer_) writer_->add_scalars(metrics, step);
}

void TensorBoardLogger::log_hyperparameters(const nlohmann::json& hparams) {
  open(0);
  if (!writer_) return;
  // Markdown: a code block is the lines indented by four spaces.
  std::string text;
  const std::string json = hparams.dump(2);
  size_t start = 0;
  while (start <= json.size()) {
    const size_t end = std::min(json.find('\n', start), json.size());
    text += "    " + json.substr(start, end - start) + "\n";
    start = end + 1;
  }
  writer_->add_text("hyperparameters", text, 0);
}

void TensorBoardLogger::run_event(Event event, core::State& s, core::Logger& /*logger*/) {
  if (event == Event::kInit) {
    if (!s.run_name.empty()) run_name_ = s.run_name;
    open(s.rank);
    return;
  }
  if (!writer_) return;
  const bool interval = event == Event::kBatchEnd && s.timestamp.batch % o_.flush_interval == 0;
  if (interval || event == Event::kEpochEnd || event == Event::kEvalEnd || event == Event::kFitEnd) writer_->flush();
}

void TensorBoardLogger::close(core::State& /*state*/, core::Logger& /*logger*/) {
  if (writer_) writer_->flush();
}

}  // namespace tessera::loggers
