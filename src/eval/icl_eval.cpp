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

// Log-probabilities of the continuation tokens after the context. x: (1, L) -> rows L_ctx-1 .. L-2 of the logits.
at::Tensor continuation_log_probs(models::CausalLM& model, const IclRow& row, at::Tensor* predictions) {
  std::vector<int64_t> ids = row.context;
  ids.insert(ids.end(), row.continuation.begin(), row.continuation.end());
  const auto device = model.parameters().front().device();
  at::Tensor input = at::tensor(ids, at::kLong).unsqueeze(0).to(device);
  at::Tensor logits = model.forward(input).squeeze(0).to(at::kFloat);  // (L, V)
  const auto start = static_cast<int64_t>(row.context.size()) - 1;
  const auto len = static_cast<int64_t>(row.continuation.size());
  at::Tensor rows = logits.narrow(0, start, len);  // (C, V)
  if (predictions != nullptr) *predictions = rows.argmax(-1).cpu();
  at::Tensor targets = at::tensor(row.continuation, at::kLong).to(device);
  return at::log_softmax(rows, -1).gather(1, targets.unsqueeze(1)).squeeze(1).cpu();  // (C,)
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
                            const IclRanks& ranks) {
  const int64_t max_seq_len = task.max_seq_len > 0 ? task.max_seq_len : model.max_seq_len();
  int64_t max_answer_tokens = 0;
  const std::vector<IclPrepared> examples =
      prepare_icl_examples(task, data, num_fewshot, tokenizer, max_seq_len, &max_answer_tokens);

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
  // LM: 1 when every continuation token is the argmax; MC / schema: the continuation's mean cross-entropy;
  // generation: 1 on an exact match.
  auto score = [&](size_t e, size_t i) -> double {
    const IclPrepared& p = examples[e];
    if (type == "language_modeling") {
      at::Tensor pred;
      continuation_log_probs(model, p.rows[i], &pred);
      return pred.eq(at::tensor(p.rows[i].continuation, at::kLong)).all().item<bool>() ? 1.0 : 0.0;
    }
    if (!generation) return -continuation_log_probs(model, p.rows[i], nullptr).mean().item<double>();
    // Stop strings are applied to the decoded text (the cut is the same as stopping generation early).
    std::vector<std::vector<int64_t>> out = models::generate(model, {p.rows[0].context}, gen);
    std::vector<int32_t> ids(out[0].begin(), out[0].end());
    return generation_exact_match(tokenizer.decode(ids, true), p.answers, task) ? 1.0 : 0.0;
  };
  std::vector<double> values(units.size(), 0.0);
  const auto world = static_cast<size_t>(ranks.world_size);
  const size_t per_rank = (units.size() + world - 1) / world;
  for (size_t j = 0; j < per_rank; ++j) {
    const size_t u = j * world + static_cast<size_t>(ranks.rank);
    if (u < units.size()) {
      values[u] = score(units[u].first, units[u].second);
    } else {
      score(units.back().first, units.back().second);  // the same passes as the other ranks; result unused
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

std::vector<IclResult> evaluate_icl_task(models::CausalLM& model, const data::Tokenizer& tokenizer,
                                         const IclTaskConfig& task, int64_t num_fewshot, const IclRanks& ranks) {
  if (ranks.world_size < 1 || ranks.rank < 0 || ranks.rank >= ranks.world_size ||
      (ranks.world_size > 1 && !ranks.sum)) {
    throw Error("icl", fmt::format("rank {} of {} is not a valid split", ranks.rank, ranks.world_size));
  }
  const std::vector<IclExample> data =
      load_icl_dataset(task.dataset_uri, task.icl_task_type, task.strip_dataset, task.has_categories);
  std::vector<IclResult> out;
  for (const auto& [category, examples] : split_by_category(task, data)) {
    out.push_back(evaluate_examples(model, tokenizer, task, examples, num_fewshot, category, ranks));
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
