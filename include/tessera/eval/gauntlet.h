// LLM Foundry's Eval Gauntlet (callbacks/eval_gauntlet_callback.py) driven by its YAML (eval_gauntlet_v0.3.yaml):
// per benchmark (accuracy - random_baseline) / (1 - random_baseline), a weighted mean per category (a category with
// a missing benchmark is dropped), and named averages of the categories present.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tessera/config/value.h"
#include "tessera/eval/icl.h"

namespace tessera::eval {

struct GauntletBenchmark {
  std::string name;
  int64_t num_fewshot = 0;
  double random_baseline = 0.0;
};

struct GauntletCategory {
  std::string name;
  std::vector<GauntletBenchmark> benchmarks;
};

struct GauntletConfig {
  std::string weighting = "EQUAL";  // EQUAL | SAMPLE_SZ | LOG_SAMPLE_SZ
  bool subtract_random_baseline = true;
  bool rescale_accuracy = true;
  std::vector<GauntletCategory> categories;
  std::vector<std::pair<std::string, std::vector<std::string>>> averages;  // default: default_average of all
};

// Reads `eval_gauntlet:` from a YAML file (or the file's top level). Throws ConfigError naming the file and line.
GauntletConfig load_gauntlet(const std::string& path);
// The same from a mapping already parsed (a recipe's inline `eval_gauntlet`).
GauntletConfig parse_gauntlet(const config::Value& gauntlet);

// Scores in order: categories present (in config order), then the named averages; keys are the names logged as
// icl/metrics/eval_gauntlet/{name}. A benchmark is the results with its task name and num_fewshot (several with
// has_categories: the mean of their accuracies).
std::vector<std::pair<std::string, double>> compute_gauntlet(const GauntletConfig& config,
                                                             const std::vector<IclResult>& results);

}  // namespace tessera::eval
