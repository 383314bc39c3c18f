// LLM Foundry's fine-tuning data path: llmfoundry/data/finetuning/tasks.py (reading, validating and tokenizing
// examples, filtering), collator.py (Seq2SeqFinetuningCollator, decoder-only), packing.py (BinPackCollator and
// auto_packing_ratio), with Composer's distributed sampler (torch's DistributedSampler) for the order.
#include "tessera/data/finetuning.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>
#include <set>
#include <sstream>

#include "tessera/data/mds.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"
#include "tessera/util/jinja.h"

namespace tessera::data {
namespace {

using Json = nlohmann::ordered_json;
constexpr const char* kComponent = "finetuning";
constexpr int32_t kIgnore = -100;

// LLM Foundry's _DEFAULT_CHAT_TEMPLATE (ChatML), for tokenizers without a template of their own.
constexpr const char* kDefaultChatTemplate =
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}"
    "{% endif %}";

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw Error(kComponent, fmt::format("{}: {}", where, what));
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

// Token ids of an MDS column: an ndarray of any integer type, or bytes of `encoding` values (LLM Foundry's legacy).
std::vector<int32_t> tokens_of(const mds::Field& field, const std::string& encoding, const std::string& where) {
  at::Tensor t;
  if (const auto* tensor = std::get_if<at::Tensor>(&field)) {
    t = tensor->reshape({-1});
  } else if (const auto* bytes = std::get_if<std::string>(&field)) {
    static const std::map<std::string, at::ScalarType> kTypes = {
        {"int8", at::kChar},  {"int16", at::kShort},   {"int32", at::kInt},     {"int64", at::kLong},
        {"uint8", at::kByte}, {"uint16", at::kUInt16}, {"uint32", at::kUInt32}, {"uint64", at::kUInt64}};
    auto it = kTypes.find(encoding);
    if (it == kTypes.end()) fail(where, fmt::format("token_encoding_type {} is not an integer type", encoding));
    const size_t item = c10::elementSize(it->second);
    if (bytes->size() % item != 0) {
      fail(where, fmt::format("{} bytes is not a whole number of {} tokens", bytes->size(), encoding));
    }
    t = at::empty({static_cast<int64_t>(bytes->size() / item)}, at::TensorOptions().dtype(it->second));
    std::memcpy(t.data_ptr(), bytes->data(), bytes->size());
  } else {
    fail(where, "a token column must hold an array or bytes");
  }
  t = t.to(at::kLong).contiguous();
  return std::vector<int32_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
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
    labels.insert(labels.end(), seq.size(), kIgnore);
  }
}

