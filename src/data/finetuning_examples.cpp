// LLM Foundry's fine-tuning examples (llmfoundry/data/finetuning/tasks.py): reading rows from JSONL / JSON files,
// validating them, rendering chat turns with the tokenizer's template, tokenizing, and stitching the turns into
// input_ids and labels under the target policies (collator.py's stitch_turns_decoder_only).
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <set>
#include <sstream>

#include "tessera/data/chat_template.h"
#include "tessera/data/finetuning.h"
#include "tessera/data/records.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"
#include "tessera/util/hf_hub.h"

namespace tessera::data {
namespace {

using Json = nlohmann::ordered_json;
constexpr const char* kExamplesComponent = "finetuning";

// LLM Foundry's _DEFAULT_CHAT_TEMPLATE (ChatML), for tokenizers without a template of their own.
constexpr const char* kDefaultChatTemplate =
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}"
    "{% endif %}";

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw Error(kExamplesComponent, fmt::format("{}: {}", where, what));
}

std::string keys_of(const Json& row) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : row.items()) keys.push_back("'" + k + "'");
  std::sort(keys.begin(), keys.end());
  std::string out;
  for (const std::string& k : keys) out += (out.empty() ? "" : ", ") + k;
  return "{" + out + "}";
}

std::string today() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%d %b %Y", &tm);
  return buf;
}

// The response keys LLM Foundry accepts, in the order it would find one.
const Json* response_of(const Json& row) {
  for (const char* key : {"response", "completion"}) {
    if (auto it = row.find(key); it != row.end()) return &*it;
  }
  return nullptr;
}

void validate_chat(const Json& row, const std::string& where) {
  const Json& messages = row["messages"];
  if (!messages.is_array()) fail(where, fmt::format("messages must be a list, not {}", messages.type_name()));
  if (messages.size() <= 1) fail(where, "a chat example needs at least two messages");
  const Json& last = messages.back();
  if (!last.is_object()) fail(where, fmt::format("a message must be an object, not {}", last.type_name()));
  if (!last.contains("role")) fail(where, fmt::format("a message needs a role key; it has {}", keys_of(last)));
  if (last["role"] != "assistant") {
    fail(where, fmt::format("the last message must be from the assistant, not {}", last["role"].dump()));
  }
  static const std::set<std::string> kRoles = {"user", "assistant", "system", "tool"};
  std::optional<std::string> previous;
  for (size_t k = 0; k < messages.size(); ++k) {
    const Json& m = messages[k];
    const std::string at = fmt::format("{}: message {}", where, k);
    if (!m.is_object()) fail(at, fmt::format("a message must be an object, not {}", m.type_name()));
    if (!m.contains("role") || !m.contains("content")) {
      fail(at, fmt::format("a message needs role and content keys; it has {}", keys_of(m)));
    }
    if (m.size() != 2) fail(at, fmt::format("a message must have exactly role and content; it has {}", keys_of(m)));
    const Json& role = m["role"];
    if (!role.is_string() || !kRoles.count(role.get<std::string>())) {
      fail(at, fmt::format("invalid role {}: allowed roles are assistant, system, tool, user", role.dump()));
    }
    if (!m["content"].is_string() && !m["content"].is_array()) {
      fail(at, fmt::format("content must be a string or a list, not {}", m["content"].type_name()));
    }
    if (previous && *previous == role.get<std::string>()) {
      fail(at, fmt::format("two {} messages in a row: roles must alternate", *previous));
    }
    previous = role.get<std::string>();
  }
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

// The labels a prompt or response turn contributes under a target policy (LLM Foundry's _TARGET_POLICY_LOOKUP).
void append_labels(std::vector<int32_t>& labels, const std::vector<int32_t>& seq, const std::string& policy,
                   bool is_last_turn) {
  bool keep = false;
  if (policy == "all") {
    keep = true;
  } else if (policy == "last") {
    keep = is_last_turn;
  } else if (starts_with(policy, "length>=")) {
    keep = static_cast<int64_t>(seq.size()) >= std::stoll(policy.substr(8));
  }
  if (keep) {
    labels.insert(labels.end(), seq.begin(), seq.end());
  } else {
    labels.insert(labels.end(), seq.size(), kIgnoreLabel);
  }
}

// The files of `split` in a local folder, as Hugging Face datasets' default patterns pick them: a file whose name,
// split at - . _ space and digits, has one of the split's keywords, or a file under a folder named by one; when no
// file names any split, every file is the train split.
std::vector<std::string> split_files(const std::filesystem::path& folder, const std::string& split) {
  static const std::map<std::string, std::vector<std::string>> kKeywords = {
      {"train", {"train", "training"}},
      {"validation", {"validation", "valid", "dev", "val"}},
      {"test", {"test", "testing", "eval", "evaluation"}}};
  const auto words_of = [](const std::filesystem::path& rel) {
    std::set<std::string> words;
    for (const auto& part : rel) {
      std::string word;
      for (char c : part.string()) {
        if (c == '-' || c == '.' || c == '_' || c == ' ' || (c >= '0' && c <= '9')) {
          if (!word.empty()) words.insert(word);
          word.clear();
        } else {
          word += c;
        }
      }
      if (!word.empty()) words.insert(word);
    }
    return words;
  };
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(folder, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_regular_file()) continue;
    const std::filesystem::path rel = std::filesystem::relative(it->path(), folder);
    const std::string name = rel.filename().string();
    if (name.empty() || name[0] == '.') continue;
    const std::string ext = rel.extension().string();
    if (ext == ".lock" || ext == ".metadata" || ext == ".md" || name == ".gitattributes") continue;
    if (name == "dataset_info.json" || name == "state.json" || name == "dataset_dict.json") continue;
    if (!record_format_of(name) || record_format_of(name) == RecordFormat::kText) {
      fail(it->path().string(),
           "unsupported data file (Tessera reads .jsonl, .json, .parquet, .arrow and .csv files, plain or .gz / "
           ".zst)");
    }
    files.push_back(rel);
  }
  if (ec) fail(folder.string(), ec.message());
  std::sort(files.begin(), files.end());
  const auto keywords_for = [&](const std::string& s) {
    auto it = kKeywords.find(s);
    return it == kKeywords.end() ? std::vector<std::string>{s} : it->second;
  };
  const auto matches = [&](const std::filesystem::path& rel, const std::string& s) {
    const std::set<std::string> words = words_of(rel);
    for (const std::string& k : keywords_for(s)) {
      if (words.count(k)) return true;
    }
    return false;
  };
  std::vector<std::string> out;
  bool any_split = false;
  for (const auto& rel : files) {
    for (const auto& [name, _] : kKeywords) any_split = any_split || matches(rel, name);
    if (matches(rel, split)) out.push_back((folder / rel).string());
  }
  if (!any_split && split == "train") {
    for (const auto& rel : files) out.push_back((folder / rel).string());
  }
  return out;
}

