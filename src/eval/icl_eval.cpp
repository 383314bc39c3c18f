// Scoring ICL rows with any causal LM (the model protocol) and LLM Foundry's accuracy metrics (see icl.h).
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "tessera/eval/icl.h"
#include "tessera/models/generate.h"
#include "tessera/util/error.h"

namespace tessera::eval {

namespace {

// Scores rows in batches of up to `batch_size`, longest first so that a batch's rows have similar lengths. A batch is
// right-padded to its longest row: with causal attention a row's tokens never attend to the padding after them, so
// each row's log-probabilities are its unpadded ones up to float rounding (LLM Foundry pads its batches too).
// `exact_match`: 1 when every continuation token is the argmax, else 0 (LM); otherwise the continuation's mean
// cross-entropy (MC, schema).
std::vector<double> score_rows(models::CausalLM& model, const std::vector<const IclRow*>& rows, bool exact_match,
                               int64_t batch_size) {
  auto length = [&](size_t i) { return rows[i]->context.size() + rows[i]->continuation.size(); };
  std::vector<size_t> order(rows.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return length(a) > length(b); });
  const auto device = model.parameters().front().device();
  std::vector<double> out(rows.size(), 0.0);
  const auto batch = static_cast<size_t>(batch_size);
  for (size_t first = 0; first < order.size(); first += batch) {
    const size_t n = std::min(batch, order.size() - first);
    const size_t width = length(order[first]);
    std::vector<int64_t> ids(n * width, 0);  // the padding's id is never read back
    for (size_t b = 0; b < n; ++b) {
      const IclRow& row = *rows[order[first + b]];
      std::copy(row.context.begin(), row.context.end(), ids.begin() + static_cast<std::ptrdiff_t>(b * width));
      std::copy(row.continuation.begin(), row.continuation.end(),
                ids.begin() + static_cast<std::ptrdiff_t>(b * width + row.context.size()));
    }
    const at::Tensor input =
        at::tensor(ids, at::kLong).view({static_cast<int64_t>(n), static_cast<int64_t>(width)}).to(device);
    const at::Tensor logits = model.forward(input);  // (n, width, V)
    std::vector<at::Tensor> values;                  // one scalar per row, read back once per batch (one device sync)
    for (size_t b = 0; b < n; ++b) {
      const IclRow& row = *rows[order[first + b]];
      const auto start = static_cast<int64_t>(row.context.size()) - 1;
      const auto len = static_cast<int64_t>(row.continuation.size());
      // Rows start .. start + len - 1 predict the continuation's tokens.
      const at::Tensor scores = logits[static_cast<int64_t>(b)].narrow(0, start, len).to(at::kFloat);  // (C, V)
      const at::Tensor targets = at::tensor(row.continuation, at::kLong).to(device);
      values.push_back(exact_match
                           ? scores.argmax(-1).eq(targets).all().to(at::kDouble)
                           : -at::log_softmax(scores, -1).gather(1, targets.unsqueeze(1)).mean().to(at::kDouble));
    }
    const at::Tensor host = at::stack(values).cpu();
    for (size_t b = 0; b < n; ++b) out[order[first + b]] = host[static_cast<int64_t>(b)].item<double>();
  }
  return out;
}

bool is_punct(unsigned char c) {
  return c < 0x80 && std::ispunct(c) != 0;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size())) {
    s.replace(pos, from.size(), to);
  }
  return s;
}

}  // namespace