bool has_loss(const std::vector<int32_t>& labels, size_t limit) {
  const size_t n = std::min(limit, labels.size());
  return std::any_of(labels.begin(), labels.begin() + static_cast<std::ptrdiff_t>(n),
                     [](int32_t l) { return l != kIgnore; });
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
    if (ext == ".lock" || ext == ".metadata" || ext == ".md") continue;
    if (ext != ".jsonl" && ext != ".json") {
      fail(it->path().string(),
           "unsupported data file (Tessera reads .jsonl and .json files; convert CSV or Parquet "
           "to JSONL)");
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

void read_file_rows(const std::string& path, std::vector<std::pair<Json, std::string>>& rows) {
  const std::string text = util::read_file(path, kComponent);
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {
    Json doc;
    try {
      doc = Json::parse(text);
    } catch (const Json::exception& e) {
      fail(path, fmt::format("malformed JSON: {}", e.what()));
    }
    for (size_t k = 0; k < doc.size(); ++k) {
      const std::string where = fmt::format("{}[{}]", path, k);
      if (!doc[k].is_object()) fail(where, fmt::format("expected an object, not {}", doc[k].type_name()));
      rows.emplace_back(std::move(doc[k]), where);
    }
    return;
  }
  std::istringstream in(text);
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", path, number);
    Json row;
    try {
      row = Json::parse(line);
    } catch (const Json::exception& e) {
      fail(where, fmt::format("malformed JSON line: {}", e.what()));
    }
    if (!row.is_object()) fail(where, fmt::format("expected a JSON object, not {}", row.type_name()));
    rows.emplace_back(std::move(row), where);
  }
}

// BinPackCollator._first_fit_bin_packing: the items (largest first, stable) go into the bins left over from the
// previous batch, each into the first bin it fits (which then moves to the end), or a bin of its own; when only as
// many items remain as bins are missing, each gets its own. The `num_bins` largest bins are returned; the rest are
// kept in `leftovers` (at most `keep` of them). Items have a `size`; combine(bin, item) merges item into bin.
template <class Item, class Combine>
std::vector<Item> first_fit(std::vector<Item> items, std::vector<Item>& leftovers, size_t num_bins, int64_t max_size,
                            std::optional<int64_t> keep, Combine combine) {
  const auto by_size = [](const Item& a, const Item& b) { return a.size > b.size; };
  std::stable_sort(items.begin(), items.end(), by_size);
  std::vector<Item> bins = std::move(leftovers);
  leftovers.clear();
  const size_t count = items.size();
  const auto missing = [&] { return num_bins > bins.size() ? num_bins - bins.size() : 0; };
  if (count < missing()) {
    for (Item& e : items) bins.push_back(std::move(e));
  } else {
    for (size_t i = 0; i < count; ++i) {
      Item& e = items[i];
      if (count - i == missing()) {
        bins.push_back(std::move(e));
        continue;
      }
      auto fits = std::find_if(bins.begin(), bins.end(), [&](const Item& b) { return b.size + e.size <= max_size; });
      if (fits == bins.end()) {
        bins.push_back(std::move(e));
        continue;
      }
      Item bin = std::move(*fits);
      bins.erase(fits);
      combine(bin, e);
      bins.push_back(std::move(bin));
    }
  }
  std::stable_sort(bins.begin(), bins.end(), by_size);
  std::vector<Item> out;
  for (size_t k = 0; k < bins.size(); ++k) {
    if (k < num_bins) {
      out.push_back(std::move(bins[k]));
    } else if (!keep || static_cast<int64_t>(leftovers.size()) < *keep) {
      leftovers.push_back(std::move(bins[k]));
    }
  }
  return out;
}

// A packed row's length only, for profiling.
struct Length {
  int64_t size = 0;
};

}  // namespace

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
  std::unique_ptr<util::jinja::Template> chat_template;
  Json context;  // the special tokens and date_string every render sees
};

ChatTokenizer::ChatTokenizer(Tokenizer tokenizer, const std::string& date_string) : tok_(std::move(tokenizer)) {
  auto impl = std::make_shared<Impl>();
  const std::optional<std::string>& own = tok_.chat_template();
  impl->chat_template = std::make_unique<util::jinja::Template>(own ? *own : std::string(kDefaultChatTemplate),
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
  return impl_->chat_template->render(context);
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

std::vector<std::pair<Json, std::string>> read_finetuning_rows(const FinetuningOptions& o) {
  std::vector<std::string> files;
  if (o.hf_name == "json") {
    auto it = o.data_files.find(o.split);
    if (it == o.data_files.end()) {
      fail("hf_kwargs.data_files", fmt::format("no files for split '{}'", o.split));
    }
    files = it->second;
  } else {
    const std::filesystem::path folder(o.hf_name);
    std::error_code ec;
    if (std::filesystem::is_regular_file(folder, ec)) {
      fail(o.hf_name,
           "hf_name is a file: give its folder (with split-named files), or hf_name: json with "
           "hf_kwargs.data_files");
    }
    if (!std::filesystem::is_directory(folder, ec)) {
      fail(o.hf_name,
           "no such folder (hf_name must be a local folder of JSONL/JSON files, or json with "
           "hf_kwargs.data_files; datasets on the Hugging Face Hub are not downloaded)");
    }
    files = split_files(folder, o.split);
    if (files.empty()) fail(o.hf_name, fmt::format("no data file for split '{}'", o.split));
  }
  std::vector<std::pair<Json, std::string>> rows;
  for (const std::string& f : files) {
    if (!std::filesystem::exists(f)) fail(f, "no such data file");
    read_file_rows(f, rows);
  }
  // A dataset has the columns of all its rows: a row without one has it as null (as Hugging Face datasets does).
  std::vector<std::string> columns;
  std::set<std::string> seen;
  for (const auto& [row, _] : rows) {
    for (const auto& [k, v] : row.items()) {
      if (seen.insert(k).second) columns.push_back(k);
    }
  }
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
    }
  }
  return rows;
}

// ---------------------------------------------------------------------------------------------------------------
// The dataset, the sampler and the collators.

