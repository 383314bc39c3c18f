// The console logger: the start banner, short lines with the rate and ETA, evaluation lines, the verbose form, and the
// end summary with the best evaluation and what the run wrote.
#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "tessera/core/callback.h"
#include "tessera/core/state.h"
#include "tessera/loggers/loggers.h"

// A namespace of its own: the sanitizer trees' unity batches put this file beside the other logger tests.
namespace tessera::loggers::console_test {
namespace {

using core::Event;

// Runs a 20-batch fit through a ConsoleLogger writing to a temporary file and returns what it printed.
std::string console_of(ConsoleOptions options, int64_t eval_every = 10) {
  std::FILE* out = std::tmpfile();
  ConsoleLogger console(std::move(options), out);
  core::State s;
  s.run_name = "console-run";
  s.max_duration = config::Time::batches(20);
  s.device_train_batch_size = 8;
  s.device_train_microbatch_size = 4;
  s.max_seq_len = 128;
  core::Logger logger(s);
  console.run_event(Event::kFitStart, s, logger);
  for (int64_t b = 1; b <= 20; ++b) {
    s.previous_timestamp = s.timestamp;
    s.timestamp.batch = b;
    s.timestamp.token = b * 8 * 128;
    console.log_metrics({{"loss/train/total", 10.0 - 0.25 * static_cast<double>(b)},
                         {"lr-DecoupledAdamW/group0", 1e-3},
                         {"l2_norm/grad/global", 1.5},
                         {"throughput/device/mfu", 0.312},
                         {"memory/rss_gb", 1.25}},
                        b);
    console.run_event(Event::kBatchEnd, s, logger);
    if (b % eval_every == 0) {
      console.run_event(Event::kEvalStart, s, logger);
      // The second evaluation is worse: the summary keeps the best (the lowest cross-entropy, the highest accuracy).
      const double ce = b == 10 ? 4.5 : 4.75;
      console.log_metrics({{"metrics/eval/LanguageCrossEntropy", ce}, {"metrics/eval/Accuracy", b == 10 ? 0.5 : 0.75}},
                          b);
      console.run_event(Event::kEvalEnd, s, logger);
    }
  }
  console.run_event(Event::kFitEnd, s, logger);
  console.close(s, logger);
  std::rewind(out);
  std::string text;
  for (int c; (c = std::fgetc(out)) != EOF;) text += static_cast<char>(c);
  std::fclose(out);
  return text;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Console, BannerShortLinesEvalsAndASummaryWithTheBestEvalAndTheOutputs) {
  ConsoleOptions o;
  o.interval = config::Time::batches(5);
  o.outputs = [] { return std::vector<std::string>{"checkpoint  runs/x/ep0-ba20"}; };
  const std::string text = console_of(o);
  const std::vector<std::string> lines = lines_of(text);
  ASSERT_GE(lines.size(), 12u) << text;
  EXPECT_TRUE(lines[0].starts_with("Tessera ")) << text;
  EXPECT_TRUE(has(lines[0], "run console-run")) << text;
  EXPECT_TRUE(has(text,
                  "  batch       8 sequences x 128 tokens per step (8 per rank: microbatch 4, 2 accumulation "
                  "steps)"))
      << text;
  EXPECT_TRUE(has(text, "  duration    20ba = 20 batches, 20.5k tokens")) << text;
  EXPECT_TRUE(has(text, "\nestimated time to train: ")) << text;
  EXPECT_TRUE(has(text, " s per batch over batches 2-5; 15 to go)\n")) << text;
  for (const std::string& line : lines) EXPECT_LE(line.size(), 120u) << line;
  // One line per 5 batches with the chosen metrics, and no other metric.
  std::string batch5;
  for (const std::string& line : lines) {
    if (line.starts_with("[batch 5/20]")) batch5 = line;
  }
  EXPECT_TRUE(batch5.starts_with("[batch 5/20] loss 8.7500 | lr 1.00e-03 | gnorm 1.5 |")) << text;
  EXPECT_TRUE(has(batch5, " tok/s | MFU 31.2% | ETA ")) << batch5;
  EXPECT_FALSE(has(text, "rss_gb")) << text;
  EXPECT_TRUE(has(text, "[eval @ batch 10/20] Accuracy 0.5000 | LanguageCrossEntropy 4.5000")) << text;
  // The summary, after the last line.
  EXPECT_TRUE(has(text, "\ndone: batch 20 (20 this run), 20.5k tokens in ")) << text;
  EXPECT_TRUE(has(text, "max_duration reached")) << text;
  EXPECT_TRUE(has(text, "\n  last loss   5.0000\n")) << text;
  EXPECT_TRUE(has(text, "\n  eval        LanguageCrossEntropy 4.7500 (best 4.5000)\n")) << text;
  EXPECT_TRUE(has(text, "\n  eval        Accuracy 0.7500 (best 0.7500)\n")) << text;
  EXPECT_TRUE(text.ends_with("\n  checkpoint  runs/x/ep0-ba20\n")) << text;
}

TEST(Console, VerboseLinesCarryEveryMetricByItsFullName) {
  ConsoleOptions o;
  o.interval = config::Time::batches(10);
  o.verbose = true;
  const std::string text = console_of(o);
  EXPECT_TRUE(has(text,
                  "[epoch=0][batch=10/20] l2_norm/grad/global: 1.5000, loss/train/total: 7.5000, "
                  "lr-DecoupledAdamW/group0: 0.0010, memory/rss_gb: 1.2500, throughput/device/mfu: 0.3120"))
      << text;
  EXPECT_TRUE(has(text,
                  "[eval][batch=10/20] metrics/eval/Accuracy: 0.5000, metrics/eval/LanguageCrossEntropy: "
                  "4.5000"))
      << text;
}

}  // namespace
}  // namespace tessera::loggers::console_test