std::string normalize_answer(const std::string& text) {
  std::string s;
  for (char c : text) s += (c == '_') ? ' ' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // Python's extra punctuation: left/right single quotation marks, acute accent, backtick.
  for (const char* p : {"\u2018", "\u2019", "\u00b4"}) s = replace_all(s, p, " ");
  for (char& c : s) {
    if (is_punct(static_cast<unsigned char>(c))) c = ' ';
  }
  // Split on whitespace, dropping the articles a / an / the (whole words), then join with single spaces.
  std::vector<std::string> words;
  std::string word;
  auto flush = [&] {
    if (!word.empty() && word != "a" && word != "an" && word != "the") words.push_back(word);
    word.clear();
  };
  for (char c : s) {
    if (c == ' ' || (c >= '\t' && c <= '\r')) {
      flush();
    } else {
      word += c;
    }
  }
  flush();
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

bool generation_exact_match(const std::string& output, const std::vector<std::string>& answers,
                            const IclTaskConfig& task) {
  std::string final_answer = output;
  size_t cut = std::string::npos;
  for (const std::string& stop : task.early_stopping_criteria) {
    if (!stop.empty()) cut = std::min(cut, final_answer.find(stop));
  }
  if (cut != std::string::npos) final_answer = final_answer.substr(0, cut);
  if (!task.cot_delimiter.empty()) {
    const size_t pos = final_answer.rfind(task.cot_delimiter);
    if (pos != std::string::npos) final_answer = final_answer.substr(pos + task.cot_delimiter.size());
  }
  if (task.do_normalization) final_answer = normalize_answer(final_answer);
  for (const std::string& a : answers) {
    const std::string label = task.do_normalization ? normalize_answer(a) : a;
    if (final_answer.rfind(label, 0) == 0) return true;
  }
  return false;
}

namespace {

// One evaluator: `data` (a whole task file, or one category of it) at `num_fewshot`.
IclResult evaluate_examples(models::CausalLM& model, const data::Tokenizer& tokenizer, const IclTaskConfig& task,
                            const std::vector<IclExample>& data, int64_t num_fewshot, const std::string& category,
                            const IclRanks& ranks, int64_t batch_size) {
  const int64_t max_seq_len = task.max_seq_len > 0 ? task.max_seq_len : model.max_seq_len();
  int64_t max_answer_tokens = 0;
  std::vector<IclPrepared> examples =
      prepare_icl_examples(task, data, num_fewshot, tokenizer, max_seq_len, &max_answer_tokens);
  if (task.subset_num_batches > 0 && !data.empty()) {
    // LLM Foundry's get_effective_batch_size: a multiple-choice or schema batch holds batch_size / choices examples
    // (the first example's choices), at least one.
    int64_t per_batch = batch_size;
    if (task.icl_task_type == "multiple_choice" || task.icl_task_type == "schema") {
      const auto choices = std::max<int64_t>(1, static_cast<int64_t>(data.front().choices.size()));
      per_batch = std::max(choices, batch_size) / choices;
    }
    // The counts come from a recipe: a product too large for int64 keeps every example.
    int64_t per_round = 0, limit = 0;
    if (!__builtin_mul_overflow(per_batch, ranks.world_size, &per_round) &&
        !__builtin_mul_overflow(task.subset_num_batches, per_round, &limit) &&
        static_cast<int64_t>(examples.size()) > limit) {
      examples.resize(static_cast<size_t>(limit));
    }
  }

  IclResult r;
  r.task = task.label;
  r.num_fewshot = num_fewshot;
  r.category = category;
  r.label = fmt::format("{}/{}-shot", task.label, num_fewshot);
  if (!category.empty()) r.label += "/" + category;
  r.total = static_cast<int64_t>(examples.size());
  if (examples.empty()) return r;
  const bool was_training = model.is_training();
  model.eval();
  at::NoGradGuard no_grad;
  const std::string& type = task.icl_task_type;
  const bool generation = type == "generation_task_with_answers";

  // The units split over the ranks: rows (LM, MC, schema: one forward pass each) or examples (generation).
  std::vector<std::pair<size_t, size_t>> units;  // (example, row)
  for (size_t e = 0; e < examples.size(); ++e) {
    const size_t n = generation ? 1 : examples[e].rows.size();
    for (size_t i = 0; i < n; ++i) units.emplace_back(e, i);
  }
  models::GenerationOptions gen;
  gen.max_new_tokens = max_answer_tokens;
  gen.fixed_steps = ranks.world_size > 1;
  if (auto eos = tokenizer.eos_token_id() ? tokenizer.eos_token_id() : tokenizer.token_to_id("<|endoftext|>"))
    gen.eos_token_id = *eos;
  // This rank's units: every world_size-th from its rank; past the end, the last unit again (its result unused), so
  // that every rank runs the same number of batches, as a sharded model needs.
  const auto world = static_cast<size_t>(ranks.world_size);
  const size_t per_rank = (units.size() + world - 1) / world;
  std::vector<size_t> mine;
  for (size_t j = 0; j < per_rank; ++j)
    mine.push_back(std::min(j * world + static_cast<size_t>(ranks.rank), units.size() - 1));
  const auto real = [&](size_t j) { return j * world + static_cast<size_t>(ranks.rank) < units.size(); };
  std::vector<double> values(units.size(), 0.0);
  if (!generation) {
    // LM: 1 when every continuation token is the argmax; MC / schema: the continuation's mean cross-entropy.
    std::vector<const IclRow*> rows;
    for (size_t u : mine) rows.push_back(&examples[units[u].first].rows[units[u].second]);
    const std::vector<double> scored = score_rows(model, rows, type == "language_modeling", batch_size);
    for (size_t j = 0; j < mine.size(); ++j) {
      if (real(j)) values[mine[j]] = scored[j];
    }
  } else {
    // Generation: 1 on an exact match. Prompts in batches of similar lengths (generate left-pads and masks them);
    // stop strings are applied to the decoded text (the cut is the same as stopping generation early).
    std::vector<size_t> order(mine.size());
    for (size_t j = 0; j < order.size(); ++j) order[j] = j;
    auto prompt = [&](size_t j) -> const std::vector<int64_t>& {
      return examples[units[mine[j]].first].rows[0].context;
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return prompt(a).size() > prompt(b).size(); });
    const auto batch = static_cast<size_t>(batch_size);
    for (size_t first = 0; first < order.size(); first += batch) {
      const size_t n = std::min(batch, order.size() - first);
      std::vector<std::vector<int64_t>> prompts;
      for (size_t b = 0; b < n; ++b) prompts.push_back(prompt(order[first + b]));
      const std::vector<std::vector<int64_t>> out = models::generate(model, prompts, gen);
      for (size_t b = 0; b < n; ++b) {
        const size_t j = order[first + b];
        if (!real(j)) continue;
        const std::vector<int32_t> ids(out[b].begin(), out[b].end());
        values[mine[j]] =
            generation_exact_match(tokenizer.decode(ids, true), examples[units[mine[j]].first].answers, task) ? 1.0
                                                                                                              : 0.0;
      }
    }
  }
  if (world > 1) ranks.sum(values);

  if (type == "language_modeling" || generation) {
    r.metric = generation ? "InContextLearningGenerationExactMatchAccuracy" : "InContextLearningLMAccuracy";
    for (double v : values) r.correct += v > 0.5 ? 1 : 0;
  } else {
    r.metric = "InContextLearningMultipleChoiceAccuracy";
    size_t u = 0;
    for (const IclPrepared& p : examples) {
      // The lowest mean cross-entropy (argmin of perplexity); the first on ties.
      size_t best = 0;
      double best_ce = std::numeric_limits<double>::infinity();
      for (size_t i = 0; i < p.rows.size(); ++i, ++u) {
        if (values[u] < best_ce) {
          best_ce = values[u];
          best = i;
        }
      }
      if (static_cast<int64_t>(best) == p.gold) ++r.correct;
    }
  }
  if (was_training) model.train();
  return r;
}

}  // namespace