// A hub dataset id's snapshot in the local Hugging Face cache (datasets--{org}--{name}/snapshots/{refs/main}), as
// huggingface_hub lays it out; nullopt when the id is not cached.
std::optional<std::filesystem::path> cached_dataset_snapshot(const std::string& id) {
  if (id.empty() || id.find("..") != std::string::npos || id.front() == '/') return std::nullopt;
  std::string dashed;
  for (char c : id) dashed += c == '/' ? std::string("--") : std::string(1, c);
  const std::filesystem::path repo = util::hf_hub_cache() / ("datasets--" + dashed);
  std::error_code ec;
  std::string commit;
  if (std::filesystem::exists(repo / "refs" / "main", ec)) {
    commit = util::read_file((repo / "refs" / "main").string(), kExamplesComponent);
    while (!commit.empty() && std::isspace(static_cast<unsigned char>(commit.back()))) commit.pop_back();
  } else if (std::filesystem::is_directory(repo / "snapshots", ec)) {
    for (const auto& e : std::filesystem::directory_iterator(repo / "snapshots", ec))
      commit = e.path().filename().string();
  }
  if (commit.empty() || !std::filesystem::is_directory(repo / "snapshots" / commit, ec)) return std::nullopt;
  return repo / "snapshots" / commit;
}

