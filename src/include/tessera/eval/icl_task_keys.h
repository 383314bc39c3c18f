// The keys of an `icl_tasks` entry (LLM Foundry's task format), for the recipe reader and the tasks-file reader alike.
#pragma once

#include <string_view>
#include <vector>

namespace tessera::eval {

// The keys Tessera accepts (parse_icl_task, icl_data.cpp, reads them). batch_size, metric_names, generation_kwargs and
// pass_at_k are accepted as LLM Foundry's task files carry them and change nothing here: rows are scored in batches of
// Tessera's own size, each task type has its one metric, generation is greedy up to the early-stopping criteria, and
// code_evaluation (pass_at_k's task type) is refused.
// clang-format off
inline const std::vector<std::string_view> kIclTaskKeys = {
    "label", "dataset_uri", "icl_task_type", "num_fewshot", "metric_names", "max_seq_len", "batch_size",
    "prompt_string", "example_delimiter", "continuation_delimiter", "prelimiter", "question_prelimiter",
    "fewshot_random_seed", "strip_dataset", "has_categories", "cot_delimiter", "early_stopping_criteria",
    "do_normalization", "generation_kwargs", "pass_at_k"};
// clang-format on
// LLM Foundry's keys that Tessera does not implement (HF hub datasets, its download folder): refused as not supported.
inline const std::vector<std::string_view> kIclTaskFoundryOnlyKeys = {"hf_loading_vars", "hf_parsing_map",
                                                                      "destination_path"};

}  // namespace tessera::eval
