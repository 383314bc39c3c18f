// In-context-learning (ICL) evaluation as LLM Foundry runs it (llmfoundry/eval/datasets, metrics/nlp.py): the four
// task types with their JSONL formats, exact prompt construction (prompt string, few-shot examples, delimiters,
// separately tokenized continuations, left truncation) and the per-task accuracy metrics.
//
// Rows are scored in batches (LLM Foundry's device_eval_batch_size), right-padded to the batch's longest row: with
// causal attention a row never attends to the padding after it, so every row's log-likelihood is the one it gets on
// its own, up to float rounding, at any batch size. (The exception is a model whose output for a token depends on the
// other tokens of the batch: MegaBlocks-style MoE with a capacity factor drops tokens over the whole batch, in LLM
// Foundry's padded batches as here.) Generation batches prompts left-padded with an attention mask (models::generate).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/config/value.h"
#include "tessera/data/tokenizer.h"
#include "tessera/models/causal_lm.h"

namespace tessera::eval {

// One `icl_tasks` entry (LLM Foundry's keys and defaults).
struct IclTaskConfig {
  std::string label;
  std::string dataset_uri;  // a .jsonl path (relative: to the cwd, else to the tasks file) or object-store URI
  std::vector<int64_t> num_fewshot = {0};
  std::string icl_task_type;  // language_modeling | multiple_choice | schema | generation_task_with_answers
  int64_t max_seq_len = 0;    // 0: the model's max_seq_len
  std::string prompt_string;  // ''
  std::string example_delimiter = "\n";
  std::string continuation_delimiter = " ";
  std::string prelimiter;  // '' (`question_prelimiter` is an alias)
  uint64_t fewshot_random_seed = 1234;
  bool strip_dataset = true;
  std::string cot_delimiter;                         // generation only
  std::vector<std::string> early_stopping_criteria;  // generation only: stop strings
  bool do_normalization = true;                      // generation only
  bool has_categories = false;  // one result per `category` of the examples (sorted), few-shot within the category
  // Composer's Evaluator.subset_num_batches (icl_subset_num_batches_for below): each rank scores only the examples of
  // its first this-many of LLM Foundry's batches; -1: every example.
  int64_t subset_num_batches = -1;
};

// The batches each rank of one ICL evaluator runs, as LLM Foundry and Composer decide it from a recipe's
// `icl_subset_num_batches` (unset: nullopt) and `eval_subset_num_batches` (-1: unset). Foundry gives
// icl_subset_num_batches to the evaluators of tasks without categories only (the per-category evaluators get none);
// an evaluator without one takes the run's eval_subset_num_batches. Standalone evaluation (scripts/eval/eval.py:
// `trainer.eval(subset_num_batches=eval_subset_num_batches)`) lets a set eval_subset_num_batches override every
// evaluator's; training keeps each evaluator's own. -1: all batches.
int64_t icl_subset_num_batches_for(bool has_categories, std::optional<int64_t> icl_subset_num_batches,
                                   int64_t eval_subset_num_batches, bool standalone_eval);

// Reads a tasks YAML (`icl_tasks: [...]`, LLM Foundry's tasks_v0.3.yaml format). Throws ConfigError naming the file
// and line for a missing or mistyped key, an unknown task type, or an unsupported option (remote URIs).
std::vector<IclTaskConfig> load_icl_tasks(const std::string& path);

// One `icl_tasks` entry (a YAML mapping, as a recipe holds it). A relative dataset_uri that does not exist from the
// current directory is taken relative to `base_dir` (the directory of the file it was written in).
IclTaskConfig parse_icl_task(const config::Value& entry, const std::string& base_dir);

// One JSONL line, after strip_dataset. Fields unused by the task type stay empty.
struct IclExample {
  std::string context;                // LM / generation: `context`; MC: `query`; schema: unused
  std::string continuation;           // LM / schema: `continuation`; generation: `answer`
  std::vector<std::string> choices;   // MC: `choices`; schema: `context_options`
  int64_t gold = 0;                   // MC / schema
  std::vector<std::string> aliases;   // generation
  std::string chain_of_thought;       // generation (optional)
  bool has_chain_of_thought = false;  // the line has the field (LLM Foundry: the dataset has the column)
  std::string category;               // optional; required with has_categories (taken as written, not stripped)
};

// Reads a task's JSONL file. Throws Error naming the file and line for bad JSON, a missing or mistyped key (`category`
// when `require_category`), or a gold index out of range.
std::vector<IclExample> load_icl_dataset(const std::string& path, const std::string& icl_task_type, bool strip,
                                         bool require_category = false);

// The evaluators of a task's examples: the whole file ("", data), or with has_categories one (category, examples) per
// category in sorted order, each in file order (LLM Foundry's partition_dataset_by_category).
std::vector<std::pair<std::string, std::vector<IclExample>>> split_by_category(const IclTaskConfig& task,
                                                                               const std::vector<IclExample>& data);

// One scored row of token ids: the context and the continuation scored after it.
struct IclRow {
  std::vector<int64_t> context;
  std::vector<int64_t> continuation;
};

// The tokenized inputs of one example: LM: one row; MC / schema: one row per choice; generation: context only.
struct IclPrepared {
  std::vector<IclRow> rows;
  int64_t gold = 0;
  std::vector<std::string> answers;  // generation: answer then aliases
};

// Builds every example's prompt for `num_fewshot` shots (the few-shot generator is consumed in dataset order).
// `max_seq_len` bounds each row (left truncation of the context); generation reserves the longest answer.
std::vector<IclPrepared> prepare_icl_examples(const IclTaskConfig& task, const std::vector<IclExample>& data,
                                              int64_t num_fewshot, const data::Tokenizer& tokenizer,
                                              int64_t max_seq_len, int64_t* max_answer_tokens = nullptr);

// LLM Foundry's normalize_answer (lower-case, '_' and punctuation to spaces, drop a/an/the, squeeze whitespace).
std::string normalize_answer(const std::string& text);

// InContextLearningGenerationExactMatchAccuracy for one output.
bool generation_exact_match(const std::string& output, const std::vector<std::string>& answers,
                            const IclTaskConfig& task);

struct IclResult {
  std::string label;  // "{label}/{k}-shot", or "{label}/{k}-shot/{category}" with has_categories
  std::string task;   // label
  int64_t num_fewshot = 0;
  std::string category;  // with has_categories
  std::string metric;    // InContextLearningLMAccuracy, ...
  int64_t correct = 0;
  int64_t total = 0;
  double accuracy() const { return total == 0 ? 0.0 : static_cast<double>(correct) / static_cast<double>(total); }
};

// The ranks sharing an evaluation. `sum` adds a vector element-wise over all ranks, in place (an all-reduce); every
// rank calls it the same number of times.
struct IclRanks {
  int64_t rank = 0;
  int64_t world_size = 1;
  std::function<void(std::vector<double>&)> sum;
};

// Evaluates one task at one num_fewshot: one result, or with has_categories one per category in sorted order (LLM
// Foundry's per-category evaluators: each category's examples form their own dataset, few-shot examples included).
// The model runs in eval mode without autograd on its current device.
// With several ranks, each scores every world_size-th row (generation: example) and the per-row results are summed
// over the ranks before the metric is computed, so the result is the one a single process gets. Every rank runs the
// same number of forward passes (the last ones repeat a row where the rows do not divide evenly), as a sharded model
// needs. `batch_size` rows (generation: prompts) go through each forward pass, the longest first; it must be positive.
// With task.subset_num_batches > 0, only the examples (in file order) of each rank's first that-many batches of LLM
// Foundry's dataloader are scored: its batches hold batch_size examples (multiple choice and schema: batch_size /
// choices, at least 1), and its sampler deals example i to rank i % world_size, so these are the first
// subset_num_batches x that x world_size; few-shot examples are still drawn from the whole file.
std::vector<IclResult> evaluate_icl_task(models::CausalLM& model, const data::Tokenizer& tokenizer,
                                         const IclTaskConfig& task, int64_t num_fewshot, const IclRanks& ranks = {},
                                         int64_t batch_size = 1);

}  // namespace tessera::eval