FinetuningDataset::FinetuningDataset(const FinetuningOptions& options, const ChatTokenizer& tokenizer,
                                     int64_t device_batch_size, int64_t world_size, int64_t ranks_per_node)
    : o_(options),
      device_batch_size_(device_batch_size),
      pad_id_(tokenizer.pad_token_id().value_or(0)),
      pad_left_(tokenizer.pad_left()),
      eos_(tokenizer.eos_token_id()),
      examples_per_batch_(device_batch_size) {
  validate_target_settings(o_.target_prompts, o_.target_responses, "train_loader.dataset");
  if (!tokenizer.pad_token_id()) {
    throw Error(kComponent,
                "the tokenizer has neither a pad token nor an eos token to pad with (set pad_token or "
                "eos_token in its tokenizer_config.json)");
  }
  if (o_.streams) {
    if (o_.auto_packing_ratio) fail("train_loader.dataset.packing_ratio", "auto needs hf_name data, not MDS streams");
    packing_ratio_ = o_.packing_ratio.value_or(1);
    if (packing_ratio_ < 1) fail("train_loader.dataset.packing_ratio", "must be at least 1");
    examples_per_batch_ = packing_ratio_ == 1
                              ? device_batch_size_
                              : static_cast<int64_t>(static_cast<double>(device_batch_size_) * packing_ratio_);
    ranks_per_node_ = ranks_per_node > 0 ? ranks_per_node : world_size;
    StreamingOptions so = *o_.streams;
    so.batch_size = examples_per_batch_;  // the DataLoader's batch: the examples packed into one batch
    mds_ = std::make_unique<StreamingDataset>(so, World{world_size / ranks_per_node_, ranks_per_node_, 1});
    tokenizer_ = tokenizer;
    return;
  }
  const std::string source = o_.hf_name == "json" ? "hf_kwargs.data_files" : o_.hf_name;
  for (const auto& [row, where] : read_finetuning_rows(o_)) {
    const FinetuningExample ex = tokenizer.tokenize(row, where);
    // is_valid_ift_example: no empty turn, and some loss token left after truncation (stitched without the eos).
    bool valid = std::all_of(ex.turns.begin(), ex.turns.end(),
                             [](const FinetuningTurn& t) { return !t.prompt.empty() && !t.response.empty(); });
    if (valid) {
      const auto [ids, labels] = stitch_turns(ex, o_.target_prompts, o_.target_responses, std::nullopt);
      valid = !ids.empty() && has_loss(labels, static_cast<size_t>(o_.max_seq_len));
    }
    if (!valid) {
      ++dropped_;
      continue;
    }
    examples_.push_back(stitch_turns(ex, o_.target_prompts, o_.target_responses, eos_));
  }
  if (dropped_ > 0) {
    spdlog::warn(
        "{} split '{}': dropped {} examples where the prompt was longer than max_seq_len {}, the prompt or "
        "response was empty, or no loss-generating token was left",
        source, o_.split, dropped_, o_.max_seq_len);
  }
  if (examples_.empty()) {
    fail(source, fmt::format("split '{}': no valid examples after dropping {} (prompts longer than max_seq_len {}, "
                             "empty prompts or responses, or no loss-generating tokens)",
                             o_.split, dropped_, o_.max_seq_len));
  }
  if (o_.auto_packing_ratio) {
    // Every rank profiles every rank's share, so all agree on the smallest ratio without communicating (LLM Foundry
    // all-reduces the MIN).
    double ratio = std::numeric_limits<double>::infinity();
    for (int64_t r = 0; r < world_size; ++r) {
      std::vector<int64_t> sizes;
      for (int64_t i : sampler_indices(0, world_size, r, false)) {
        sizes.push_back(
            std::min<int64_t>(static_cast<int64_t>(examples_[static_cast<size_t>(i)].first.size()), o_.max_seq_len));
      }
      ratio = std::min(ratio, profile_auto_packing_ratio(sizes, device_batch_size_, o_.max_seq_len, std::nullopt));
    }
    packing_ratio_ = ratio;
    spdlog::info("packing_ratio auto: profiled {}", packing_ratio_);
  } else if (o_.packing_ratio) {
    packing_ratio_ = *o_.packing_ratio;
  }
  if (packing_ratio_ < 1) fail("train_loader.dataset.packing_ratio", "must be at least 1");
  examples_per_batch_ = packing_ratio_ == 1
                            ? device_batch_size_
                            : static_cast<int64_t>(static_cast<double>(device_batch_size_) * packing_ratio_);
}