// `datasets`' own cache folder: $HF_DATASETS_CACHE, else $HF_HOME/datasets, else $XDG_CACHE_HOME/huggingface/datasets,
// else ~/.cache/huggingface/datasets.
std::filesystem::path hf_datasets_cache() {
  const auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v != nullptr ? v : "";
  };
  if (!env("HF_DATASETS_CACHE").empty()) return env("HF_DATASETS_CACHE");
  if (!env("HF_HOME").empty()) return std::filesystem::path(env("HF_HOME")) / "datasets";
  if (!env("XDG_CACHE_HOME").empty()) return std::filesystem::path(env("XDG_CACHE_HOME")) / "huggingface" / "datasets";
  return std::filesystem::path(env("HOME")) / ".cache" / "huggingface" / "datasets";
}

// The Arrow files of a hub dataset id's split that `datasets` prepared before, as load_dataset finds them offline
// ("Using the latest cached version"): {cache}/{org}___{name}/default/{version}/{hash}/{name}-{split}.arrow (or
// -{split}-NNNNN-of-NNNNN.arrow shards), the most recently written version; empty when there is none.
std::vector<std::string> cached_dataset_split(const std::string& id, const std::string& split) {
  if (id.empty() || id.find("..") != std::string::npos || id.front() == '/') return {};
  std::string folder_name;
  for (char c : id) folder_name += c == '/' ? std::string("___") : std::string(1, c);
  const std::filesystem::path root = hf_datasets_cache() / folder_name / "default";
  std::error_code ec;
  if (!std::filesystem::is_directory(root, ec)) return {};
  std::optional<std::filesystem::path> newest;
  std::filesystem::file_time_type newest_time{};
  for (const auto& version : std::filesystem::directory_iterator(root, ec)) {
    if (!version.is_directory(ec)) continue;
    for (const auto& build : std::filesystem::directory_iterator(version.path(), ec)) {
      const auto info = build.path() / "dataset_info.json";
      if (!build.is_directory(ec) || !std::filesystem::exists(info, ec)) continue;
      const auto when = std::filesystem::last_write_time(info, ec);
      if (!newest || when > newest_time) {
        newest = build.path();
        newest_time = when;
      }
    }
  }
  if (!newest) return {};
  std::vector<std::string> files;
  const std::string single = "-" + split + ".arrow", sharded = "-" + split + "-";
  for (const auto& f : std::filesystem::directory_iterator(*newest, ec)) {
    const std::string name = f.path().filename().string();
    const bool one =
        name.size() > single.size() && name.compare(name.size() - single.size(), single.size(), single) == 0;
    const size_t at = name.rfind(sharded);
    const bool shard = at != std::string::npos && name.size() > 6 && name.compare(name.size() - 6, 6, ".arrow") == 0 &&
                       name.find("-of-", at + sharded.size()) != std::string::npos;
    if (one || shard) files.push_back(f.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

void append_json_rows(const std::string& path, std::vector<std::pair<Json, std::string>>& rows) {
  const std::optional<RecordFormat> format = record_format_of(path);
  auto file = RecordFile::open(path, format && format != RecordFormat::kText ? *format : RecordFormat::kJsonl);
  std::vector<Record> batch;
  for (int64_t row = 0;;) {
    batch.clear();
    const size_t got = file->read(batch, 4096);
    if (got == 0) break;
    for (auto& r : batch) rows.emplace_back(std::move(r), file->where(row++));
  }
}

namespace {

const Json& preprocessor_field(const Json& row, const char* key, const std::string& name, const std::string& where) {
  auto it = row.find(key);
  if (it == row.end() || !it->is_string()) {
    fail(where, fmt::format("the {} preprocessing function needs a string '{}' field (LLM Foundry: "
                            "UnableToProcessPromptResponseError)",
                            name, key));
  }
  return *it;
}

Json user_assistant_chat(const std::string& user, const std::string& assistant) {
  return Json{{"messages", Json::array({Json{{"role", "user"}, {"content", user}},
                                        Json{{"role", "assistant"}, {"content", assistant}}})}};
}

}  // namespace

bool is_registered_preprocessor(const std::string& name) {
  static const std::set<std::string> kNames = {"tatsu-lab/alpaca",    "HuggingFaceH4/databricks_dolly_15k",
                                               "bigscience/P3",       "Muennighoff/P3",
                                               "Muennighoff/flan",    "teknium/OpenHermes-2.5",
                                               "math-ai/StackMathQA", "AI-MO/NuminaMath-CoT"};
  return kNames.count(name) > 0;
}

Json apply_registered_preprocessor(const std::string& name, const Json& row, const std::string& where) {
  const auto str = [&](const char* key) { return preprocessor_field(row, key, name, where).get<std::string>(); };
  if (name == "tatsu-lab/alpaca") {  // text = prompt "### Response:" response, exactly once
    const std::string text = str("text");
    const std::string marker = "### Response:";
    const size_t at = text.find(marker);
    if (at == std::string::npos || text.find(marker, at + 1) != std::string::npos) {
      fail(where, "the tatsu-lab/alpaca preprocessing function needs '### Response:' exactly once in 'text'");
    }
    return Json{{"prompt", text.substr(0, at + marker.size())}, {"response", text.substr(at + marker.size())}};
  }
  if (name == "HuggingFaceH4/databricks_dolly_15k") {
    const std::string input = str("input");
    const std::string instruction = input.empty() ? str("instruction") : str("instruction") + "\n" + input;
    return Json{{"prompt",
                 "Below is an instruction that describes a task. Write a response that appropriately "
                 "completes the request.\n\n### Instruction:\n" +
                     instruction + "\n\n### Response:\n"},
                {"response", str("output")}};
  }
  if (name == "bigscience/P3") return Json{{"prompt", str("inputs") + ":"}, {"response", str("targets")}};
  if (name == "Muennighoff/P3" || name == "Muennighoff/flan") {
    const std::string prompt = str("inputs");
    std::string response = str("targets");
    const auto transition = [](char c) { return c == ' ' || c == '\n' || c == '\t'; };
    if (!((!prompt.empty() && transition(prompt.back())) || (!response.empty() && transition(response.front())))) {
      response = " " + response;
    }
    return Json{{"prompt", prompt}, {"response", response}};
  }
  if (name == "teknium/OpenHermes-2.5") {
    auto it = row.find("conversations");
    if (it == row.end() || !it->is_array()) {
      fail(where, "the teknium/OpenHermes-2.5 preprocessing function needs a 'conversations' list");
    }
    Json messages = Json::array();
    for (const Json& m : *it) {
      const std::string from = preprocessor_field(m, "from", name, where).get<std::string>();
      const std::string role = from == "human" ? "user" : from == "gpt" ? "assistant" : from;
      messages.push_back(Json{{"role", role}, {"content", preprocessor_field(m, "value", name, where)}});
    }
    return Json{{"messages", messages}};
  }
  if (name == "math-ai/StackMathQA") return user_assistant_chat(str("Q"), str("A"));
  if (name == "AI-MO/NuminaMath-CoT") {
    auto it = row.find("messages");
    if (it == row.end()) fail(where, "the AI-MO/NuminaMath-CoT preprocessing function needs a 'messages' field");
    return Json{{"messages", *it}};
  }
  fail(where, fmt::format("no preprocessing function is registered as '{}'", name));
}

void validate_target_settings(const std::string& target_prompts, const std::string& target_responses,
                              const std::string& where) {
  if (target_responses != "all" && target_responses != "last") {
    fail(where, fmt::format("target_responses must be either \"last\" or \"all\", not \"{}\"", target_responses));
  }
  if (starts_with(target_prompts, "length>=")) {
    const std::string cutoff = target_prompts.substr(8);
    if (cutoff.empty() || !std::all_of(cutoff.begin(), cutoff.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      fail(where, fmt::format("target_prompts \"{}\": the cutoff after length>= must be digits", target_prompts));
    }
    if (cutoff.size() > 12 || std::stoll(cutoff) <= 0) {
      fail(where, fmt::format("target_prompts \"{}\": the cutoff must be a positive integer", target_prompts));
    }
  } else if (target_prompts != "all" && target_prompts != "none") {
    fail(where, fmt::format("target_prompts must be \"all\", \"none\" or \"length>=XX\", not \"{}\"", target_prompts));
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Tokenization.

struct ChatTokenizer::Impl {
  std::unique_ptr<chat_template::Template> tpl;
  Json context;  // the special tokens and date_string every render sees
};

ChatTokenizer::ChatTokenizer(Tokenizer tokenizer, const std::string& date_string) : tok_(std::move(tokenizer)) {
  auto impl = std::make_shared<Impl>();
  const std::optional<std::string>& own = tok_.chat_template();
  impl->tpl = std::make_unique<chat_template::Template>(own ? *own : std::string(kDefaultChatTemplate),
                                                        own ? "chat_template" : "default chat template");
  // LLM Foundry sets the pad token to the eos token when the tokenizer has none (so templates see it too).
  std::optional<std::string> pad = tok_.pad_token() ? tok_.pad_token() : tok_.eos_token();
  pad_id_ = tok_.pad_token_id() ? tok_.pad_token_id() : tok_.eos_token_id();
  Json& c = impl->context;
  if (tok_.bos_token()) c["bos_token"] = *tok_.bos_token();
  if (tok_.eos_token()) c["eos_token"] = *tok_.eos_token();
  if (tok_.unk_token()) c["unk_token"] = *tok_.unk_token();
  if (pad) c["pad_token"] = *pad;
  if (!tok_.additional_special_tokens().empty()) c["additional_special_tokens"] = tok_.additional_special_tokens();
  c["date_string"] = date_string.empty() ? today() : date_string;
  c["tools"] = nullptr;
  c["documents"] = nullptr;
  impl_ = std::move(impl);
}

std::string ChatTokenizer::apply_chat_template(const Json& messages, bool add_generation_prompt) const {
  Json context = impl_->context;
  context["messages"] = messages;
  context["add_generation_prompt"] = add_generation_prompt;
  return impl_->tpl->render(context);
}

FinetuningExample ChatTokenizer::tokenize(const Json& row, const std::string& where) const {
  if (!row.is_object()) fail(where, fmt::format("an example must be an object, not {}", row.type_name()));
  FinetuningExample out;
  if (row.size() == 1 && row.contains("messages")) {
    validate_chat(row, where);
    const Json& messages = row["messages"];
    std::string previous;  // the conversation through the previous turn
    for (size_t idx = 0; idx < messages.size(); ++idx) {
      if (messages[idx]["role"] != "assistant") continue;
      Json through = Json::array(), before = Json::array();
      for (size_t k = 0; k <= idx; ++k) {
        through.push_back(messages[k]);
        if (k < idx) before.push_back(messages[k]);
      }
      std::string full, with_prompt;
      try {
        full = apply_chat_template(through, false);
        with_prompt = apply_chat_template(before, true);
      } catch (const Error& e) {
        fail(where, fmt::format("the chat template failed: {}", e.what()));
      }
      if (!starts_with(full, previous) || !starts_with(with_prompt, previous) || !starts_with(full, with_prompt)) {
        fail(where,
             "the chat template does not render each conversation as an extension of the previous turn's "
             "(LLM Foundry's InvalidConversationError)");
      }
      const std::string prompt = with_prompt.substr(previous.size());
      const std::string response = full.substr(with_prompt.size());
      out.turns.push_back({tok_.encode(prompt, false), tok_.encode(response, false)});
      previous += prompt;
      previous += response;
    }
    return out;
  }
  const Json* response = response_of(row);
  if (row.size() != 2 || !row.contains("prompt") || response == nullptr) {
    fail(where, fmt::format("unknown example type with keys {}: prompt/response examples have 'prompt' and "
                            "'response' (or 'completion'), chat examples have 'messages' only",
                            keys_of(row)));
  }
  if (!row["prompt"].is_string())
    fail(where, fmt::format("prompt must be a string, not {}", row["prompt"].type_name()));
  if (!response->is_string()) fail(where, fmt::format("response must be a string, not {}", response->type_name()));
  FinetuningTurn turn{tok_.encode(row["prompt"].get_ref<const std::string&>(), true),
                      tok_.encode(response->get_ref<const std::string&>(), true)};
  // Both sides start with the BOS the tokenizer adds: the labels do not repeat it.
  const std::optional<int32_t> bos = tok_.bos_token_id();
  if (bos && !turn.prompt.empty() && !turn.response.empty() && turn.prompt[0] == *bos && turn.response[0] == *bos) {
    turn.response.erase(turn.response.begin());
  }
  out.turns.push_back(std::move(turn));
  return out;
}

std::pair<std::vector<int32_t>, std::vector<int32_t>> stitch_turns(const FinetuningExample& example,
                                                                   const std::string& target_prompts,
                                                                   const std::string& target_responses,
                                                                   std::optional<int32_t> eos) {
  std::vector<int32_t> ids, labels;
  for (size_t k = 0; k < example.turns.size(); ++k) {
    const bool last = k + 1 == example.turns.size();
    const std::vector<int32_t>& context = example.turns[k].prompt;
    std::vector<int32_t> target = example.turns[k].response;
    if (last && eos && (target.empty() || target.back() != *eos)) target.push_back(*eos);
    ids.insert(ids.end(), context.begin(), context.end());
    ids.insert(ids.end(), target.begin(), target.end());
    append_labels(labels, context, target_prompts, last);
    append_labels(labels, target, target_responses, last);
  }
  return {std::move(ids), std::move(labels)};
}

// ---------------------------------------------------------------------------------------------------------------
// Reading.

std::vector<std::string> finetuning_data_files(const FinetuningOptions& o) {
  std::vector<std::string> files;
  std::error_code ec;
  const bool builder = o.hf_name == "json" || o.hf_name == "csv" || o.hf_name == "parquet" || o.hf_name == "arrow";
  if (!builder && o.data_dir.empty() && !std::filesystem::exists(o.hf_name, ec)) {
    // A hub id whose split `datasets` prepared before (what load_dataset reads offline) comes first.
    files = cached_dataset_split(o.hf_name, o.split);
  }
  if (builder) {
    auto it = o.data_files.find(o.split);
    if (it == o.data_files.end()) {
      fail("hf_kwargs.data_files", fmt::format("no files for split '{}'", o.split));
    }
    files = it->second;
  } else if (files.empty()) {
    std::filesystem::path folder(o.hf_name);
    if (!std::filesystem::exists(folder, ec)) {
      if (auto snapshot = cached_dataset_snapshot(o.hf_name)) folder = *snapshot;
    }
    if (!o.data_dir.empty()) folder /= o.data_dir;
    if (std::filesystem::is_regular_file(folder, ec)) {
      fail(o.hf_name,
           "hf_name is a file: give its folder (with split-named files), or hf_name: json with "
           "hf_kwargs.data_files");
    }
    if (!std::filesystem::is_directory(folder, ec)) {
      fail(folder.string(),
           fmt::format("no such folder (hf_name must be a local folder of data files, a hub dataset id that "
                       "`datasets` cached ({}) or whose snapshot is in the Hugging Face cache ({}), or json / parquet "
                       "/ csv / arrow with hf_kwargs.data_files; datasets on the Hugging Face Hub are not downloaded)",
                       hf_datasets_cache().string(), util::hf_hub_cache().string()));
    }
    files = split_files(folder, o.split);
    if (files.empty()) fail(o.hf_name, fmt::format("no data file for split '{}'", o.split));
  }
  for (const std::string& f : files) {
    if (!std::filesystem::exists(f, ec)) fail(f, "no such data file");
  }
  return files;
}

std::vector<std::pair<Json, std::string>> read_finetuning_rows(const FinetuningOptions& o) {
  std::vector<std::pair<Json, std::string>> rows;
  for (const std::string& f : finetuning_data_files(o)) append_json_rows(f, rows);
  // A dataset has the columns of all its rows: a row without one has it as null (as Hugging Face datasets does).
  std::vector<std::string> columns;
  std::set<std::string> seen;
  for (const auto& [row, _] : rows) {
    for (const auto& [k, v] : row.items()) {
      if (seen.insert(k).second) columns.push_back(k);
    }
  }
  // LLM Foundry: a named preprocessing_fn, else the one registered under the dataset's name.
  const std::string preprocessor =
      !o.preprocessor.empty() ? o.preprocessor : (is_registered_preprocessor(o.hf_name) ? o.hf_name : "");
  for (auto& [row, where] : rows) {
    if (row.size() != columns.size()) {
      Json full = Json::object();
      for (const std::string& c : columns) full[c] = row.contains(c) ? row[c] : Json(nullptr);
      row = std::move(full);
    }
    if (o.columns) {
      for (const std::string& c : {o.columns->first, o.columns->second}) {
        if (!row.contains(c)) fail(where, fmt::format("preprocessing_fn names column '{}', which the data lacks", c));
      }
      row = Json{{"prompt", row[o.columns->first]}, {"response", row[o.columns->second]}};
    } else if (!preprocessor.empty()) {
      row = apply_registered_preprocessor(preprocessor, row, where);
    }
  }
  return rows;
}

}  // namespace tessera::data
