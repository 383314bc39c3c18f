// `wandb`: a Weights & Biases offline run written in C++ (docs/formats/wandb.md).
#include "tessera/loggers/wandb.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>
#include <zlib.h>
#include <nlohmann/json.hpp>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>

#include "protobuf_wire.h"
#include "tessera/core/state.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"
#include "tessera/version.h"

namespace tessera::loggers {
namespace wandb {
namespace {

constexpr uint64_t kBlock = 32768;
constexpr uint64_t kChunkHeader = 7;
enum Chunk : uint8_t { kFull = 1, kFirst = 2, kMiddle = 3, kLast = 4 };

}  // namespace

uint32_t chunk_crc(uint8_t type, std::string_view data) {
  uLong c = crc32(0L, &type, 1);
  // zlib's length is a uInt: feed large payloads in pieces (a chunk is at most 32761 bytes anyway).
  for (size_t at = 0; at < data.size(); at += 1U << 30) {
    const size_t n = std::min<size_t>(data.size() - at, 1U << 30);
    c = crc32(c, reinterpret_cast<const Bytef*>(data.data() + at), static_cast<uInt>(n));
  }
  return static_cast<uint32_t>(c);
}

RecordWriter::RecordWriter(const std::string& path) : path_(path) {
  file_ = std::fopen(path.c_str(), "wbx");  // a new file: never another run's
  if (file_ == nullptr) throw Error("wandb", fmt::format("{}: cannot create: {}", path, std::strerror(errno)));
  pending_ = std::string(":W&B\xe1\xbe\x00", kChunkHeader);  // ident, magic 0xBEE1 (little endian), version 0
  offset_ = kChunkHeader;
}

RecordWriter::~RecordWriter() {
  try {
    flush();
  } catch (const Error& e) {
    spdlog::warn("{}", e.what());
  }
  if (file_ != nullptr) std::fclose(file_);
}

void RecordWriter::append(std::string_view record) {
  bool first = true;
  while (true) {
    uint64_t left = kBlock - offset_ % kBlock;
    if (left < kChunkHeader) {  // a block's last bytes that cannot hold a chunk header: zeros
      pending_.append(left, '\0');
      offset_ += left;
      left = kBlock;
    }
    const uint64_t room = left - kChunkHeader;
    const bool fits = record.size() <= room;
    const uint8_t type = fits ? (first ? kFull : kLast) : (first ? kFirst : kMiddle);
    const std::string_view data = record.substr(0, fits ? record.size() : room);
    wire::put_le(pending_, chunk_crc(type, data), 4);
    wire::put_le(pending_, data.size(), 2);
    pending_.push_back(static_cast<char>(type));
    pending_.append(data);
    offset_ += kChunkHeader + data.size();
    if (fits) return;
    record.remove_prefix(room);
    first = false;
  }
}

void RecordWriter::flush() {
  if (file_ == nullptr || pending_.empty()) return;
  if (std::fwrite(pending_.data(), 1, pending_.size(), file_) != pending_.size() || std::fflush(file_) != 0) {
    throw Error("wandb", fmt::format("{}: cannot write: {}", path_, std::strerror(errno)));
  }
  pending_.clear();
}

std::string number_json(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{}", static_cast<int64_t>(v));
  return fmt::format("{}", v);  // the shortest form that reads back as the same double
}

}  // namespace wandb

namespace {

namespace fs = std::filesystem;
using wire::put_bytes;
using wire::put_double;
using wire::put_int;

// wandb_internal.proto's field numbers (wandb 0.31).
namespace f {
constexpr uint32_t kRecordNum = 1, kRecordHistory = 2, kRecordSummary = 3, kRecordRun = 17, kRecordExit = 18,
                   kRecordInfo = 200;
constexpr uint32_t kRunId = 1, kRunEntity = 2, kRunProject = 3, kRunConfig = 4, kRunGroup = 6, kRunJobType = 7,
                   kRunDisplayName = 8, kRunNotes = 9, kRunTags = 10, kRunHost = 13, kRunStartTime = 17,
                   kRunTelemetry = 19, kRunResume = 24;
constexpr uint32_t kItemKey = 1, kItemNestedKey = 2, kItemValueJson = 16;  // History-, Config-, SummaryItem
constexpr uint32_t kUpdate = 1;                                            // Config-, SummaryRecord.update
constexpr uint32_t kHistoryItem = 1, kHistoryStep = 2, kStepNum = 1;
constexpr uint32_t kExitCode = 1, kExitRuntime = 2;
constexpr uint32_t kTimestampSeconds = 1, kTimestampNanos = 2;
constexpr uint32_t kTelemetryFeature = 3, kFeatureOffline = 4, kFeatureLibCpp = 57;
constexpr uint32_t kInfoStreamId = 1;
}  // namespace f

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

// An item of a history row or an update of the summary (nested_key, as wandb-core writes them) or the config (key).
std::string item(std::string_view key, std::string_view value_json, bool nested = true) {
  std::string out;
  put_bytes(out, nested ? f::kItemNestedKey : f::kItemKey, key);
  put_bytes(out, f::kItemValueJson, value_json);
  return out;
}

std::string record(int64_t num, uint32_t field, std::string_view body, std::string_view stream = {}) {
  std::string out;
  put_int(out, f::kRecordNum, num);
  put_bytes(out, field, body);
  if (!stream.empty()) {
    std::string info;
    put_bytes(info, f::kInfoStreamId, stream);
    put_bytes(out, f::kRecordInfo, info);
  }
  return out;
}

// wandb's run ids: 8 characters of [a-z0-9]; a given one must not hold `:;,#?/'` or surrounding spaces.
std::string new_run_id() {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device rd;
  std::string id;
  for (int i = 0; i < 8; ++i) id.push_back(kAlphabet[rd() % (sizeof(kAlphabet) - 1)]);
  return id;
}

bool valid_run_id(const std::string& id) {
  return !id.empty() && id.find_first_of(":;,#?/' \t\n") == std::string::npos;
}

// Where a run name's id is kept, so that the run autoresume continues is the same W&B run.
fs::path id_file(const fs::path& wandb_dir, const std::string& run_name) {
  std::string safe;
  for (const char c : run_name)
    safe.push_back(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ? c : '_');
  return wandb_dir / "tessera-run-ids" / safe;
}

}  // namespace

std::string wandb_root(const WandbLoggerOptions& options) {
  if (!options.dir.empty()) return options.dir;
  return env("WANDB_DIR").empty() ? "." : env("WANDB_DIR");
}

WandbLogger::WandbLogger(WandbLoggerOptions options, const core::RunContext& run) : o_(std::move(options)), run_(run) {
  if (o_.project.empty()) o_.project = env("WANDB_PROJECT").empty() ? "uncategorized" : env("WANDB_PROJECT");
  if (o_.entity.empty()) o_.entity = env("WANDB_ENTITY");
  o_.dir = wandb_root(o_);
  if (o_.name.empty()) o_.name = run_.run_name;
  if (!o_.rank_zero_only) {  // Composer's: one run per rank, grouped under the name
    if (o_.group.empty()) o_.group = o_.name;
    o_.name += fmt::format("-rank{}", run_.rank);
  }
  if (!o_.id.empty() && !valid_run_id(o_.id)) {
    throw ConfigError("wandb", fmt::format("init_kwargs.id \"{}\": a W&B run id has none of :;,#?/' or spaces", o_.id));
  }
}

WandbLogger::~WandbLogger() {
  if (!closed_ && writer_) {
    try {
      write_row();
      writer_->flush();
    } catch (const Error& e) {
      spdlog::warn("{}", e.what());
    }
  }
}

void WandbLogger::log_hyperparameters(const nlohmann::json& hparams) {
  // wandb.config.update(recipe): each top-level key an item, its value as JSON; `_wandb` as the SDK writes it.
  config_.clear();
  wire::put_bytes(config_, f::kUpdate, item("_wandb", "{}", false));
  for (const auto& [k, v] : hparams.items()) wire::put_bytes(config_, f::kUpdate, item(k, v.dump(), false));
}

void WandbLogger::start(bool resumed) {
  const fs::path wandb_dir = fs::path(o_.dir) / "wandb";
  fs::create_directories(wandb_dir);
  id_ = o_.id;
  const fs::path ids = id_file(wandb_dir, o_.name);
  if (id_.empty() && resumed) {
    std::ifstream in(ids);
    std::getline(in, id_);
    if (!valid_run_id(id_)) id_.clear();
  }
  if (id_.empty()) id_ = new_run_id();
  if (o_.id.empty()) {
    fs::create_directories(ids.parent_path());
    util::write_file_atomically(ids.string(), id_ + "\n", "wandb");
  }
  started_ = now_seconds();
  const std::time_t t = static_cast<std::time_t>(started_);
  std::tm local{};
  localtime_r(&t, &local);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d_%H%M%S", &local);
  // A second start of this id within the same second (a fast restart) takes a suffix, as wandb's sync-dir suffix.
  std::string dir_name = fmt::format("offline-run-{}-{}", stamp, id_);
  for (int n = 1; fs::exists(wandb_dir / dir_name); ++n) dir_name = fmt::format("offline-run-{}-{}-{}", stamp, id_, n);
  run_dir_ = (wandb_dir / dir_name).string();
  fs::create_directories(fs::path(run_dir_) / "files");
  writer_ = std::make_unique<wandb::RecordWriter>((fs::path(run_dir_) / fmt::format("run-{}.wandb", id_)).string());
  // latest-run: a relative link, replaced in one rename.
  const fs::path link = wandb_dir / "latest-run", tmp = wandb_dir / fmt::format("latest-run.{}", ::getpid());
  std::error_code ec;
  fs::remove(tmp, ec);
  fs::create_directory_symlink(dir_name, tmp, ec);
  if (!ec) fs::rename(tmp, link, ec);

  std::string r;
  put_bytes(r, f::kRunId, id_);
  if (!o_.entity.empty()) put_bytes(r, f::kRunEntity, o_.entity);
  put_bytes(r, f::kRunProject, o_.project);
  if (!config_.empty()) put_bytes(r, f::kRunConfig, config_);
  if (!o_.group.empty()) put_bytes(r, f::kRunGroup, o_.group);
  if (!o_.job_type.empty()) put_bytes(r, f::kRunJobType, o_.job_type);
  put_bytes(r, f::kRunDisplayName, o_.name);
  if (!o_.notes.empty()) put_bytes(r, f::kRunNotes, o_.notes);
  for (const std::string& tag : o_.tags) put_bytes(r, f::kRunTags, tag);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  put_bytes(r, f::kRunHost, host);
  std::string ts;
  put_int(ts, f::kTimestampSeconds, static_cast<int64_t>(started_));
  put_int(ts, f::kTimestampNanos, static_cast<int64_t>((started_ - std::floor(started_)) * 1e9));
  put_bytes(r, f::kRunStartTime, ts);
  std::string feature, telemetry;
  put_int(feature, f::kFeatureOffline, 1);
  put_int(feature, f::kFeatureLibCpp, 1);
  put_bytes(telemetry, f::kTelemetryFeature, feature);
  put_bytes(r, f::kRunTelemetry, telemetry);
  if (resumed || o_.resume) put_int(r, f::kRunResume, 1);
  writer_->append(record(++num_, f::kRecordRun, r, id_));
  writer_->flush();
  if (run_.rank == 0 || !o_.rank_zero_only) {
    spdlog::info("wandb: offline run {} in {} (upload it with `wandb sync {}`)", id_, run_dir_, run_dir_);
  }
}

void WandbLogger::log_metrics(const core::Metrics& metrics, int64_t step) {
  // wandb.log(metrics, step): a row gathers every metric of its step and is written when a later step begins.
  if (step != row_step_ && !row_.empty()) write_row();
  if (step < row_step_) {
    spdlog::warn("wandb: metrics at step {} after step {}: W&B drops steps that go back; not logged", step, row_step_);
    return;
  }
  row_step_ = step;
  for (const auto& [k, v] : metrics) row_[k] = v;
}

void WandbLogger::write_row() {
  if (row_.empty() || !writer_) return;
  const double now = now_seconds();
  std::string items;
  for (const auto& [k, v] : row_) put_bytes(items, f::kHistoryItem, item(k, wandb::number_json(v)));
  put_bytes(items, f::kHistoryItem, item("_step", std::to_string(row_step_)));
  put_bytes(items, f::kHistoryItem, item("_runtime", wandb::number_json(now - started_)));
  put_bytes(items, f::kHistoryItem, item("_timestamp", wandb::number_json(now)));
  // The summary follows the history: the latest value of each metric (the items are the same messages).
  writer_->append(record(++num_, f::kRecordSummary, items));
  std::string history = items, step;
  if (row_step_ != 0) put_int(step, f::kStepNum, row_step_);
  put_bytes(history, f::kHistoryStep, step);
  writer_->append(record(++num_, f::kRecordHistory, history));
  writer_->flush();
  row_.clear();
}

void WandbLogger::run_event(core::Event event, core::State& state, core::Logger& /*logger*/) {
  const bool starts = event == core::Event::kFitStart || event == core::Event::kEvalStandaloneStart;
  if (starts && !writer_) start(state.timestamp.batch > 0);
  if (starts) finished_ = false;
  if (event == core::Event::kFitEnd || event == core::Event::kEvalStandaloneEnd) finished_ = true;
}

void WandbLogger::close(core::State& /*state*/, core::Logger& /*logger*/) {
  if (closed_ || !writer_) return;
  closed_ = true;
  write_row();
  const int64_t runtime = static_cast<int64_t>(now_seconds() - started_);
  std::string summary, nested;
  put_bytes(nested, f::kItemNestedKey, "_wandb");
  put_bytes(nested, f::kItemNestedKey, "runtime");
  put_bytes(nested, f::kItemValueJson, std::to_string(runtime));
  put_bytes(summary, f::kUpdate, nested);
  writer_->append(record(++num_, f::kRecordSummary, summary));
  std::string exit;
  if (!finished_) put_int(exit, f::kExitCode, 1);  // an error ended the run: W&B shows it failed
  if (runtime != 0) put_int(exit, f::kExitRuntime, runtime);
  writer_->append(record(++num_, f::kRecordExit, exit));
  writer_->flush();
}

}  // namespace tessera::loggers