std::vector<int64_t> FinetuningDataset::sampler_indices(int64_t epoch, int64_t world_size, int64_t rank,
                                                        bool drop_last) const {
  const int64_t n = size();
  const int64_t per_rank = drop_last && n % world_size != 0 ? (n - world_size + world_size - 1) / world_size
                                                            : (n + world_size - 1) / world_size;
  const int64_t total = per_rank * world_size;
  std::vector<int64_t> indices(static_cast<size_t>(n));
  if (o_.shuffle) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(o_.shuffle_seed + epoch));
    const at::Tensor perm = at::randperm(n, gen, at::TensorOptions().dtype(at::kLong));
    std::copy(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + n, indices.begin());
  } else {
    for (int64_t i = 0; i < n; ++i) indices[static_cast<size_t>(i)] = i;
  }
  if (!drop_last) {
    for (int64_t k = 0; static_cast<int64_t>(indices.size()) < total; ++k) indices.push_back(indices[k % n]);
  } else {
    indices.resize(static_cast<size_t>(total));
  }
  std::vector<int64_t> mine;
  for (int64_t i = rank; i < total; i += world_size) mine.push_back(indices[static_cast<size_t>(i)]);
  return mine;
}

int64_t FinetuningDataset::batches_in_epoch(int64_t world_size, bool drop_last) const {
  if (mds_) return static_cast<int64_t>(worker_batches(mds_->epoch_ids(0, 0), 0, 0, drop_last)[0].size());
  const int64_t n = static_cast<int64_t>(sampler_indices(0, world_size, 0, drop_last).size());
  return drop_last ? n / examples_per_batch_ : (n + examples_per_batch_ - 1) / examples_per_batch_;
}

FinetuningDataset::Epoch::Epoch(const FinetuningDataset& ds, int64_t epoch, int64_t world_size, int64_t rank,
                                bool drop_last)
    : ds_(ds), drop_last_(drop_last) {
  if (ds.mds_) {
    // Streaming's order: this rank's (only) worker's batches, as LLM Foundry's DataLoader over the dataset reads them.
    mds_ = worker_batches(ds.mds_->epoch_ids(epoch, 0), rank / ds.ranks_per_node_, rank % ds.ranks_per_node_,
                          drop_last)[0];
  } else {
    order_ = ds.sampler_indices(epoch, world_size, rank, drop_last);
  }
}

std::optional<FinetuningBatch> FinetuningDataset::Epoch::next() {
  std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> from_mds;
  std::vector<const std::pair<std::vector<int32_t>, std::vector<int32_t>>*> examples;
  if (ds_.mds_) {
    if (at_ >= mds_.size()) return std::nullopt;
    for (int64_t id : mds_[at_]) from_mds.push_back(ds_.mds_example(id));
    for (const auto& e : from_mds) examples.push_back(&e);
    ++at_;
  } else {
    const auto per_batch = static_cast<size_t>(ds_.examples_per_batch_);
    const size_t left = order_.size() - at_;
    if (left == 0 || (drop_last_ && left < per_batch)) return std::nullopt;
    for (size_t k = 0; k < std::min(per_batch, left); ++k) {
      examples.push_back(&ds_.examples_[static_cast<size_t>(order_[at_ + k])]);
    }
    at_ += examples.size();
  }
  const size_t n = examples.size();
  const auto T = static_cast<size_t>(ds_.o_.max_seq_len);
  // Seq2SeqFinetuningCollator: truncate to max_seq_len, pad to it.
  std::vector<Bin> rows;
  size_t longest = 0;
  for (size_t k = 0; k < n; ++k) {
    const auto& [ids, labels] = *examples[k];
    if (!has_loss(labels, T)) {
      throw Error(kComponent, fmt::format("an example of {} tokens keeps no loss-generating token within max_seq_len "
                                          "{} (MDS fine-tuning data is not filtered: prepare it with the same "
                                          "max_seq_len and target settings)",
                                          ids.size(), T));
    }
    Bin p;
    const size_t len = std::min(ids.size(), T);
    p.ids.assign(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(len));
    p.labels.assign(labels.begin(), labels.begin() + static_cast<std::ptrdiff_t>(len));
    p.sequence_id.assign(len, 0);
    p.size = static_cast<int64_t>(len);
    longest = std::max(longest, len);
    rows.push_back(std::move(p));
  }
  size_t width = T;
  const bool packing = ds_.packing_ratio_ != 1;
  if (!packing && ds_.o_.allow_pad_trimming && seen_first_) {
    width = std::min(T, (longest + 7) / 8 * 8);  // padding trimmed to a multiple of 8 (never the first batch)
  }
  seen_first_ = true;
  if (packing) rows = pack(std::move(rows));
  FinetuningBatch b;
  b.examples = static_cast<int64_t>(n);
  const auto B = static_cast<int64_t>(rows.size());
  const auto W = static_cast<int64_t>(width);
  b.input_ids = at::full({B, W}, ds_.pad_id_, at::kLong);
  b.labels = at::full({B, W}, kIgnore, at::kLong);
  b.attention_mask = at::zeros({B, W}, at::kLong);
  b.sequence_id = at::full({B, W}, -1, at::kLong);
  for (int64_t r = 0; r < B; ++r) {
    const Bin& p = rows[static_cast<size_t>(r)];
    const int64_t len = std::min<int64_t>(p.size, W);
    const int64_t start = ds_.pad_left_ ? W - len : 0;
    // Left padding trims from the left (LLM Foundry keeps the last `width` columns).
    const int64_t from = ds_.pad_left_ ? p.size - len : 0;
    int64_t* ids = b.input_ids[r].data_ptr<int64_t>();
    int64_t* labels = b.labels[r].data_ptr<int64_t>();
    int64_t* mask = b.attention_mask[r].data_ptr<int64_t>();
    int64_t* seq = b.sequence_id[r].data_ptr<int64_t>();
    for (int64_t t = 0; t < len; ++t) {
      const auto src = static_cast<size_t>(from + t);
      ids[start + t] = p.ids[src];
      labels[start + t] = p.labels[src];
      mask[start + t] = 1;
      seq[start + t] = p.sequence_id[src];
    }
  }
  return b;
}

