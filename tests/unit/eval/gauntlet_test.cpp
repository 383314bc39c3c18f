// Eval Gauntlet: LLM Foundry's v0.3 YAML loads; rescaled scores, category means (missing benchmark drops the
// category), named averages over the categories present. Checked end to end in tests/compat/test_icl_eval.py.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tessera/eval/gauntlet.h"
#include "test_util.h"

namespace tessera::eval {
namespace {

// A result labelled "{task}/{k}-shot" or "{task}/{k}-shot/{category}".
IclResult result(const std::string& label, int64_t correct, int64_t total) {
  IclResult r;
  r.label = label;
  const size_t slash = label.find('/');
  const size_t shot = label.find("-shot", slash);
  r.task = label.substr(0, slash);
  r.num_fewshot = std::stoll(label.substr(slash + 1, shot - slash - 1));
  if (shot + 5 < label.size()) r.category = label.substr(shot + 6);
  r.correct = correct;
  r.total = total;
  return r;
}

TEST(Gauntlet, LoadsLlmFoundryV03) {
  const GauntletConfig c = load_gauntlet(
      (std::filesystem::path(::tessera::testing::source_dir()) / "tests" / "data" / "icl" / "eval_gauntlet_v0.3.yaml")
          .string());
  EXPECT_EQ(c.weighting, "EQUAL");
  ASSERT_EQ(c.categories.size(), 5u);
  EXPECT_EQ(c.categories[0].name, "world_knowledge");
  EXPECT_EQ(c.categories[0].benchmarks[2].name, "arc_easy");
  EXPECT_EQ(c.categories[0].benchmarks[2].num_fewshot, 3);
  EXPECT_DOUBLE_EQ(c.categories[0].benchmarks[2].random_baseline, 0.25);
  ASSERT_EQ(c.averages.size(), 1u);
  EXPECT_EQ(c.averages[0].first, "core_average");
  EXPECT_EQ(c.averages[0].second.size(), 5u);
}

TEST(Gauntlet, RescalesAveragesAndDropsIncompleteCategories) {
  GauntletConfig c;
  c.categories = {{"commonsense", {{"copa", 0, 0.5}, {"piqa", 0, 0.5}}},
                  {"language", {{"lambada", 0, 0.0}, {"winograd", 3, 0.5}}}};
  c.averages = {{"core", {"commonsense", "language"}}};
  const auto scores =
      compute_gauntlet(c, {result("copa/0-shot", 3, 4), result("piqa/0-shot", 1, 4), result("winograd/3-shot", 1, 2)});
  ASSERT_EQ(scores.size(), 2u);  // `language` lacks lambada/0-shot
  EXPECT_EQ(scores[0].first, "commonsense");
  EXPECT_DOUBLE_EQ(scores[0].second, ((0.75 - 0.5) / 0.5 + (0.25 - 0.5) / 0.5) / 2);
  EXPECT_EQ(scores[1].first, "core");
  EXPECT_DOUBLE_EQ(scores[1].second, scores[0].second);
}

TEST(Gauntlet, ATaskWithCategoriesCountsTheMeanOfItsCategories) {
  // LLM Foundry's EvalGauntlet averages the sub-category accuracies unweighted: (1/2 + 3/3) / 2, not 4/5.
  GauntletConfig c;
  c.categories = {{"world_knowledge", {{"jeopardy", 3, 0.0}}}};
  c.averages = {{"core", {"world_knowledge"}}};
  const auto scores =
      compute_gauntlet(c, {result("jeopardy/3-shot/american_history", 1, 2), result("jeopardy/3-shot/science", 3, 3),
                           result("jeopardy/0-shot/science", 0, 3)});
  ASSERT_EQ(scores.size(), 2u);
  EXPECT_DOUBLE_EQ(scores[0].second, 0.75);
  // SAMPLE_SZ weighs a benchmark by all its categories' examples.
  c.categories = {{"world_knowledge", {{"jeopardy", 3, 0.0}, {"copa", 0, 0.5}}}};
  c.weighting = "SAMPLE_SZ";
  const auto weighted = compute_gauntlet(c, {result("jeopardy/3-shot/american_history", 1, 2),
                                             result("jeopardy/3-shot/science", 3, 3), result("copa/0-shot", 3, 5)});
  EXPECT_DOUBLE_EQ(weighted[0].second, (0.75 * 5 + 0.2 * 5) / 10);
}

TEST(Gauntlet, BadWeightingNamesTheLine) {
  const auto path = std::filesystem::temp_directory_path() / "tessera_gauntlet_bad.yaml";
  std::ofstream(path) << "eval_gauntlet:\n  weighting: MOST\n  categories: []\n";
  EXPECT_NE(testing::error_of([&] { load_gauntlet(path.string()); }).find("tessera_gauntlet_bad.yaml:2"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera::eval
