// Logger destinations: the console (plain lines, or a progress bar on a terminal) and a JSON-lines metrics file
// (TensorBoard event files: tensorboard.h).
#pragma once

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/config/component.h"
#include "tessera/config/time.h"
#include "tessera/core/callback.h"
#include "tessera/loggers/options.h"

namespace tessera::loggers {

// What the console shows (the recipe's log_to_console, console_log_interval, progress_bar; `train --verbose`).
struct ConsoleOptions {
  config::Time interval{1, config::TimeUnit::kBatch};  // a line every interval (ba or ep)
  bool progress_bar = false;                           // on a terminal, a bar redrawn in place instead of the lines
  bool verbose = false;                                // every metric on each line, as logged
  // At the end: what the run wrote ("checkpoint runs/x/checkpoints/ep0-ba300", ...), asked after every FIT_END.
  std::function<std::vector<std::string>()> outputs;
};

// Prints to stderr (Composer's console_stream default), on rank 0:
// - at FIT_START a banner: the model, its parameters, the world and precision, the batch and the tokens planned;
// - every `interval` one line of at most ~120 characters: "[batch 10/300] loss 5.1234 | lr 3.0e-04 | gnorm 1.23 |
//   8.1k tok/s | MFU 31.2% | ETA 1m52s" (the metrics that were logged, tokens/s and ETA from this run's own clock;
//   with `verbose` every metric logged since the previous line, by its full name); after the first few batches, the
//   estimated time to train;
// - after each evaluation its metrics;
// - at close() (after FIT_END and the final evaluation) a summary: batches, tokens, wall time, why it stopped, the
//   last loss, each eval metric's last and best value, and the `outputs`.
// With progress_bar on a terminal, a bar with the loss, rate and ETA is redrawn in place every batch instead of the
// lines (the final line still prints). The full metric set is always in the JSONL and TensorBoard loggers.
class ConsoleLogger : public core::LoggerDestination {
 public:
  explicit ConsoleLogger(ConsoleOptions options, std::FILE* stream = stderr);
  std::string name() const override { return "ConsoleLogger"; }
  void log_metrics(const core::Metrics& metrics, int64_t step) override;
  void run_event(core::Event event, core::State& state, core::Logger& logger) override;
  void close(core::State& state, core::Logger& logger) override;

 private:
  void banner(const core::State& s);
  void train_line(const core::State& s, const std::string& of);
  void eval_lines(const core::State& s, const std::string& of);
  void summary(const core::State& s);
  void emit(const std::string& line);
  // Seconds since FIT_START; since the end of the first batch this process ran; the pace since then (none before a
  // second batch); the ETA at that pace (a resumed run's from its own batches too).
  double elapsed() const;
  double since_first() const;
  std::optional<double> seconds_per_batch(const core::State& s) const;
  std::string eta(const core::State& s, int64_t total) const;

  ConsoleOptions o_;
  bool bar_;
  std::FILE* stream_;
  core::Metrics pending_;
  bool bar_drawn_ = false;
  bool started_ = false;
  bool fit_ended_ = false;
  bool summarised_ = false;
  bool estimated_ = false;
  std::chrono::steady_clock::time_point start_;
  // The first batch this process finished (its end time and counters): the pace excludes the first batch's warm-up.
  std::optional<std::pair<std::chrono::steady_clock::time_point, config::Timestamp>> first_;
  std::optional<std::pair<std::chrono::steady_clock::time_point, int64_t>> last_line_;  // time, tokens
  int64_t start_batch_ = 0, start_token_ = 0;
  double last_loss_ = std::nan("");
  std::map<std::string, std::pair<double, double>> eval_;  // metric -> (last, best)
};

// `jsonl`: one JSON object per line in `filename` ({run_name} and {rank} are filled in): first
// {"hyperparameters": <resolved recipe>}, then {"batch": b, "<metric>": value, ...} for every log call. Lines are
// flushed at the end of each batch and evaluation, so a crashed run keeps what it logged.
class JsonlLogger : public core::LoggerDestination {
 public:
  explicit JsonlLogger(const std::string& path);
  std::string name() const override { return "JsonlLogger"; }
  void log_metrics(const core::Metrics& metrics, int64_t step) override;
  void log_hyperparameters(const nlohmann::json& hparams) override;
  void run_event(core::Event event, core::State& state, core::Logger& logger) override;
  void close(core::State& state, core::Logger& logger) override;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

std::shared_ptr<core::LoggerDestination> make_console_logger(ConsoleOptions options);
}  // namespace tessera::loggers