// BinPackCollator._first_fit_bin_packing over this batch's examples and the bins left over from earlier batches.
std::vector<FinetuningDataset::Bin> FinetuningDataset::Epoch::pack(std::vector<Bin> examples) {
  for (const Bin& e : examples) stats_.total_tokens += e.size;
  stats_.rows += ds_.device_batch_size_;
  const auto combine = [](Bin& bin, Bin& add) {
    add.labels[0] = kIgnore;  // the first token of a packed example predicts nothing from the one before
    const int64_t next =
        bin.sequence_id.empty() ? 0 : *std::max_element(bin.sequence_id.begin(), bin.sequence_id.end()) + 1;
    bin.ids.insert(bin.ids.end(), add.ids.begin(), add.ids.end());
    bin.labels.insert(bin.labels.end(), add.labels.begin(), add.labels.end());
    for (int64_t s : add.sequence_id) bin.sequence_id.push_back(s + next);
    bin.size += add.size;
  };
  std::vector<Bin> out = first_fit(std::move(examples), leftovers_, static_cast<size_t>(ds_.device_batch_size_),
                                   ds_.o_.max_seq_len, ds_.o_.max_leftover_bins_to_keep, combine);
  for (const Bin& b : out) stats_.packed_tokens += b.size;
  return out;
}

std::pair<std::vector<int32_t>, std::vector<int32_t>> FinetuningDataset::mds_example(int64_t sample) const {
  const mds::Sample s = mds_->get(sample);
  const std::string where = fmt::format("MDS sample {}", sample);
  FinetuningExample ex;
  if (auto it = s.find("turns"); it != s.end()) {
    // convert_finetuning_dataset's tokenized layout: [{"input_ids": [...], "labels": [...]}, ...]
    const auto* turns = std::get_if<Json>(&it->second);
    if (turns == nullptr || !turns->is_array()) fail(where, "the turns column must hold a JSON list");
    for (const Json& t : *turns) {
      if (!t.is_object() || !t.contains("input_ids") || !t.contains("labels")) {
        fail(where, "each turn must have input_ids and labels");
      }
      ex.turns.push_back({t["input_ids"].get<std::vector<int32_t>>(), t["labels"].get<std::vector<int32_t>>()});
    }
  } else if (s.count("input_ids") != 0U) {
    // The legacy tokenized layout: input_ids (the prompt) and labels (the response), truncated to max_seq_len.
    FinetuningTurn turn;
    for (const char* column : {"input_ids", "labels"}) {
      auto c = s.find(column);
      if (c == s.end()) fail(where, fmt::format("input_ids without {}", column));
      std::vector<int32_t> tokens = tokens_of(c->second, o_.token_encoding_type, where);
      if (static_cast<int64_t>(tokens.size()) > o_.max_seq_len) tokens.resize(static_cast<size_t>(o_.max_seq_len));
      (std::string(column) == "input_ids" ? turn.prompt : turn.response) = std::move(tokens);
    }
    ex.turns.push_back(std::move(turn));
  } else {
    // Untokenized rows (prompt/response str columns, or messages json): tokenized as rows of files are.
    Json row = Json::object();
    for (const auto& [k, v] : s) {
      if (const auto* str = std::get_if<std::string>(&v)) {
        row[k] = *str;
      } else if (const auto* j = std::get_if<Json>(&v)) {
        row[k] = *j;
      } else if (const auto* i = std::get_if<int64_t>(&v)) {
        row[k] = *i;
      } else if (const auto* d = std::get_if<double>(&v)) {
        row[k] = *d;
      } else {
        fail(where, fmt::format("column {} holds an array; expected turns, input_ids/labels, prompt/response or "
                                "messages",
                                k));
      }
    }
    ex = tokenizer_->tokenize(row, where);
  }
  return stitch_turns(ex, o_.target_prompts, o_.target_responses, eos_);
}

