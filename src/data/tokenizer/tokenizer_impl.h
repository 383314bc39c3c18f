// Internal state of a loaded tokenizer (shared by tokenizer.cpp, json_load.cpp and trainer.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bpe.h"
#include "regex.h"

namespace tessera::data::detail {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = true;
};

// Leftmost-longest, non-overlapping matching of a set of strings (Hugging Face uses aho-corasick with
// MatchKind::LeftmostLongest); a handful to a few hundred patterns, so a first-byte table and memcmp suffice.
class AddedMatcher {
 public:
  struct Match {
    size_t begin, end;
    int token;  // index into TokenizerImpl::added
  };
  void add(std::string pattern, int token);
  bool empty() const { return patterns_.empty(); }
  // The first match starting at or after `from`.
  std::optional<Match> find(std::string_view s, size_t from) const;

 private:
  std::vector<std::pair<std::string, int>> patterns_;
  std::vector<int> buckets_[256];  // pattern indices by first byte, longest first
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokenizer {
  enum class Kind { kByteLevel, kSplit } kind;
  bool add_prefix_space = false;       // ByteLevel
  bool use_regex = true;               // ByteLevel
  std::shared_ptr<const Regex> regex;  // Split (null: an empty String pattern, which never matches)
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
};

struct TokenizerImpl {
  std::string source;  // file name for messages
  std::string json;    // the tokenizer.json text (to_json)
  uint64_t uid = 0;    // identifies this instance's entries in the per-thread word cache

  BpeModel model;
  std::vector<AddedToken> added;    // in tokenizer.json order
  StringMap<int32_t> added_ids;     // content -> id
  AddedMatcher raw_matcher;         // tokens with normalized=false, matched on the raw text
  AddedMatcher normalized_matcher;  // tokens with normalized=true, matched on the normalized text
  bool nfc = false;
  std::vector<PreTokenizer> pre_tokenizers;
  // The post-processor's single-sequence template: ids before and after the sequence (empty without one).
  std::vector<int32_t> template_prefix, template_suffix;
  bool byte_level_decoder = false;

  // Per id (dense up to the largest id): the token string, whether it exists, is special, and its decoded bytes.
  std::vector<std::string> id_token;
  std::vector<uint8_t> id_present, id_special;
  std::vector<std::string> id_bytes;  // ByteLevel decoder: raw bytes if every char is a byte-level char, else UTF-8
  int64_t vocab_size = 0;

  // Fills the id tables, matchers and vocab size after model / added / decoder are set.
  void finish();
  void pre_tokenize(std::string_view text, std::vector<std::string>* pieces, std::vector<int32_t>* ids) const;
  void encode_piece(std::string_view piece, std::vector<std::string>* pieces, std::vector<int32_t>* ids) const;
};

// Parses a tokenizer.json document; errors name `source` and the JSON path.
std::shared_ptr<TokenizerImpl> load_tokenizer_json(std::string_view json, const std::string& source);

}  // namespace tessera::data::detail
