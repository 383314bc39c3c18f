// BPE tokenizers in Hugging Face's tokenizer.json format, with the same ids as Hugging Face `tokenizers` for the same
// text: byte-level BPE (GPT-2, GPT-NeoX, Llama-3 style) and SentencePiece-style BPE (Llama-2, Mistral: characters,
// `▁` for spaces, <0xXX> byte fallback); and Tessera's own byte-level BPE trainer.
//
// Supported tokenizer.json subset (anything else is an error naming the file and the JSON key):
//   model            BPE: vocab, merges ("a b" strings or ["a", "b"] pairs), ignore_merges, unk_token, fuse_unk,
//                    byte_fallback (not with ByteLevel); dropout null; continuing_subword_prefix and
//                    end_of_word_suffix null or ""
//   normalizer       null, NFC, Prepend, Replace (String or Regex pattern), or a Sequence of those
//   pre_tokenizer    null, ByteLevel (add_prefix_space, use_regex), Split (Regex or String pattern, any behavior,
//                    invert), Metaspace (replacement, prepend_scheme always/first/never or the older
//                    add_prefix_space, split), or a Sequence of those; a ByteLevel must come last and makes the BPE
//                    run on bytes, otherwise it runs on characters
//   post_processor   null, ByteLevel, TemplateProcessing (the single-sequence template), or a Sequence of those
//   decoder          null, ByteLevel, Replace (String pattern), ByteFallback, Fuse, Strip, Metaspace, or a Sequence
//   added_tokens     special / lstrip / rstrip / single_word / normalized, split out before pre-tokenization
//
// tiktoken encodings load from their ranks files (from_tiktoken), and so does a folder of LLM Foundry's
// TiktokenTokenizerWrapper (DBRX's: tokenizer_config.json names the class and the encoding, no tokenizer.json).
//
// Loaded from a folder (as transformers' AutoTokenizer loads one), tokenizer_config.json and special_tokens_map.json
// there are honoured too: bos/eos/pad/unk tokens, and for tokenizer_class LlamaTokenizer(Fast) the add_bos_token
// (default true) / add_eos_token (default false) template that transformers builds. A tokenizer.json file alone loads
// as `tokenizers.Tokenizer.from_file` does.
//
// Invalid UTF-8 in the text given to encode() is replaced first, each maximal invalid subsequence by U+FFFD exactly as
// Python's bytes.decode("utf-8", errors="replace") does, so the ids equal Hugging Face's for the replaced text.
// decode() replaces invalid UTF-8 in its output the same way (as Hugging Face's ByteLevel decoder does).
//
// A Tokenizer is immutable after construction; copies share their state. encode/decode are thread-safe (each thread
// keeps its own word cache).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::data {

namespace detail {
struct TokenizerImpl;
}

// A tiktoken encoding (tiktoken_ext/openai_public.py): its pre-tokenizer pattern, special tokens and their ids, and
// where tiktoken fetches its ranks file (it caches it named sha1(url)) with the sha256 it expects.
struct TiktokenEncoding {
  std::string name;
  std::string pattern;
  std::vector<std::pair<std::string, int32_t>> special_tokens;
  std::string ranks_url;
  std::string ranks_sha256;  // empty: not checked
};
// The encodings tiktoken ships that Tessera reads: r50k_base, p50k_base, p50k_edit, cl100k_base, o200k_base,
// o200k_harmony (not gpt2, stored in GPT-2's vocab.bpe and encoder.json); nullopt for another name.
std::optional<TiktokenEncoding> tiktoken_encoding(std::string_view name);
// tiktoken.encoding_name_for_model: gpt-4 -> cl100k_base, gpt-4o -> o200k_base, ...; nullopt for an unknown model.
std::optional<std::string> tiktoken_encoding_for_model(std::string_view model);