FinetuningBatches::FinetuningBatches(const FinetuningDataset& ds, int64_t epoch, int64_t world_size, int64_t rank,
                                     bool drop_last, int64_t skip)
    : epoch_(ds, epoch, world_size, rank, drop_last), packed_(ds.packing_ratio() != 1), pad_left_(ds.pad_left()) {
  for (int64_t k = 0; k < skip && epoch_.next(); ++k) {
  }
}

std::optional<TokenBatch> FinetuningBatches::next() {
  std::optional<FinetuningBatch> b = epoch_.next();
  if (!b) return std::nullopt;
  TokenBatch out;
  out.input_ids = std::move(b->input_ids);
  out.labels = std::move(b->labels);
  out.samples = out.input_ids.size(0);
  if (pad_left_) out.attention_mask = std::move(b->attention_mask);
  if (packed_) out.sequence_id = std::move(b->sequence_id);
  return out;
}

double profile_auto_packing_ratio(const std::vector<int64_t>& sizes, int64_t device_batch_size, int64_t max_seq_len,
                                  std::optional<int64_t> max_leftover_bins_to_keep) {
  if (max_seq_len <= 100) return 1;
  // np.linspace(1, max_seq_len / 100, 20), rounded to one decimal (half to even), one ratio per raw batch size.
  const double max_ratio = static_cast<double>(max_seq_len) / 100.0;
  constexpr int kRatios = 20;
  std::vector<double> ratios;
  std::vector<int64_t> raw_sizes;
  const double step = (max_ratio - 1.0) / (kRatios - 1);
  for (int k = 0; k < kRatios; ++k) {
    double r = k == kRatios - 1 ? max_ratio : 1.0 + k * step;
    r = std::nearbyint(10 * r) / 10;
    const auto raw = static_cast<int64_t>(r * static_cast<double>(device_batch_size));
    if (std::find(raw_sizes.begin(), raw_sizes.end(), raw) == raw_sizes.end()) {
      ratios.push_back(r);
      raw_sizes.push_back(raw);
    }
  }
  const int64_t profiled = std::min<int64_t>(static_cast<int64_t>(sizes.size()),
                                             *std::max_element(raw_sizes.begin(), raw_sizes.end()) * 100);
  double chosen = 1;
  for (size_t k = 0; k < ratios.size(); ++k) {
    const int64_t raw = raw_sizes[k];
    // A packer in profiling mode: lengths only.
    std::vector<Length> leftovers;
    int64_t packed = 0, total = 0, batches = 0;
    for (int64_t idx = 0; idx < profiled; idx += raw) {
      const int64_t end = std::min(profiled, idx + raw);
      if (end - idx < device_batch_size) continue;
      std::vector<Length> batch;
      for (int64_t i = idx; i < end; ++i) {
        batch.push_back({sizes[static_cast<size_t>(i)]});
        total += sizes[static_cast<size_t>(i)];
      }
      for (const Length& b :
           first_fit(std::move(batch), leftovers, static_cast<size_t>(device_batch_size), max_seq_len,
                     max_leftover_bins_to_keep, [](Length&bin, const Length&add) { bin.size += add.size; })) {
        packed += b.size;
      }
      ++batches;
    }
    if (batches == 0 || packed != total) break;  // no data to profile, or some waste: keep the previous ratio
    chosen = ratios[k];
  }
  return chosen;
}

}  // namespace tessera::data
