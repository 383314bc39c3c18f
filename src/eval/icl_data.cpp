// ICL task configs, JSONL datasets and LLM Foundry's prompt construction (see icl.h).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>

#include "tessera/config/reader.h"
#include "tessera/config/value.h"
#include "tessera/config/yaml_file.h"
#include "tessera/eval/fewshot.h"
#include "tessera/eval/icl.h"
#include "tessera/eval/icl_task_keys.h"
#include "tessera/storage/storage.h"
#include "tessera/util/error.h"

namespace tessera::eval {

namespace {

// Python's str.isspace() for ASCII (and the C0 separators Python counts as whitespace).
bool is_py_space(char c) {
  return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f');
}

std::string rstrip(const std::string& s) {
  size_t end = s.size();
  while (end > 0 && is_py_space(s[end - 1])) --end;
  return s.substr(0, end);
}

std::string strip(const std::string& s) {
  size_t begin = 0;
  while (begin < s.size() && is_py_space(s[begin])) ++begin;
  return rstrip(s.substr(begin));
}

std::vector<int64_t> encode(const data::Tokenizer& tok, const std::string& text, bool add_special_tokens) {
  std::vector<int32_t> ids = tok.encode(text, add_special_tokens);
  return {ids.begin(), ids.end()};
}

const std::string* string_field(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return (it != j.end() && it->is_string()) ? &it->get_ref<const std::string&>() : nullptr;
}

// Keeps the rightmost context tokens so that context + continuation fits in max_seq_len (utils.trim_context).
std::vector<int64_t> trim_context(std::vector<int64_t> context, size_t continuation_len, int64_t max_seq_len,
                                  const std::string& label) {
  const auto limit = static_cast<size_t>(max_seq_len);
  if (context.size() + continuation_len <= limit) return context;
  if (continuation_len >= limit) {
    throw Error("eval", fmt::format("{}: a continuation of {} tokens does not fit in max_seq_len {}", label,
                                    continuation_len, max_seq_len));
  }
  const size_t keep = limit - continuation_len;
  return {context.end() - static_cast<std::ptrdiff_t>(keep), context.end()};
}

}  // namespace

std::vector<IclTaskConfig> load_icl_tasks(const std::string& path) {
  const config::Value root = config::load_yaml_file(path, "eval", "ICL tasks file");
  const config::Value* list = root.find("icl_tasks");
  if (list == nullptr || !list->is_sequence()) {
    throw ConfigError("eval", fmt::format("{}: expected a list `icl_tasks`", path));
  }
  std::vector<IclTaskConfig> tasks;
  for (const config::Value& entry : list->items()) {
    tasks.push_back(parse_icl_task(entry, std::filesystem::path(path).parent_path().string()));
  }
  return tasks;
}

IclTaskConfig parse_icl_task(const config::Value& entry, const std::string& base_dir) {
  const std::filesystem::path base(base_dir);
  const std::string where = entry.origin().describe();
  if (!entry.is_map()) throw ConfigError("eval", fmt::format("{}: an icl_tasks entry must be a mapping", where));
  {  // A key outside the format (a misspelt `num_fewshots`) is refused by name at its line, as LLM Foundry's task
     // classes refuse an unexpected argument; its keys that Tessera does not implement are named as such.
    config::ParseContext ctx(entry.origin().file);
    config::Section keys(&entry, "icl_tasks", ctx);
    for (std::string_view key : kIclTaskKeys) keys.raw(key);
    keys.finish(kIclTaskFoundryOnlyKeys);
    ctx.throw_if_unsupported();
  }
  const nlohmann::ordered_json j = entry.to_json();
  IclTaskConfig t;
  auto fail = [&](const std::string& key, const std::string& what) {
    const config::Value* v = entry.find(key);
    throw ConfigError("eval", fmt::format("{}: {}: {}", v != nullptr ? v->origin().describe() : where, key, what));
  };
  auto get_string = [&](const std::string& key, std::string& out, bool required) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) {
      if (required) fail(key, "missing");
      return;
    }
    if (!it->is_string()) fail(key, "expected a string");
    out = it->get<std::string>();
  };
  get_string("label", t.label, true);
  get_string("dataset_uri", t.dataset_uri, true);
  get_string("icl_task_type", t.icl_task_type, true);
  get_string("prompt_string", t.prompt_string, false);
  get_string("example_delimiter", t.example_delimiter, false);
  get_string("continuation_delimiter", t.continuation_delimiter, false);
  get_string("prelimiter", t.prelimiter, false);
  get_string("question_prelimiter", t.prelimiter, false);
  get_string("cot_delimiter", t.cot_delimiter, false);
  static const std::vector<std::string> kTypes = {"language_modeling", "multiple_choice", "schema",
                                                  "generation_task_with_answers"};
  if (std::find(kTypes.begin(), kTypes.end(), t.icl_task_type) == kTypes.end()) {
    fail("icl_task_type", fmt::format("unknown task type \"{}\" (expected one of language_modeling, "
                                      "multiple_choice, schema, generation_task_with_answers)",
                                      t.icl_task_type));
  }
  // An object store's URI is read from there (LLM Foundry fetches it with get_file); another scheme is refused here,
  // naming the ones the storage layer has.
  try {
    const storage::Uri u = storage::parse_uri(t.dataset_uri);
    if (u.scheme == storage::Uri::Scheme::kLocal) t.dataset_uri = u.key;  // file:// stripped
  } catch (const Error& e) {
    fail("dataset_uri", e.message());
  }
  if (!storage::is_remote(t.dataset_uri) && !std::filesystem::exists(t.dataset_uri) && !base.empty() &&
      std::filesystem::path(t.dataset_uri).is_relative()) {
    t.dataset_uri = (base / t.dataset_uri).string();
  }
  if (auto it = j.find("num_fewshot"); it != j.end()) {
    t.num_fewshot.clear();
    auto add = [&](const nlohmann::ordered_json& v) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0) fail("num_fewshot", "expected non-negative integers");
      t.num_fewshot.push_back(v.get<int64_t>());
    };
    if (it->is_array()) {
      for (const auto& v : *it) add(v);
    } else {
      add(*it);
    }
  }
  if (auto it = j.find("max_seq_len"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() <= 0) fail("max_seq_len", "expected a positive integer");
    t.max_seq_len = it->get<int64_t>();
  }
  if (auto it = j.find("fewshot_random_seed"); it != j.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0) fail("fewshot_random_seed", "expected an integer >= 0");
    t.fewshot_random_seed = it->get<uint64_t>();
  }
  for (const char* key : {"strip_dataset", "do_normalization", "has_categories"}) {
    auto it = j.find(key);
    if (it == j.end()) continue;
    if (!it->is_boolean()) fail(key, "expected a boolean");
    const bool b = it->get<bool>();
    if (std::string(key) == "strip_dataset") t.strip_dataset = b;
    if (std::string(key) == "do_normalization") t.do_normalization = b;
    if (std::string(key) == "has_categories") t.has_categories = b;
  }
  if (auto it = j.find("early_stopping_criteria"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) fail("early_stopping_criteria", "expected a list of strings");
    for (const auto& v : *it) {
      if (!v.is_string()) fail("early_stopping_criteria", "expected a list of strings");
      t.early_stopping_criteria.push_back(v.get<std::string>());
    }
  }
  return t;
}

