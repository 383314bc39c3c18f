// Logger destinations: the console (plain lines, or a progress bar on a terminal) and a JSON-lines metrics file
// (TensorBoard event files: tensorboard.h).
#pragma once

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "tessera/config/component.h"
#include "tessera/config/time.h"
#include "tessera/core/callback.h"
#include "tessera/loggers/options.h"

namespace tessera::loggers {

// Prints to stderr (Composer's console_stream default). Train metrics are collected during a batch and printed
// every `interval` (ba or ep) as one line: "[epoch=0][batch=10/300] loss/train/total: 5.1234, ...". Eval metrics
// print when evaluation ends. With progress_bar on a terminal, a bar is redrawn in place every batch instead.
class ConsoleLogger : public core::LoggerDestination {
 public:
  ConsoleLogger(config::Time interval, bool progress_bar, std::FILE* stream = stderr);
  std::string name() const override { return "ConsoleLogger"; }
  void log_metrics(const core::Metrics& metrics, int64_t step) override;
  void run_event(core::Event event, core::State& state, core::Logger& logger) override;

 private:
  void print(const std::string& prefix);
  config::Time interval_;
  bool bar_;
  std::FILE* stream_;
  core::Metrics pending_;
  bool in_eval_ = false;
  bool bar_drawn_ = false;
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

std::shared_ptr<core::LoggerDestination> make_console_logger(const config::Time& interval, bool progress_bar);
}  // namespace tessera::loggers