class Tokenizer {
 public:
  // Loads a Hugging Face tokenizer.json, or a folder with one (and tokenizer_config.json, special_tokens_map.json
  // when present). Errors (tessera::Error, component
  // "tokenizer") name the file and the JSON path of the bad key: malformed JSON, unsupported model / pre_tokenizer /
  // normalizer / decoder / post_processor type, a merge naming an unknown token, duplicate ids, and so on.
  static Tokenizer from_file(const std::filesystem::path& path);
  // The same from JSON text; `source_name` stands for the file in error messages.
  static Tokenizer from_json(std::string_view json, const std::string& source_name);
  // A tiktoken encoding from a ranks file (.tiktoken: one base64 token and its rank per line), encoding as tiktoken's
  // Encoding(pattern, ranks, special_tokens).encode(text, allowed_special="all") and decoding as its
  // decode(errors="replace"). Its to_json() is the tokenizer.json transformers' TikTokenConverter builds. Errors name
  // the file and line (bad base64, a repeated token or rank, a rank past 2^24, a byte without a rank).
  static Tokenizer from_tiktoken(const std::filesystem::path& ranks_file, const TiktokenEncoding& encoding);
  // The same over `encoding`'s ranks file in tiktoken's cache ($TIKTOKEN_CACHE_DIR, else $DATA_GYM_CACHE_DIR, else the
  // temporary folder's data-gym-cache; named sha1(ranks_url)), read once and its sha256 checked as tiktoken checks it.
  // Tessera downloads nothing: errors name the path, the URL and how to fill the cache.
  static Tokenizer from_tiktoken(const TiktokenEncoding& encoding);

  // Hugging Face `tokenizer.encode(text, add_special_tokens=...).ids`. add_special_tokens applies the post_processor
  // (the TemplateProcessing single-sequence template, e.g. a BOS; ByteLevel adds nothing).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Hugging Face `tokenizer.decode(ids, skip_special_tokens=...)`. Unknown ids are skipped, as there.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  // Number of distinct tokens including added tokens (Hugging Face get_vocab_size(with_added_tokens=True)).
  int64_t vocab_size() const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The special tokens tokenizer_config.json / special_tokens_map.json name (a tokenizer loaded from a folder), and
  // their ids; unset when not named.
  std::optional<std::string> bos_token() const;
  std::optional<std::string> eos_token() const;
  std::optional<std::string> pad_token() const;
  std::optional<std::string> unk_token() const;
  const std::vector<std::string>& additional_special_tokens() const;
  // tokenizer_config.json's chat_template (its "default" when it is a list of named templates), or the folder's
  // chat_template.jinja, which wins as in transformers; unset when there is none. padding_side: "right" (default)
  // or "left".
  const std::optional<std::string>& chat_template() const;
  const std::string& padding_side() const;
  std::optional<int32_t> bos_token_id() const;
  std::optional<int32_t> eos_token_id() const;
  std::optional<int32_t> pad_token_id() const;
  std::optional<std::string> id_to_token(int32_t id) const;

  // The pieces the normalizer, added-token split and pre-tokenizer produce, as raw UTF-8 (before the byte-level
  // mapping); added tokens appear as their content. Used to check the pre-tokenizer against Hugging Face's.
  std::vector<std::string> pre_tokenize(std::string_view text) const;

  // HF-loadable tokenizer.json (the document this tokenizer was loaded from, or the one the trainer built).
  std::string to_json() const;
  // Writes to_json() to `path` atomically (temporary file, fsync, rename).
  void save(const std::filesystem::path& path) const;

 private:
  explicit Tokenizer(std::shared_ptr<const detail::TokenizerImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const detail::TokenizerImpl> impl_;
};

struct BpeTrainerOptions {
  int64_t vocab_size = 8192;  // final vocabulary size including special tokens and the 256 byte tokens
  int64_t min_frequency = 2;  // a pair seen fewer times than this is never merged
  std::vector<std::string> special_tokens = {"<|endoftext|>"};  // added tokens, ids 0.. in this order
};

// Tessera's own byte-level BPE trainer (GPT-2 style: ByteLevel pre-tokenizer with the GPT-2 split regex,
// add_prefix_space=false, 256-byte initial alphabet, ByteLevel decoder and post-processor, special tokens as added
// tokens first in the vocab). It follows Hugging Face's BpeTrainer step for step (pair counts, ties broken towards
// the smaller pair of ids), so for the same documents and options it produces the same vocab and merges as
// `ByteLevelBPETokenizer().train_from_iterator(...)`. Single-threaded; deterministic.
Tokenizer train_bpe_tokenizer(const std::vector<std::string>& documents, const BpeTrainerOptions& options);

// Replaces each maximal invalid UTF-8 subsequence of `text` by U+FFFD (Python's errors="replace" policy).
std::string sanitize_utf8(std::string_view text);

}  // namespace tessera::data