std::vector<IclExample> load_icl_dataset(const std::string& path, const std::string& icl_task_type, bool strip_data,
                                         bool require_category) {
  // A remote task file is read whole (ICL datasets are megabytes); a local one line by line.
  std::unique_ptr<std::istream> stream;
  if (storage::is_remote(path)) {
    stream = std::make_unique<std::istringstream>(storage::read(path));
  } else {
    stream = std::make_unique<std::ifstream>(path, std::ios::binary);
    if (!*stream) throw Error("eval", fmt::format("{}: cannot open the task file", path));
  }
  std::istream& in = *stream;
  std::vector<IclExample> out;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (strip(line).empty()) continue;
    auto fail = [&](const std::string& what) { throw Error("eval", fmt::format("{}:{}: {}", path, line_no, what)); };
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail(fmt::format("invalid JSON: {}", e.what()));
    }
    if (!j.is_object()) fail("expected a JSON object");
    auto str = [&](const char* key, bool required) -> std::string {
      const std::string* s = string_field(j, key);
      if (s == nullptr) {
        if (required || j.contains(key)) fail(fmt::format("`{}`: expected a string", key));
        return "";
      }
      return strip_data ? strip(*s) : *s;
    };
    auto strings = [&](const char* key, bool required) {
      std::vector<std::string> v;
      auto it = j.find(key);
      if (it == j.end() && !required) return v;
      if (it == j.end() || !it->is_array()) fail(fmt::format("`{}`: expected a list of strings", key));
      for (const auto& e : *it) {
        if (!e.is_string()) fail(fmt::format("`{}`: expected a list of strings", key));
        v.push_back(e.get<std::string>());
      }
      return v;
    };
    IclExample ex;
    if (icl_task_type == "language_modeling") {
      ex.context = str("context", true);
      ex.continuation = str("continuation", true);
    } else if (icl_task_type == "multiple_choice" || icl_task_type == "schema") {
      const bool mc = icl_task_type == "multiple_choice";
      if (mc) ex.context = str("query", true);
      if (!mc) ex.continuation = str("continuation", true);
      ex.choices = strings(mc ? "choices" : "context_options", true);
      if (ex.choices.empty()) fail(fmt::format("`{}` is empty", mc ? "choices" : "context_options"));
      auto g = j.find("gold");
      if (g == j.end() || !g->is_number_integer()) fail("`gold`: expected an integer");
      ex.gold = g->get<int64_t>();
      if (ex.gold < 0 || ex.gold >= static_cast<int64_t>(ex.choices.size())) {
        fail(fmt::format("`gold` {} is out of range for {} choices", ex.gold, ex.choices.size()));
      }
    } else {
      ex.context = str("context", true);
      ex.continuation = str("answer", true);
      ex.aliases = strings("aliases", false);
      ex.chain_of_thought = str("chain_of_thought", false);
      ex.has_chain_of_thought = j.contains("chain_of_thought");
    }
    if (const std::string* c = string_field(j, "category")) {
      ex.category = *c;
    } else if (require_category || j.contains("category")) {
      fail(require_category ? "`category`: expected a string (the task has has_categories: true)"
                            : "`category`: expected a string");
    }
    out.push_back(std::move(ex));
  }
  if (out.empty()) throw Error("eval", fmt::format("{}: no examples", path));
  return out;
}

