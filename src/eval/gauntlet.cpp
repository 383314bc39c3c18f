// The Eval Gauntlet aggregation (see gauntlet.h).
#include "tessera/eval/gauntlet.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "tessera/config/value.h"
#include "tessera/config/yaml_file.h"
#include "tessera/util/error.h"

namespace tessera::eval {

GauntletConfig load_gauntlet(const std::string& path) {
  const config::Value root = config::load_yaml_file(path, "eval", "Eval Gauntlet file");
  const config::Value* g = root.find("eval_gauntlet");
  return parse_gauntlet(g != nullptr ? *g : root);
}

GauntletConfig parse_gauntlet(const config::Value& gauntlet) {
  const config::Value* g = &gauntlet;
  auto fail = [&](const config::Value* v, const std::string& what) {
    throw ConfigError("eval", fmt::format("{}: eval_gauntlet: {}", (v != nullptr ? v : g)->origin().describe(), what));
  };
  if (!g->is_map()) fail(g, "expected a mapping");
  GauntletConfig c;
  auto flag = [&](const char* key, bool& out) {
    if (const config::Value* v = g->find(key)) {
      auto b = v->as_bool();
      if (!b) fail(v, fmt::format("{}: expected a boolean", key));
      out = *b;
    }
  };
  flag("subtract_random_baseline", c.subtract_random_baseline);
  flag("rescale_accuracy", c.rescale_accuracy);
  if (const config::Value* v = g->find("weighting")) {
    c.weighting = v->text();
    if (c.weighting != "EQUAL" && c.weighting != "SAMPLE_SZ" && c.weighting != "LOG_SAMPLE_SZ") {
      fail(v, fmt::format("weighting: expected EQUAL, SAMPLE_SZ or LOG_SAMPLE_SZ, got \"{}\"", c.weighting));
    }
  }
  const config::Value* cats = g->find("categories");
  if (cats == nullptr || !cats->is_sequence()) fail(cats, "categories: expected a list");
  for (const config::Value& cat : cats->items()) {
    const config::Value* name = cat.find("name");
    const config::Value* benches = cat.find("benchmarks");
    if (name == nullptr || !name->is_scalar()) fail(&cat, "categories: each needs a `name`");
    if (benches == nullptr || !benches->is_sequence()) fail(&cat, "categories: each needs a list `benchmarks`");
    GauntletCategory gc{name->text(), {}};
    for (const config::Value& b : benches->items()) {
      const config::Value* bn = b.find("name");
      const config::Value* k = b.find("num_fewshot");
      const config::Value* rb = b.find("random_baseline");
      if (bn == nullptr || k == nullptr || rb == nullptr || !k->as_int() || !rb->as_double()) {
        fail(&b, "benchmarks: each needs `name`, integer `num_fewshot` and numeric `random_baseline`");
      }
      gc.benchmarks.push_back({bn->text(), *k->as_int(), *rb->as_double()});
    }
    c.categories.push_back(std::move(gc));
  }
  if (const config::Value* avgs = g->find("averages"); avgs != nullptr && !avgs->is_null()) {
    if (!avgs->is_map()) fail(avgs, "averages: expected a mapping of name -> list of categories");
    for (const auto& [avg, list] : avgs->entries()) {
      if (!list.is_sequence()) fail(&list, fmt::format("averages.{}: expected a list of categories", avg));
      std::vector<std::string> names;
      for (const config::Value& n : list.items()) names.push_back(n.text());
      c.averages.emplace_back(avg, std::move(names));
    }
  } else {
    std::vector<std::string> all;
    for (const auto& cat : c.categories) all.push_back(cat.name);
    c.averages.emplace_back("default_average", std::move(all));
  }
  return c;
}

std::vector<std::pair<std::string, double>> compute_gauntlet(const GauntletConfig& config,
                                                             const std::vector<IclResult>& results) {
  std::vector<std::pair<std::string, double>> scores;
  for (const GauntletCategory& cat : config.categories) {
    double weighted = 0.0;
    double total_weight = 0.0;
    std::vector<std::string> missing;
    for (const GauntletBenchmark& b : cat.benchmarks) {
      // The benchmark's accuracy; a task evaluated per category (has_categories) counts with the unweighted mean of
      // its categories' accuracies, as LLM Foundry's EvalGauntlet averages its sub-category metrics.
      double accuracy = 0.0;
      int64_t total = 0, parts = 0;
      for (const IclResult& x : results) {
        if (x.task != b.name || x.num_fewshot != b.num_fewshot) continue;
        accuracy += x.accuracy();
        total += x.total;
        ++parts;
      }
      if (parts == 0) {
        missing.push_back(fmt::format("{}/{}-shot", b.name, b.num_fewshot));
        continue;
      }
      double score = accuracy / static_cast<double>(parts);
      if (config.subtract_random_baseline) score -= b.random_baseline;
      if (config.subtract_random_baseline && config.rescale_accuracy) score /= 1.0 - b.random_baseline;
      double weight = 1.0;
      if (config.weighting == "SAMPLE_SZ") weight = static_cast<double>(total);
      if (config.weighting == "LOG_SAMPLE_SZ") weight = std::max(std::log2(static_cast<double>(total)), 1.0);
      weighted += score * weight;
      total_weight += weight;
    }
    if (!missing.empty()) {
      spdlog::warn("eval gauntlet: dropping category {}: missing {}", cat.name, fmt::join(missing, ", "));
      continue;
    }
    scores.emplace_back(cat.name, total_weight > 0 ? weighted / total_weight : 0.0);
  }
  std::vector<std::pair<std::string, double>> averages;
  for (const auto& [name, cats] : config.averages) {
    double sum = 0.0;
    int n = 0;
    for (const auto& [cat, score] : scores) {
      if (std::find(cats.begin(), cats.end(), cat) != cats.end()) {
        sum += score;
        ++n;
      }
    }
    averages.emplace_back(name, n > 0 ? sum / n : 0.0);
  }
  scores.insert(scores.end(), averages.begin(), averages.end());
  return scores;
}

}  // namespace tessera::eval
