// Tessera's byte-level BPE trainer. It follows Hugging Face's BpeTrainer (tokenizers/src/models/bpe/trainer.rs) step
// for step so that the same documents give the same vocab and merges:
//   1. words: GPT-2 pre-tokenizer pieces of every document, counted (special tokens in the text are not split out,
//      as in Hugging Face's training);
//   2. vocab: the special tokens, then the 256 byte-level characters in code point order;
//   3. pair counts over words (weighted by word count) and, per pair, the words it occurs in;
//   4. a max-heap of (count, pair) entries, ties to the smaller (left id, right id); a popped entry whose count is
//      stale is pushed back with the current count; the merge is applied to the words recorded in that entry, and
//      every pair those merges create is pushed as a new entry with the words it was created in.
// Stops when the vocab reaches vocab_size or the best count falls below min_frequency.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <queue>

#include "regex.h"
#include "tessera/data/tokenizer.h"
#include "tessera/util/error.h"
#include "tessera/util/utf8.h"
#include "tokenizer_impl.h"
#include "unicode.h"

namespace tessera::data {
namespace {

using detail::StringMap;
constexpr const char* kComponent = "tokenizer";

using Pair = uint64_t;  // (left id << 32) | right id: ordering Pairs orders (left, right) lexicographically
Pair make_pair(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b);
}
int32_t left_of(Pair p) {
  return static_cast<int32_t>(p >> 32);
}
int32_t right_of(Pair p) {
  return static_cast<int32_t>(p & 0xFFFFFFFF);
}

struct Merge {
  int64_t count;
  Pair pair;
  std::vector<int32_t> words;  // indices of the words this entry applies to (sorted, unique)
};
struct MergeOrder {
  bool operator()(const Merge& a, const Merge& b) const {  // true if a pops after b
    if (a.count != b.count) return a.count < b.count;
    return a.pair > b.pair;
  }
};

struct Change {
  Pair pair;
  int delta;
};

// Hugging Face's Word::merge: replaces every non-overlapping (a, b), left to right, and reports the pair changes.
void merge_word(std::vector<int32_t>& w, int32_t a, int32_t b, int32_t replacement, std::vector<Change>& changes) {
  size_t i = 0;
  while (i < w.size()) {
    if (w[i] == a && i + 1 < w.size() && w[i + 1] == b) {
      if (i > 0) {
        changes.push_back({make_pair(w[i - 1], a), -1});
        changes.push_back({make_pair(w[i - 1], replacement), 1});
      }
      w[i] = replacement;
      w.erase(w.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      if (i + 1 < w.size()) {
        changes.push_back({make_pair(b, w[i + 1]), -1});
        changes.push_back({make_pair(replacement, w[i + 1]), 1});
      }
    }
    ++i;
  }
}

// Words of the GPT-2 pre-tokenizer (pieces of raw bytes) with their counts.
StringMap<int64_t> count_words(const std::vector<std::string>& documents) {
  StringMap<int64_t> counts;
  std::vector<std::pair<size_t, size_t>> matches;
  for (const std::string& doc : documents) {
    const std::string text = sanitize_utf8(doc);
    matches.clear();
    detail::Regex::gpt2().find_all(text, matches);
    size_t prev = 0;
    const auto add = [&](size_t b, size_t e) {
      if (e == b) return;
      const std::string_view w(text.data() + b, e - b);
      if (auto it = counts.find(w); it != counts.end()) {
        ++it->second;
      } else {
        counts.emplace(std::string(w), 1);
      }
    };
    for (const auto& [b, e] : matches) {
      add(prev, b);
      add(b, e);
      prev = e;
    }
    add(prev, text.size());
  }
  return counts;
}

std::string tokenizer_json(const std::vector<std::string>& id_to_word, size_t num_special,
                           const std::vector<std::pair<Pair, int32_t>>& merges) {
  std::vector<detail::AddedToken> added;
  for (size_t i = 0; i < num_special; ++i) {
    added.push_back({.content = id_to_word[i], .id = static_cast<int32_t>(i), .special = true, .normalized = false});
  }
  std::vector<std::pair<std::string, int64_t>> vocab;
  for (size_t i = 0; i < id_to_word.size(); ++i) vocab.emplace_back(id_to_word[i], static_cast<int64_t>(i));
  std::vector<std::pair<std::string, std::string>> merge_list;
  for (const auto& [pair, id] : merges) merge_list.emplace_back(id_to_word[left_of(pair)], id_to_word[right_of(pair)]);
  const auto byte_level = [](bool add_prefix_space, bool trim_offsets) {
    return nlohmann::json{{"type", "ByteLevel"},
                          {"add_prefix_space", add_prefix_space},
                          {"trim_offsets", trim_offsets},
                          {"use_regex", true}};
  };
  return detail::bpe_tokenizer_json(added, vocab, merge_list, byte_level(false, true), byte_level(true, false),
                                    byte_level(true, true), false);
}

}  // namespace

Tokenizer train_bpe_tokenizer(const std::vector<std::string>& documents, const BpeTrainerOptions& options) {
  if (options.vocab_size < 1 || options.vocab_size > (int64_t{1} << 22))
    throw ConfigError(kComponent, fmt::format("vocab_size {} out of range [1, 4194304]", options.vocab_size));
  if (options.min_frequency < 0)
    throw ConfigError(kComponent, fmt::format("min_frequency {} is negative", options.min_frequency));

  // 1-2. Vocab: special tokens, then the byte-level alphabet in code point order.
  StringMap<int32_t> word_to_id;
  std::vector<std::string> id_to_word;
  const auto add_token = [&](const std::string& token) {
    if (word_to_id.count(token)) return;
    word_to_id.emplace(token, static_cast<int32_t>(id_to_word.size()));
    id_to_word.push_back(token);
  };
  for (const std::string& s : options.special_tokens) {
    if (s.empty()) throw ConfigError(kComponent, "special_tokens: empty token");
    if (!detail::is_valid_utf8(s)) throw ConfigError(kComponent, "special_tokens: token is not valid UTF-8");
    add_token(s);
  }
  const size_t num_special = id_to_word.size();
  std::vector<char32_t> alphabet;
  for (int b = 0; b < 256; ++b) alphabet.push_back(detail::byte_level_char(static_cast<uint8_t>(b)));
  std::sort(alphabet.begin(), alphabet.end());
  for (char32_t c : alphabet) {
    std::string s;
    util::append_utf8(s, c);
    add_token(s);
  }
  std::array<int32_t, 256> byte_id{};
  for (int b = 0; b < 256; ++b) {
    std::string s;
    util::append_utf8(s, detail::byte_level_char(static_cast<uint8_t>(b)));
    byte_id[b] = word_to_id.at(s);
  }

  // 3. Words as id sequences (in byte order of their text, for determinism) and their counts.
  const StringMap<int64_t> word_counts = count_words(documents);
  std::vector<std::pair<std::string_view, int64_t>> sorted_words(word_counts.begin(), word_counts.end());
  std::sort(sorted_words.begin(), sorted_words.end());
  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> counts;
  words.reserve(sorted_words.size());
  for (const auto& [text, count] : sorted_words) {
    std::vector<int32_t> w;
    w.reserve(text.size());
    for (char c : text) w.push_back(byte_id[static_cast<uint8_t>(c)]);
    words.push_back(std::move(w));
    counts.push_back(count);
  }

  // 4. Pair counts and where each pair occurs.
  std::unordered_map<Pair, int64_t> pair_counts;
  std::unordered_map<Pair, std::vector<int32_t>> where;
  const auto note = [&](Pair p, int32_t word) {
    auto& list = where[p];
    if (list.empty() || list.back() != word) list.push_back(word);
  };
  for (size_t i = 0; i < words.size(); ++i) {
    for (size_t k = 0; k + 1 < words[i].size(); ++k) {
      const Pair p = make_pair(words[i][k], words[i][k + 1]);
      pair_counts[p] += counts[i];
      note(p, static_cast<int32_t>(i));
    }
  }
  std::priority_queue<Merge, std::vector<Merge>, MergeOrder> queue;
  const auto flush_where = [&] {
    for (auto& [pair, list] : where) {
      const int64_t count = pair_counts[pair];
      if (count > 0) {
        std::sort(list.begin(), list.end());
        list.erase(std::unique(list.begin(), list.end()), list.end());
        queue.push(Merge{count, pair, std::move(list)});
      }
    }
    where.clear();
  };
  flush_where();

  // 5. Merges.
  std::vector<std::pair<Pair, int32_t>> merges;
  std::vector<Change> changes;
  while (static_cast<int64_t>(word_to_id.size()) < options.vocab_size && !queue.empty()) {
    Merge top = queue.top();
    queue.pop();
    const int64_t current = pair_counts[top.pair];
    if (top.count != current) {
      top.count = current;
      queue.push(std::move(top));
      continue;
    }
    if (top.count < 1 || options.min_frequency > top.count) break;
    const int32_t a = left_of(top.pair), b = right_of(top.pair);
    const std::string token = id_to_word[a] + id_to_word[b];
    add_token(token);
    const int32_t new_id = word_to_id.at(token);
    merges.emplace_back(top.pair, new_id);
    for (int32_t w : top.words) {
      changes.clear();
      merge_word(words[w], a, b, new_id, changes);
      for (const Change& c : changes) {
        pair_counts[c.pair] += c.delta * counts[w];
        if (c.delta > 0) note(c.pair, w);
      }
    }
    flush_where();
  }

  // A pair merged twice keeps its later rank (Hugging Face collects the merges into a map, then sorts by rank).
  std::unordered_map<Pair, size_t> last_rank;
  for (size_t i = 0; i < merges.size(); ++i) last_rank[merges[i].first] = i;
  std::vector<std::pair<Pair, int32_t>> unique_merges;
  for (size_t i = 0; i < merges.size(); ++i) {
    if (last_rank[merges[i].first] == i) unique_merges.push_back(merges[i]);
  }
  return Tokenizer::from_json(tokenizer_json(id_to_word, num_special, unique_merges), "(trained tokenizer)");
}

namespace detail {

std::string bpe_tokenizer_json(const std::vector<AddedToken>& added,
                               const std::vector<std::pair<std::string, int64_t>>& vocab,
                               const std::vector<std::pair<std::string, std::string>>& merges,
                               const nlohmann::json& pre_tokenizer, const nlohmann::json& post_processor,
                               const nlohmann::json& decoder, bool ignore_merges) {
  // nlohmann::json (a map), not ordered_json, whose linear key lookups are quadratic over a vocabulary.
  using Json = nlohmann::json;
  Json added_tokens = Json::array();
  for (const AddedToken& a : added) {
    added_tokens.push_back({{"id", a.id},
                            {"content", a.content},
                            {"single_word", a.single_word},
                            {"lstrip", a.lstrip},
                            {"rstrip", a.rstrip},
                            {"normalized", a.normalized},
                            {"special", a.special}});
  }
  Json vocab_json = Json::object();
  for (const auto& [token, id] : vocab) vocab_json[token] = id;
  Json merge_list = Json::array();
  for (const auto& [left, right] : merges) merge_list.push_back(Json::array({left, right}));
  const Json doc = {{"version", "1.0"},
                    {"truncation", nullptr},
                    {"padding", nullptr},
                    {"added_tokens", std::move(added_tokens)},
                    {"normalizer", nullptr},
                    {"pre_tokenizer", pre_tokenizer},
                    {"post_processor", post_processor},
                    {"decoder", decoder},
                    {"model",
                     {{"type", "BPE"},
                      {"dropout", nullptr},
                      {"unk_token", nullptr},
                      {"continuing_subword_prefix", nullptr},
                      {"end_of_word_suffix", nullptr},
                      {"fuse_unk", false},
                      {"byte_fallback", false},
                      {"ignore_merges", ignore_merges},
                      {"vocab", std::move(vocab_json)},
                      {"merges", std::move(merge_list)}}}};
  return doc.dump();
}

}  // namespace detail

}  // namespace tessera::data