std::vector<IclPrepared> prepare_icl_examples(const IclTaskConfig& task, const std::vector<IclExample>& data,
                                              int64_t num_fewshot, const data::Tokenizer& tokenizer,
                                              int64_t max_seq_len, int64_t* max_answer_tokens) {
  const std::string& type = task.icl_task_type;
  const bool prefix_space = tokenizer.encode(" a", false).size() == 1;
  auto with_prefix = [&](const std::string& s) { return (prefix_space && (s.empty() || s[0] != ' ')) ? " " + s : s; };
  const bool generation = type == "generation_task_with_answers";
  const bool schema = type == "schema";
  // The eos token tokenizer_config.json names (transformers' tokenizer.eos_token_id), else GPT-style <|endoftext|>.
  std::optional<int32_t> eos = tokenizer.eos_token_id();
  if (!eos) eos = tokenizer.token_to_id("<|endoftext|>");

  // Chain of thought is on when the task file has the `chain_of_thought` column (LLM Foundry's `has_cot`: the dataset
  // has the feature), whatever cot_delimiter says; the delimiter only goes between the thought and the answer.
  const bool has_cot =
      generation && std::any_of(data.begin(), data.end(), [](const IclExample& ex) { return ex.has_chain_of_thought; });
  // The answer written after an in-context example.
  auto in_context_answer = [&](const IclExample& ex) -> std::string {
    if (type == "multiple_choice") return ex.choices[static_cast<size_t>(ex.gold)];
    if (has_cot) return ex.chain_of_thought + task.cot_delimiter + ex.continuation;
    return ex.continuation;
  };
  // construct_context: prelimiter, example delimiter after earlier text, continuation delimiter, optional answer.
  // Schema tasks put the prelimiter before the example delimiter (LLM Foundry's InContextLearningSchemaTaskDataset,
  // as its test contexts do); the other types put it after.
  auto construct_context = [&](const IclExample& ex, const std::string& preceding, bool add_answer) {
    std::string ctx = schema ? ex.choices[static_cast<size_t>(ex.gold)] : task.prelimiter + ex.context;
    if (!preceding.empty()) ctx = task.example_delimiter + ctx;
    if (schema) ctx = task.prelimiter + ctx;
    ctx += task.continuation_delimiter;
    if (add_answer) ctx += in_context_answer(ex);
    return ctx;
  };

  int64_t answer_budget = 0;
  if (generation) {
    for (const IclExample& ex : data) {
      std::vector<std::string> all = {ex.continuation};
      all.insert(all.end(), ex.aliases.begin(), ex.aliases.end());
      for (const std::string& a : all) {
        const std::string response = has_cot ? ex.chain_of_thought + task.cot_delimiter + a : a;
        answer_budget = std::max<int64_t>(answer_budget, static_cast<int64_t>(tokenizer.encode(response, true).size()));
      }
    }
    if (!task.cot_delimiter.empty()) answer_budget += 10;
    if (max_answer_tokens != nullptr) *max_answer_tokens = answer_budget;
    if (answer_budget >= max_seq_len) {
      throw Error("eval", fmt::format("{}: answers of {} tokens do not fit in max_seq_len {}", task.label,
                                      answer_budget, max_seq_len));
    }
  }

  PythonRandom rng(task.fewshot_random_seed);
  const auto n = static_cast<int64_t>(data.size());
  std::vector<IclPrepared> out;
  out.reserve(data.size());
  for (int64_t idx = 0; idx < n; ++idx) {
    const IclExample& ex = data[static_cast<size_t>(idx)];
    std::string preamble = task.prompt_string;
    if (num_fewshot > 0) {
      for (int64_t f : fewshot_sample_idxs(n, num_fewshot, idx, rng)) {
        preamble += construct_context(data[static_cast<size_t>(f)], preamble, true);
      }
    }
    std::vector<int64_t> preamble_ids = encode(tokenizer, preamble, true);
    if (preamble_ids.size() > 1 && eos && preamble_ids.back() == *eos) preamble_ids.pop_back();
    auto context_ids = [&](const std::string& ctx) {
      std::vector<int64_t> ids = preamble_ids;
      std::vector<int64_t> c = encode(tokenizer, ctx, false);
      ids.insert(ids.end(), c.begin(), c.end());
      return ids;
    };

    IclPrepared p;
    p.gold = ex.gold;
    if (schema) {
      std::vector<int64_t> cont = encode(tokenizer, with_prefix(ex.continuation), false);
      for (const std::string& option : ex.choices) {
        std::string ctx;
        if (!preamble.empty()) {
          const std::string delim =
              task.strip_dataset ? rstrip(task.continuation_delimiter) : task.continuation_delimiter;
          ctx = task.prelimiter + task.example_delimiter + option + delim;
        } else {
          ctx = task.prelimiter + option;
        }
        p.rows.push_back({trim_context(context_ids(ctx), cont.size(), max_seq_len, task.label), cont});
      }
    } else {
      std::string ctx = construct_context(ex, preamble, false);
      if (task.strip_dataset) ctx = rstrip(ctx);
      std::vector<int64_t> ids = context_ids(ctx);
      if (type == "language_modeling") {
        std::vector<int64_t> cont = encode(tokenizer, with_prefix(ex.continuation), false);
        p.rows.push_back({trim_context(std::move(ids), cont.size(), max_seq_len, task.label), cont});
      } else if (type == "multiple_choice") {
        for (const std::string& choice : ex.choices) {
          std::vector<int64_t> cont = encode(tokenizer, with_prefix(choice), false);
          p.rows.push_back({trim_context(ids, cont.size(), max_seq_len, task.label), cont});
        }
      } else {
        p.rows.push_back({trim_context(std::move(ids), 0, max_seq_len - answer_budget, task.label), {}});
        p.answers = {ex.continuation};
        p.answers.insert(p.answers.end(), ex.aliases.begin(), ex.aliases.end());
      }
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace tessera::eval
