// ICL evaluation pieces: Python-identical few-shot draws (values from CPython 3.11's random and set), prompt
// construction, answer normalisation, and errors naming the task file and line. Accuracy parity with an independent
// Hugging Face reference is checked in tests/compat/test_icl_eval.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "tessera/eval/fewshot.h"
#include "tessera/eval/icl.h"
#include "test_util.h"

namespace tessera::eval {
namespace {

namespace fs = std::filesystem;

fs::path write_file(const std::string& name, const std::string& text) {
  const fs::path dir = fs::temp_directory_path() / "tessera_icl_test";
  fs::create_directories(dir);
  const fs::path p = dir / name;
  std::ofstream(p) << text;
  return p;
}

std::vector<std::vector<int64_t>> draws(int64_t n, int64_t k, int64_t count, uint64_t seed = 1234) {
  PythonRandom rng(seed);
  std::vector<std::vector<int64_t>> out;
  for (int64_t i = 0; i < count; ++i) out.push_back(fewshot_sample_idxs(n, k, i, rng));
  return out;
}

TEST(PythonRandom, MatchesCPython) {
  PythonRandom rng(1234);
  EXPECT_EQ(rng.getrandbits(32), 4150886329u);
  EXPECT_EQ(rng.getrandbits(32), 3342196574u);
  EXPECT_EQ(rng.getrandbits(32), 1892932127u);
}

TEST(Fewshot, MatchesLlmFoundryInPythonSetOrder) {
  using V = std::vector<std::vector<int64_t>>;
  EXPECT_EQ(draws(40, 3, 6), (V{{28, 5, 7}, {2, 5, 37}, {15, 6, 22}, {1, 22, 39}, {29, 30, 39}, {9, 11, 7}}));
  EXPECT_EQ(draws(10, 5, 3), (V{{1, 4, 5, 7, 9}, {0, 3, 6, 7, 8}, {0, 1, 5, 7, 8}}));
  EXPECT_EQ(draws(3, 5, 3), (V{{1, 2}, {0, 2}, {0, 1}}));
  EXPECT_EQ(draws(100, 25, 1)[0], (std::vector<int64_t>{2,  3,  4,  10, 11, 12, 14, 19, 23, 30, 44, 45, 56,
                                                        59, 61, 74, 78, 79, 82, 85, 86, 88, 91, 95, 99}));
  // Removal of the example itself and a replacement drawn into the table (dummy slots, resized table).
  const V many = draws(50, 10, 50, 7);
  EXPECT_EQ(many.back(), (std::vector<int64_t>{1, 4, 5, 38, 7, 40, 45, 14, 16, 17}));
  int64_t sum = 0;
  for (const auto& v : many) {
    for (int64_t x : v) sum += x;
  }
  EXPECT_EQ(sum, 12217);
}

TEST(Normalize, FollowsLlmFoundry) {
  EXPECT_EQ(normalize_answer("  The Beatles!"), "beatles");
  EXPECT_EQ(normalize_answer("an_apple, a day"), "apple day");
  EXPECT_EQ(normalize_answer("theatre"), "theatre");
  IclTaskConfig t;
  t.early_stopping_criteria = {"\n"};
  EXPECT_TRUE(generation_exact_match(" the Beatles rock\nx", {"Beatles"}, t));
  EXPECT_FALSE(generation_exact_match("\nBeatles", {"Beatles"}, t));
  t.cot_delimiter = "The answer is ";
  t.do_normalization = false;
  EXPECT_TRUE(generation_exact_match("so 2+2. The answer is 4", {"4"}, t));
}

TEST(PromptConstruction, FewshotDelimitersAndSeparateContinuation) {
  const data::Tokenizer tok =
      data::train_bpe_tokenizer({"the cat sat on the mat", "x a a a a a a a a a a a"}, {300, 2, {}});
  IclTaskConfig t;
  t.label = "lm";
  t.icl_task_type = "language_modeling";
  t.prompt_string = "P:";
  std::vector<IclExample> data(2);
  data[0].context = "one two";
  data[0].continuation = "three";
  data[1].context = "four";
  data[1].continuation = "five";
  const auto prepared = prepare_icl_examples(t, data, 1, tok, 2048);
  ASSERT_EQ(prepared.size(), 2u);
  auto text = [&](const std::vector<int64_t>& ids) { return tok.decode(std::vector<int32_t>(ids.begin(), ids.end())); };
  EXPECT_EQ(text(prepared[0].rows[0].context), "P:\nfour five\none two");
  ASSERT_EQ(tok.encode(" a", false).size(), 1u);  // needs a prefix space, as GPT-NeoX BPE does
  EXPECT_EQ(text(prepared[0].rows[0].continuation), " three");
  // Left truncation keeps the rightmost context tokens.
  const auto cont_len = static_cast<int64_t>(prepared[1].rows[0].continuation.size());
  const auto short_ = prepare_icl_examples(t, data, 1, tok, cont_len + 3);
  ASSERT_EQ(short_[1].rows[0].context.size(), 3u);
  EXPECT_TRUE(std::equal(short_[1].rows[0].context.begin(), short_[1].rows[0].context.end(),
                         prepared[1].rows[0].context.end() - 3));
  EXPECT_EQ(short_[1].rows[0].continuation, prepared[1].rows[0].continuation);
}

TEST(IclTasks, LlmFoundryV03LoadsWithItsCategoryTasks) {
  const std::vector<IclTaskConfig> tasks = load_icl_tasks(
      (fs::path(::tessera::testing::source_dir()) / "tests" / "data" / "icl" / "tasks_v0.3.yaml").string());
  ASSERT_GT(tasks.size(), 30u);
  std::vector<std::string> categorised;
  for (const IclTaskConfig& t : tasks) {
    if (t.has_categories) categorised.push_back(t.label);
  }
  EXPECT_EQ(categorised, (std::vector<std::string>{"jeopardy", "mmlu"}));
}

TEST(IclErrors, NameTheFileAndLine) {
  const fs::path bad =
      write_file("bad.jsonl", "{\"query\": \"q\", \"choices\": [\"a\"], \"gold\": 0}\n{\"query\": 1}\n");
  EXPECT_EQ(testing::error_of([&] { load_icl_dataset(bad.string(), "multiple_choice", true); }),
            "[eval] " + bad.string() + ":2: `query`: expected a string");
  const fs::path json = write_file("json.jsonl", "{\"context\": \"a\", \"continuation\": \"b\"}\n{oops\n");
  EXPECT_NE(testing::error_of([&] {
              load_icl_dataset(json.string(), "language_modeling", true);
            }).find(json.string() + ":2: invalid JSON"),
            std::string::npos);
  const fs::path gold = write_file("gold.jsonl",
                                   "{\"context_options\": [\"a\", \"b\"], \"continuation\": \"c\", "
                                   "\"gold\": 2}\n");
  EXPECT_EQ(testing::error_of([&] { load_icl_dataset(gold.string(), "schema", true); }),
            "[eval] " + gold.string() + ":1: `gold` 2 is out of range for 2 choices");
  const fs::path uncategorised = write_file("uncategorised.jsonl",
                                            "{\"context\": \"a\", \"continuation\": \"b\", \"category\": "
                                            "\"x\"}\n{\"context\": \"a\", \"continuation\": \"b\"}\n");
  EXPECT_EQ(
      testing::error_of([&] { load_icl_dataset(uncategorised.string(), "language_modeling", true, true); }),
      "[eval] " + uncategorised.string() + ":2: `category`: expected a string (the task has has_categories: true)");
  EXPECT_EQ(load_icl_dataset(uncategorised.string(), "language_modeling", true)[0].category, "x");
  const fs::path tasks = write_file("tasks.yaml",
                                    "icl_tasks:\n- label: x\n  dataset_uri: x.jsonl\n"
                                    "  icl_task_type: ranking\n");
  EXPECT_NE(testing::error_of([&] { load_icl_tasks(tasks.string()); }).find("tasks.yaml:4: icl_task_type: unknown"),
            std::string::npos);
}

// A misspelt key in a tasks file is refused at its line with the key it was meant to be (it was once accepted and
// ignored, so the task ran with the default); LLM Foundry's keys that Tessera does not implement are named; a tasks
// file that cannot be read is called a tasks file.
TEST(IclErrors, AMisspeltOrUnimplementedTaskKeyIsRefusedByName) {
  const fs::path misspelt = write_file("misspelt.yaml",
                                       "icl_tasks:\n- label: x\n  dataset_uri: x.jsonl\n"
                                       "  icl_task_type: language_modeling\n  num_fewshots: [0, 5]\n");
  EXPECT_EQ(testing::error_of([&] { load_icl_tasks(misspelt.string()); }),
            "[recipe] " + misspelt.string() + ":5: icl_tasks.num_fewshots: unknown key (did you mean 'num_fewshot'?)");
  const fs::path hub = write_file("hub.yaml",
                                  "icl_tasks:\n- label: x\n  dataset_uri: x.jsonl\n"
                                  "  icl_task_type: language_modeling\n  hf_loading_vars: {split: test}\n");
  EXPECT_NE(
      testing::error_of([&] { load_icl_tasks(hub.string()); }).find("not supported yet: icl_tasks.hf_loading_vars"),
      std::string::npos);
  const fs::path ok = write_file("ok.yaml",
                                 "icl_tasks:\n- label: x\n  dataset_uri: x.jsonl\n"
                                 "  icl_task_type: language_modeling\n  num_fewshot: [0]\n  batch_size: 4\n");
  EXPECT_EQ(load_icl_tasks(ok.string()).at(0).num_fewshot, std::vector<int64_t>{0});
  EXPECT_EQ(testing::error_of([&] { load_icl_tasks("/nonexistent/tasks.yaml"); }),
            "[eval] /nonexistent/tasks.yaml: cannot open the ICL tasks file");
}

// Which batches an ICL evaluator runs, as LLM Foundry's build_icl_evaluators and Composer's Trainer decide it: the
// recipe's icl_subset_num_batches reaches tasks without categories only; an evaluator without one takes
// eval_subset_num_batches; standalone evaluation (eval.py) lets a set eval_subset_num_batches override all of them.
TEST(IclSubset, FollowsLlmFoundryAndComposer) {
  // eval.py: trainer.eval(subset_num_batches=eval_subset_num_batches)
  EXPECT_EQ(icl_subset_num_batches_for(false, 3, -1, true), 3);
  EXPECT_EQ(icl_subset_num_batches_for(true, 3, -1, true), -1);
  EXPECT_EQ(icl_subset_num_batches_for(false, 3, 5, true), 5);
  EXPECT_EQ(icl_subset_num_batches_for(true, 3, 5, true), 5);
  EXPECT_EQ(icl_subset_num_batches_for(false, std::nullopt, -1, true), -1);
  // train.py: each evaluator keeps its own; those without take eval_subset_num_batches
  EXPECT_EQ(icl_subset_num_batches_for(false, 3, 5, false), 3);
  EXPECT_EQ(icl_subset_num_batches_for(true, 3, 5, false), 5);
  EXPECT_EQ(icl_subset_num_batches_for(false, std::nullopt, 5, false), 5);
  EXPECT_EQ(icl_subset_num_batches_for(false, std::nullopt, -1, false), -1);
}

}  // namespace
}  // namespace tessera::eval
