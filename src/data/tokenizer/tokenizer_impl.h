// Internal state of a loaded tokenizer (shared by tokenizer.cpp, json_load.cpp and trainer.cpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "bpe.h"
#include "regex.h"

namespace tessera::data::detail {

// Larger than any real vocabulary (the largest are ~256k); bounds the dense id tables a hostile file can request
// (tokenizer.json ids, tiktoken ranks and special-token ids alike).
constexpr int64_t kMaxTokenId = (int64_t{1} << 22) - 1;

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
  enum class Kind { kByteLevel, kSplit, kMetaspace } kind;
  bool add_prefix_space = false;       // ByteLevel
  bool use_regex = true;               // ByteLevel
  std::shared_ptr<const Regex> regex;  // Split (null: an empty String pattern, which never matches); Metaspace: the
                                       // replacement character, split on when `split`
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;  // Metaspace
  std::string replacement;                                                    // Metaspace, UTF-8 of one character
  bool split = true;                                                          // Metaspace
};

// One normalizer of a Sequence: NFC, Prepend (a non-empty text gets `content` in front), Replace (every match of
// `pattern`, a literal or a regex, becomes `content`).
struct Normalizer {
  enum class Kind { kNfc, kPrepend, kReplace } kind;
  std::string content;
  std::shared_ptr<const Regex> pattern;
};

// One decoder of a Sequence, run over the list of token strings as Hugging Face's decode_chain does.
struct DecodeStep {
  enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind;
  std::string pattern, content;  // Replace: literal pattern -> content; Strip: the character (UTF-8)
  size_t start = 0, stop = 0;    // Strip: at most this many leading / trailing `content` characters
  bool prepend = true;           // Metaspace: prepend_scheme is not never (the first token loses its replacements)
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
  std::vector<Normalizer> normalizers;
  std::vector<PreTokenizer> pre_tokenizers;
  // The post-processor's single-sequence template: ids before and after the sequence (empty without one).
  std::vector<int32_t> template_prefix, template_suffix;
  std::vector<DecodeStep> decoders;
  // From tokenizer_config.json / special_tokens_map.json (a tokenizer loaded from a folder); unset otherwise.
  std::optional<std::string> bos_token, eos_token, pad_token, unk_token;
  std::vector<std::string> additional_special_tokens;
  std::optional<std::string> chat_template;  // chat_template.jinja, else tokenizer_config.json's (its "default")
  std::string padding_side = "right";
  bool byte_level_decoder = false;  // decoders is exactly [ByteLevel]: id_bytes hold each token's raw bytes
  // Tokens a transformers slow tokenizer decodes as words of their own (its legacy_added_tokens): decode() joins them
  // and the text between them with single spaces (spaces_between_special_tokens). Empty for tokenizer.json files.
  std::vector<uint8_t> id_spaced;

  // Per id (dense up to the largest id): the token string, whether it exists, is special, and its decoded bytes.
  std::vector<std::string> id_token;
  std::vector<uint8_t> id_present, id_special;
  std::vector<std::string> id_bytes;  // ByteLevel decoder: raw bytes if every char is a byte-level char, else UTF-8
  int64_t vocab_size = 0;

  // Fills the id tables, matchers and vocab size after model / added / decoder are set.
  void finish();
  // The normalizers applied in order (the text unchanged without any).
  std::string normalize(std::string_view text) const;
  void pre_tokenize(std::string_view text, std::vector<std::string>* pieces, std::vector<int32_t>* ids) const;
  // `first`: the piece starts at offset 0 of the original text (Metaspace's prepend_scheme "first").
  void encode_piece(std::string_view piece, bool first, std::vector<std::string>* pieces,
                    std::vector<int32_t>* ids) const;
  // Hugging Face's decoder chain over token strings, joined (no decoder: joined with spaces).
  std::string decode_tokens(std::vector<std::string> tokens) const;
};

// A Hugging Face tokenizer.json of a BPE model over byte-level tokens (Tessera's trainer's, a tiktoken encoding's):
// `added` tokens (their ids and flags), `vocab` (token -> id), `merges` (pairs of tokens) and ignore_merges, with the
// given pre-tokenizer, post-processor and decoder.
std::string bpe_tokenizer_json(const std::vector<AddedToken>& added,
                               const std::vector<std::pair<std::string, int64_t>>& vocab,
                               const std::vector<std::pair<std::string, std::string>>& merges,
                               const nlohmann::json& pre_tokenizer, const nlohmann::json& post_processor,
                               const nlohmann::json& decoder, bool ignore_merges);

// Parses a tokenizer.json document; errors name `source` and the JSON path.
std::shared_ptr<TokenizerImpl> load_tokenizer_json(std::string_view json, const std::string& source);

// Applies what transformers' AutoTokenizer takes from tokenizer_config.json and special_tokens_map.json in `folder`
// (either may be missing): the bos/eos/pad/unk tokens, and for tokenizer_class LlamaTokenizer(Fast) the
// add_bos_token / add_eos_token template. Errors name the file and key.
void load_tokenizer_config(const std::filesystem::path& folder, TokenizerImpl& t);

// A folder whose tokenizer_config.json (`config`, read from `source`) names LLM Foundry's TiktokenTokenizerWrapper:
// its tiktoken encoding (model_name or encoding_name) from tiktoken's cache, added_tokens_decoder's tokens, the
// wrapper's defaults (bos, eos and unk <|endoftext|>, its ChatML template) and add_bos_token / add_eos_token
// (tiktoken.cpp). Errors name the file and key.
std::shared_ptr<TokenizerImpl> load_tiktoken_wrapper(const std::filesystem::path& folder,
                                                     const nlohmann::ordered_json& config, const std::string& source);

}  // namespace tessera::data::detail