int64_t icl_subset_num_batches_for(bool has_categories, std::optional<int64_t> icl_subset_num_batches,
                                   int64_t eval_subset_num_batches, bool standalone_eval) {
  if (standalone_eval && eval_subset_num_batches != -1) return eval_subset_num_batches;
  if (!has_categories && icl_subset_num_batches) return *icl_subset_num_batches;
  return standalone_eval ? -1 : eval_subset_num_batches;
}

std::vector<IclResult> evaluate_icl_task(models::CausalLM& model, const data::Tokenizer& tokenizer,
                                         const IclTaskConfig& task, int64_t num_fewshot, const IclRanks& ranks,
                                         int64_t batch_size) {
  if (ranks.world_size < 1 || ranks.rank < 0 || ranks.rank >= ranks.world_size ||
      (ranks.world_size > 1 && !ranks.sum)) {
    throw Error("icl", fmt::format("rank {} of {} is not a valid split", ranks.rank, ranks.world_size));
  }
  if (batch_size < 1) throw Error("icl", fmt::format("batch size {} must be positive", batch_size));
  const std::vector<IclExample> data =
      load_icl_dataset(task.dataset_uri, task.icl_task_type, task.strip_dataset, task.has_categories);
  std::vector<IclResult> out;
  for (const auto& [category, examples] : split_by_category(task, data)) {
    out.push_back(evaluate_examples(model, tokenizer, task, examples, num_fewshot, category, ranks, batch_size));
  }
  return out;
}

std::vector<std::pair<std::string, std::vector<IclExample>>> split_by_category(const IclTaskConfig& task,
                                                                               const std::vector<IclExample>& data) {
  if (!task.has_categories) return {{"", data}};
  std::map<std::string, std::vector<IclExample>> by_category;
  for (const IclExample& ex : data) by_category[ex.category].push_back(ex);
  return {by_category.begin(), by_category.end()};
}

}  // namespace tessera::eval
