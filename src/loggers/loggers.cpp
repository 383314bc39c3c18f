// Console and JSON-lines logger destinations, and the factory of every logger (TensorBoard's is in tensorboard.cpp).
#include "tessera/loggers/loggers.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "tessera/core/state.h"
#include "tessera/loggers/tensorboard.h"
#include "tessera/util/error.h"
#include "tessera/util/python_json.h"

namespace tessera::loggers {
namespace {

using core::Event;

std::string format_value(double v) {
  if (std::isfinite(v) && v != 0 && (std::fabs(v) >= 1e5 || std::fabs(v) < 1e-3)) return fmt::format("{:.4e}", v);
  return fmt::format("{:.4f}", v);
}

// Batches in the whole run, when max_duration says (for the "b/N" display); 0 when unknown.
int64_t total_batches(const core::State& s) {
  const config::Time& m = s.max_duration;
  const int64_t global_batch = s.device_train_batch_size * s.world_size;
  switch (m.unit()) {
    case config::TimeUnit::kBatch:
      return m.count();
    case config::TimeUnit::kEpoch:
      return s.dataloader_len ? m.count() * *s.dataloader_len : 0;
    case config::TimeUnit::kSample:
      return global_batch > 0 ? (m.count() + global_batch - 1) / global_batch : 0;
    case config::TimeUnit::kToken: {
      const int64_t per = global_batch * s.max_seq_len;
      return per > 0 ? (m.count() + per - 1) / per : 0;
    }
    default:
      return 0;
  }
}

}  // namespace

ConsoleLogger::ConsoleLogger(config::Time interval, bool progress_bar, std::FILE* stream)
    : interval_(interval), bar_(progress_bar && isatty(fileno(stream)) != 0), stream_(stream) {}

void ConsoleLogger::log_metrics(const core::Metrics& metrics, int64_t /*step*/) {
  for (const auto& [k, v] : metrics) pending_[k] = v;
}

void ConsoleLogger::print(const std::string& prefix) {
  if (pending_.empty()) return;
  std::string line = prefix;
  bool first = true;
  for (const auto& [k, v] : pending_) {
    line += fmt::format("{}{}: {}", first ? " " : ", ", k, format_value(v));
    first = false;
  }
  if (bar_drawn_) std::fputc('\n', stream_);
  bar_drawn_ = false;
  std::fprintf(stream_, "%s\n", line.c_str());
  std::fflush(stream_);
  pending_.clear();
}

void ConsoleLogger::run_event(Event event, core::State& s, core::Logger& /*logger*/) {
  const int64_t total = total_batches(s);
  const std::string of = total > 0 ? fmt::format("/{}", total) : "";
  if (event == Event::kEvalStart) {
    // Train metrics of a batch that was not printed stay pending until the next print.
    in_eval_ = true;
    return;
  }
  if (event == Event::kEvalEnd) {
    in_eval_ = false;
    core::Metrics train = std::move(pending_);
    pending_.clear();
    for (auto it = train.begin(); it != train.end();) {
      if (it->first.rfind("metrics/eval/", 0) == 0) {
        pending_.insert(*it);
        it = train.erase(it);
      } else {
        ++it;
      }
    }
    print(fmt::format("[eval][batch={}{}]", s.timestamp.batch, of));
    pending_ = std::move(train);
    return;
  }
  const bool batch_end = event == Event::kBatchEnd && interval_.unit() == config::TimeUnit::kBatch;
  const bool epoch_end = event == Event::kEpochEnd && interval_.unit() == config::TimeUnit::kEpoch;
  if (!batch_end && !epoch_end) return;
  if (bar_ && event == Event::kBatchEnd) {
    const double frac = total > 0 ? static_cast<double>(s.timestamp.batch) / static_cast<double>(total) : 0;
    const int width = 30;
    const int filled = static_cast<int>(frac * width);
    auto it = pending_.find("loss/train/total");
    std::fprintf(stream_, "\r[epoch=%lld] %s%s %lld%s loss: %s", static_cast<long long>(s.timestamp.epoch),
                 std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(width - filled), '.').c_str(),
                 static_cast<long long>(s.timestamp.batch), of.c_str(),
                 it != pending_.end() ? format_value(it->second).c_str() : "-");
    std::fflush(stream_);
    bar_drawn_ = true;
  }
  const int64_t count = batch_end ? s.timestamp.batch : s.timestamp.epoch;
  const int64_t every = std::max<int64_t>(1, interval_.count());
  const bool last = s.reached_max_duration();
  if (count % every == 0 || last) {
    if (bar_) {
      if (!last) return;  // the bar shows progress; the final line still prints
    }
    print(fmt::format("[epoch={}][batch={}{}]", s.timestamp.epoch, s.timestamp.batch, of));
  }
}

JsonlLogger::JsonlLogger(const std::string& path) : path_(path) {
  const std::filesystem::path p(path);
  std::error_code ec;
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
  out_.open(path, std::ios::out | std::ios::app);
  if (!out_) throw Error("jsonl logger", fmt::format("{}: cannot open for writing", path));
}

void JsonlLogger::log_metrics(const core::Metrics& metrics, int64_t step) {
  nlohmann::ordered_json j;
  j["batch"] = step;
  for (const auto& [k, v] : metrics) j[k] = v;
  out_ << j.dump() << '\n';
}

void JsonlLogger::log_hyperparameters(const nlohmann::json& hparams) {
  out_ << nlohmann::json{{"hyperparameters", hparams}}.dump() << '\n';
  out_.flush();
}

void JsonlLogger::run_event(Event event, core::State& /*state*/, core::Logger& /*logger*/) {
  if (event == Event::kBatchEnd || event == Event::kEvalEnd || event == Event::kFitEnd) out_.flush();
}

void JsonlLogger::close(core::State& /*state*/, core::Logger& /*logger*/) {
  out_.flush();
}

std::shared_ptr<core::LoggerDestination> make_console_logger(const config::Time& interval, bool progress_bar) {
  return std::make_shared<ConsoleLogger>(interval, progress_bar);
}

}  // namespace tessera::loggers
