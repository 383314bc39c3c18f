// Console and JSON-lines logger destinations, and the factory of every logger (TensorBoard's is in tensorboard.cpp).
#include "tessera/loggers/loggers.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "tessera/core/precision.h"
#include "tessera/core/state.h"
#include "tessera/loggers/tensorboard.h"
#include "tessera/models/causal_lm.h"
#include "tessera/util/clock_duration.h"
#include "tessera/util/error.h"
#include "tessera/util/python_json.h"
#include "tessera/version.h"

namespace tessera::loggers {
namespace {

using core::Event;

std::string format_value(double v) {
  if (std::isfinite(v) && v != 0 && (std::fabs(v) >= 1e5 || std::fabs(v) < 1e-3)) return fmt::format("{:.4e}", v);
  return fmt::format("{:.4f}", v);
}

// `prefix` and every metric by its full name: "[...] loss/train/total: 5.1234, lr-...: 0.0010" (--verbose).
std::string every_metric(std::string prefix, const core::Metrics& metrics) {
  bool first = true;
  for (const auto& [k, v] : metrics) {
    prefix += fmt::format("{}{}: {}", first ? " " : ", ", k, format_value(v));
    first = false;
  }
  return prefix;
}

// 950, 8.1k, 1.23M, 4.50G, 1.20T.
std::string human_count(double v) {
  const double a = std::fabs(v);
  if (a < 1e3) return fmt::format("{:.0f}", v);
  if (a < 1e6) return fmt::format("{:.3g}k", v / 1e3);
  if (a < 1e9) return fmt::format("{:.3g}M", v / 1e6);
  if (a < 1e12) return fmt::format("{:.3g}G", v / 1e9);
  return fmt::format("{:.3g}T", v / 1e12);
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

ConsoleLogger::ConsoleLogger(ConsoleOptions options, std::FILE* stream)
    : o_(std::move(options)), bar_(o_.progress_bar && isatty(fileno(stream)) != 0), stream_(stream) {}

void ConsoleLogger::log_metrics(const core::Metrics& metrics, int64_t /*step*/) {
  for (const auto& [k, v] : metrics) pending_[k] = v;
}

void ConsoleLogger::emit(const std::string& line) {
  if (bar_drawn_) std::fputc('\n', stream_);
  bar_drawn_ = false;
  std::fprintf(stream_, "%s\n", line.c_str());
  std::fflush(stream_);
}

double ConsoleLogger::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

std::optional<double> ConsoleLogger::seconds_per_batch(const core::State& s) const {
  if (!first_ || s.timestamp.batch <= first_->second.batch) return std::nullopt;
  return since_first() / static_cast<double>(s.timestamp.batch - first_->second.batch);
}

double ConsoleLogger::since_first() const {
  return first_ ? std::chrono::duration<double>(std::chrono::steady_clock::now() - first_->first).count() : 0.0;
}

std::string ConsoleLogger::eta(const core::State& s, int64_t total) const {
  const std::optional<double> pace = seconds_per_batch(s);
  if (!pace || total <= 0) return "";
  return util::clock_duration(*pace * static_cast<double>(std::max<int64_t>(0, total - s.timestamp.batch)));
}

void ConsoleLogger::banner(const core::State& s) {
  const int64_t total = total_batches(s);
  const int64_t per_step = s.device_train_batch_size * s.world_size;
  const int64_t micro = s.device_train_microbatch_size > 0 ? s.device_train_microbatch_size : s.device_train_batch_size;
  const int64_t accumulation = micro > 0 ? (s.device_train_batch_size + micro - 1) / micro : 1;
  std::string lines = fmt::format("Tessera {}: run {}\n", version(), s.run_name);
  if (s.model) {
    lines += fmt::format("  model       {}\n", s.model->describe());
    lines += fmt::format("  parameters  {}\n", human_count(static_cast<double>(s.model->num_params())));
  }
  lines += fmt::format("  world       {} rank{} on {}, precision {}\n", s.world_size, s.world_size == 1 ? "" : "s",
                       s.device.str(), core::to_string(s.precision));
  lines += fmt::format(
      "  batch       {} sequences x {} tokens per step ({} per rank: microbatch {}, {} accumulation "
      "step{})\n",
      per_step, s.max_seq_len, s.device_train_batch_size, micro, accumulation, accumulation == 1 ? "" : "s");
  std::string duration = fmt::format("  duration    {}", s.max_duration.str());
  if (total > 0) {
    duration += fmt::format(" = {} batches, {} tokens", total,
                            human_count(static_cast<double>(total * per_step * s.max_seq_len)));
  }
  if (s.timestamp.batch > 0) duration += fmt::format(" (resuming after batch {})", s.timestamp.batch);
  emit(lines + duration);
}

void ConsoleLogger::train_line(const core::State& s, const std::string& of) {
  if (o_.verbose) {
    emit(every_metric(fmt::format("[epoch={}][batch={}{}]", s.timestamp.epoch, s.timestamp.batch, of), pending_));
    return;
  }
  std::vector<std::string> parts;
  if (auto it = pending_.find("loss/train/total"); it != pending_.end()) {
    parts.push_back("loss " + format_value(it->second));
  }
  for (const auto& [k, v] : pending_) {
    if (k.rfind("lr-", 0) == 0) {
      parts.push_back(fmt::format("lr {:.2e}", v));
      break;
    }
  }
  if (auto it = pending_.find("l2_norm/grad/global"); it != pending_.end()) {
    parts.push_back(fmt::format("gnorm {:.3g}", it->second));
  }
  const auto now = std::chrono::steady_clock::now();
  if (last_line_ && s.timestamp.token > last_line_->second) {
    const double seconds = std::chrono::duration<double>(now - last_line_->first).count();
    if (seconds > 0) {
      parts.push_back(human_count(static_cast<double>(s.timestamp.token - last_line_->second) / seconds) + " tok/s");
    }
  }
  last_line_ = {now, s.timestamp.token};
  if (auto it = pending_.find("throughput/device/mfu"); it != pending_.end()) {
    parts.push_back(fmt::format("MFU {:.1f}%", 100.0 * it->second));
  }
  const std::string left = eta(s, total_batches(s));
  if (!left.empty() && !s.reached_max_duration()) parts.push_back("ETA " + left);
  std::string line = fmt::format("[batch {}{}{}]", s.timestamp.batch, of,
                                 s.timestamp.epoch > 0 ? fmt::format(" ep {}", s.timestamp.epoch) : "");
  for (size_t i = 0; i < parts.size(); ++i) line += (i == 0 ? " " : " | ") + parts[i];
  emit(line);
}

void ConsoleLogger::eval_lines(const core::State& s, const std::string& of) {
  if (o_.verbose) {
    emit(every_metric(fmt::format("[eval][batch={}{}]", s.timestamp.batch, of), pending_));
    return;
  }
  // Metric names without "metrics/eval/" (or "metrics/"), as many to a line as fit in ~120 characters.
  const std::string head = fmt::format("[eval @ batch {}{}]", s.timestamp.batch, of);
  std::string line = head;
  for (const auto& [k, v] : pending_) {
    const std::string name = k.rfind("metrics/eval/", 0) == 0 ? k.substr(13)
                             : k.rfind("metrics/", 0) == 0    ? k.substr(8)
                                                              : k;
    const std::string part = name + " " + format_value(v);
    if (line.size() > head.size() && line.size() + 3 + part.size() > 120) {
      emit(line);
      line = std::string(head.size(), ' ');
    }
    line += (line.size() > head.size() && line.back() != ' ' ? " | " : " ") + part;
  }
  emit(line);
}

void ConsoleLogger::summary(const core::State& s) {
  using Stop = core::State::StopReason;
  const char* why = "max_duration reached";
  switch (s.stop_reason) {
    case Stop::kRequested:
      why = "stopped by a callback or algorithm (early stop)";
      break;
    case Stop::kPreempted:
      why = "preempted: checkpoint saved, resume to go on";
      break;
    case Stop::kUnhealthy:
      why = "stopped by the health monitor";
      break;
    case Stop::kNodeBad:
      why = "this node was marked bad";
      break;
    case Stop::kNone:
      break;
  }
  if (!fit_ended_) why = "stopped by the error above";  // closed without FIT_END: an exception ended the run
  const double seconds = elapsed();
  const int64_t tokens = s.timestamp.token - start_token_;
  std::string text = fmt::format("done: batch {} ({} this run), {} tokens in {} ({} tok/s); {}", s.timestamp.batch,
                                 s.timestamp.batch - start_batch_, human_count(static_cast<double>(tokens)),
                                 util::clock_duration(seconds),
                                 human_count(seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0), why);
  if (std::isfinite(last_loss_)) text += fmt::format("\n  last loss   {}", format_value(last_loss_));
  for (const auto& [name, values] : eval_) {
    text +=
        fmt::format("\n  eval        {} {} (best {})", name, format_value(values.first), format_value(values.second));
  }
  if (o_.outputs) {
    for (const std::string& out : o_.outputs()) text += "\n  " + out;
  }
  emit(text);
}

void ConsoleLogger::run_event(Event event, core::State& s, core::Logger& /*logger*/) {
  const int64_t total = total_batches(s);
  const std::string of = total > 0 ? fmt::format("/{}", total) : "";
  if (event == Event::kFitStart) {
    start_ = std::chrono::steady_clock::now();
    start_batch_ = s.timestamp.batch;
    start_token_ = s.timestamp.token;
    last_line_ = {start_, s.timestamp.token};
    started_ = true;
    banner(s);
    return;
  }
  if (event == Event::kEvalStart) return;  // train metrics of a batch not printed yet stay pending
  if (event == Event::kEvalEnd) {
    core::Metrics train = std::move(pending_);
    pending_.clear();
    for (auto it = train.begin(); it != train.end();) {
      if (it->first.rfind("metrics/eval/", 0) == 0) {
        const std::string name = it->first.substr(13);
        // Lower is better for a loss or perplexity, higher for an accuracy.
        const bool lower = name.find("Accuracy") == std::string::npos;
        auto [e, fresh] = eval_.try_emplace(name, it->second, it->second);
        e->second.first = it->second;
        if (!fresh)
          e->second.second = lower ? std::min(e->second.second, it->second) : std::max(e->second.second, it->second);
        pending_.insert(*it);
        it = train.erase(it);
      } else {
        ++it;
      }
    }
    if (!pending_.empty()) eval_lines(s, of);
    pending_ = std::move(train);
    return;
  }
  if (event == Event::kFitEnd) {
    fit_ended_ = true;  // the summary waits for close(): the final evaluation runs after FIT_END
    return;
  }
  if (event == Event::kBatchEnd) {
    if (auto it = pending_.find("loss/train/total"); it != pending_.end()) last_loss_ = it->second;
    if (!first_) {
      first_ = {std::chrono::steady_clock::now(), s.timestamp};
    } else if (!estimated_ && total > 0 && s.timestamp.batch - first_->second.batch >= 4) {
      estimated_ = true;  // the pace of this process's batches after its first (warm-up) one
      const double pace = *seconds_per_batch(s);
      const int64_t to_go = std::max<int64_t>(0, total - s.timestamp.batch);
      emit(fmt::format("estimated time to train: {} more ({:.3g} s per batch over batches {}-{}; {} to go)",
                       eta(s, total), pace, first_->second.batch + 1, s.timestamp.batch, to_go));
    }
  }
  const bool batch_end = event == Event::kBatchEnd && o_.interval.unit() == config::TimeUnit::kBatch;
  const bool epoch_end = event == Event::kEpochEnd && o_.interval.unit() == config::TimeUnit::kEpoch;
  if (!batch_end && !epoch_end) return;
  if (bar_ && event == Event::kBatchEnd) {
    const double frac = total > 0 ? static_cast<double>(s.timestamp.batch) / static_cast<double>(total) : 0;
    const int width = 30;
    const int filled = static_cast<int>(frac * width);
    std::string rate;
    if (seconds_per_batch(s) && since_first() > 0) {
      rate = fmt::format(" | {} tok/s",
                         human_count(static_cast<double>(s.timestamp.token - first_->second.token) / since_first()));
    }
    const std::string left = eta(s, total);
    std::fprintf(stream_, "\r[batch %lld%s] %s%s loss %s%s%s\033[K", static_cast<long long>(s.timestamp.batch),
                 of.c_str(), std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(width - filled), '.').c_str(),
                 std::isfinite(last_loss_) ? format_value(last_loss_).c_str() : "-", rate.c_str(),
                 left.empty() ? "" : (" | ETA " + left).c_str());
    std::fflush(stream_);
    bar_drawn_ = true;
  }
  const int64_t count = batch_end ? s.timestamp.batch : s.timestamp.epoch;
  const int64_t every = std::max<int64_t>(1, o_.interval.count());
  const bool last = s.reached_max_duration();
  if ((count % every == 0 || last) && !(bar_ && !last)) {  // the bar shows progress; the final line still prints
    train_line(s, of);
    pending_.clear();
  }
}

void ConsoleLogger::close(core::State& s, core::Logger& /*logger*/) {
  if (started_ && !summarised_) summary(s);
  summarised_ = true;
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

std::shared_ptr<core::LoggerDestination> make_console_logger(ConsoleOptions options) {
  return std::make_shared<ConsoleLogger>(std::move(options));
}

}  // namespace tessera::loggers
