// Tokenizer: Hugging Face's encode pipeline (added tokens -> normalizer -> added tokens -> pre-tokenizer -> BPE ->
// post-processor) and decode, over the state json_load.cpp builds.
#include "tessera/data/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include "tessera/util/error.h"
#include "tessera/util/file_io.h"
#include "tokenizer_impl.h"
#include "unicode.h"

namespace tessera::data {
namespace detail {
namespace {

constexpr const char* kTokenizerComponent = "tokenizer";
// Words longer than this (bytes) are not cached: rare, and they would crowd the cache.
constexpr size_t kMaxCachedWord = 256;
// The per-thread word cache is cleared when it reaches this many words (bounds its memory to some tens of MB).
constexpr size_t kMaxCachedWords = 500000;

struct WordCache {
  uint64_t owner = 0;
  StringMap<std::vector<int32_t>> words;
};

WordCache& word_cache(uint64_t owner) {
  thread_local WordCache cache;
  if (cache.owner != owner || cache.words.size() >= kMaxCachedWords) {
    cache.words.clear();
    cache.owner = owner;
  }
  return cache;
}

struct Span {
  size_t begin, end;
  bool origin = false;  // starts at offset 0 of the original text (Metaspace's prepend_scheme "first")
};

// Hugging Face's NormalizedString::split over the regex's matches of arena[span].
void split_span(const Regex* regex, SplitBehavior behavior, bool invert, const std::string& arena, Span span,
                std::vector<Span>& out) {
  thread_local std::vector<std::pair<size_t, size_t>> matches;
  thread_local std::vector<std::pair<Span, bool>> parts;  // (range, is_match)
  matches.clear();
  parts.clear();
  const std::string_view s(arena.data() + span.begin, span.end - span.begin);
  if (regex != nullptr) regex->find_all(s, matches);
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    if (prev != b) parts.push_back({{prev, b}, false});
    parts.push_back({{b, e}, true});
    prev = e;
  }
  if (prev != s.size()) parts.push_back({{prev, s.size()}, false});
  if (invert) {
    for (auto& p : parts) p.second = !p.second;
  }
  const size_t first_out = out.size();
  const auto emit = [&](Span r) {
    out.push_back({span.begin + r.begin, span.begin + r.end, span.origin && r.begin == 0});
  };
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const auto& [r, m] : parts) emit(r);
      break;
    case SplitBehavior::kRemoved:
      for (const auto& [r, m] : parts) {
        if (!m) emit(r);
      }
      break;
    case SplitBehavior::kContiguous:
      for (const auto& [r, m] : parts) {
        if (m == previous_match && out.size() > first_out) {
          out.back().end = span.begin + r.end;
        } else {
          emit(r);
        }
        previous_match = m;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const auto& [r, m] : parts) {
        if (m && !previous_match && out.size() > first_out) {
          out.back().end = span.begin + r.end;
        } else {
          emit(r);
        }
        previous_match = m;
      }
      break;
    case SplitBehavior::kMergedWithNext: {
      // Hugging Face folds from the right: a match joins the piece after it.
      std::vector<Span> rev;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        const auto& [r, m] = *it;
        if (m && !previous_match && !rev.empty()) {
          rev.back().begin = r.begin;
        } else {
          rev.push_back(r);
        }
        previous_match = m;
      }
      for (auto it = rev.rbegin(); it != rev.rend(); ++it) emit(*it);
      break;
    }
  }
  // Empty pieces are dropped (PreTokenizedString::split keeps only non-empty splits).
  out.erase(std::remove_if(out.begin() + static_cast<std::ptrdiff_t>(first_out), out.end(),
                           [](const Span& x) { return x.begin == x.end; }),
            out.end());
}

// Every non-overlapping match of `pattern` in `s` (leftmost first) replaced by `content`.
std::string replace_all(const Regex& pattern, std::string_view s, std::string_view content) {
  thread_local std::vector<std::pair<size_t, size_t>> matches;
  matches.clear();
  pattern.find_all(s, matches);
  if (matches.empty()) return std::string(s);
  std::string out;
  out.reserve(s.size() + matches.size() * content.size());
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    out.append(s.substr(prev, b - prev));
    out.append(content);
    prev = e;
  }
  out.append(s.substr(prev));
  return out;
}

void replace_literal(std::string& s, std::string_view pattern, std::string_view content) {
  if (pattern.empty()) return;
  std::string out;
  size_t prev = 0;
  for (size_t at = s.find(pattern); at != std::string::npos; at = s.find(pattern, prev)) {
    out.append(s, prev, at - prev);
    out.append(content);
    prev = at + pattern.size();
  }
  if (prev == 0) return;
  out.append(s, prev, std::string::npos);
  s = std::move(out);
}

size_t utf8_length(uint8_t lead) {
  return lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
}

// "<0xXX>" (Rust's u8::from_str_radix over the two characters, which also takes "+X") -> the byte.
std::optional<uint8_t> fallback_byte(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return std::nullopt;
  const auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int hi = hex(token[3]), lo = hex(token[4]);
  if (token[3] == '+' && lo >= 0) return static_cast<uint8_t>(lo);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<uint8_t>(hi * 16 + lo);
}

// The UTF-8 code point before / at a position of valid UTF-8, or 0 at the edges.
bool word_before(std::string_view s, size_t pos) {
  if (pos == 0) return false;
  size_t b;
  return is_word_char(prev_code_point(s, pos, b));
}
bool word_after(std::string_view s, size_t pos) {
  if (pos >= s.size()) return false;
  return is_word_char(next_code_point(s, pos));
}

}  // namespace

void AddedMatcher::add(std::string pattern, int token) {
  if (pattern.empty()) return;
  patterns_.emplace_back(std::move(pattern), token);
  auto& bucket = buckets_[static_cast<uint8_t>(patterns_.back().first[0])];
  bucket.push_back(static_cast<int>(patterns_.size()) - 1);
  std::stable_sort(bucket.begin(), bucket.end(),
                   [&](int a, int b) { return patterns_[a].first.size() > patterns_[b].first.size(); });
}

std::optional<AddedMatcher::Match> AddedMatcher::find(std::string_view s, size_t from) const {
  for (size_t i = from; i < s.size(); ++i) {
    const auto& bucket = buckets_[static_cast<uint8_t>(s[i])];
    for (int k : bucket) {
      const std::string& p = patterns_[k].first;
      if (p.size() <= s.size() - i && std::memcmp(p.data(), s.data() + i, p.size()) == 0)
        return Match{i, i + p.size(), patterns_[k].second};
    }
  }
  return std::nullopt;
}

void TokenizerImpl::finish() {
  int64_t max_id = -1;
  for (const auto& [token, id] : model.vocab) max_id = std::max<int64_t>(max_id, id);
  for (const AddedToken& a : added) max_id = std::max<int64_t>(max_id, a.id);
  const auto n = static_cast<size_t>(max_id + 1);
  id_token.assign(n, {});
  id_present.assign(n, 0);
  id_special.assign(n, 0);
  id_bytes.assign(n, {});
  for (const auto& [token, id] : model.vocab) id_token[id] = token, id_present[id] = 1;
  vocab_size = static_cast<int64_t>(model.vocab.size());
  for (size_t i = 0; i < added.size(); ++i) {
    const AddedToken& a = added[i];
    if (!model.vocab.count(a.content)) ++vocab_size;
    id_token[a.id] = a.content;
    id_present[a.id] = 1;
  }
  // Special-ness goes by content, as Hugging Face's special_tokens_set.
  for (const AddedToken& a : added) {
    if (a.special) id_special[a.id] = 1;
  }
  for (size_t id = 0; id < n; ++id) {
    if (!id_present[id]) continue;
    if (!byte_level_decoder || !from_byte_level(id_token[id], id_bytes[id])) id_bytes[id] = id_token[id];
  }
  for (size_t i = 0; i < added.size(); ++i) {
    if (added[i].normalized) {
      normalized_matcher.add(normalize(added[i].content), static_cast<int>(i));
    } else {
      raw_matcher.add(added[i].content, static_cast<int>(i));
    }
  }
}

std::string TokenizerImpl::normalize(std::string_view text) const {
  std::string s(text);
  for (const Normalizer& n : normalizers) {
    switch (n.kind) {
      case Normalizer::Kind::kNfc:
        s = detail::nfc(s);
        break;
      case Normalizer::Kind::kPrepend:
        if (!s.empty()) s.insert(0, n.content);
        break;
      case Normalizer::Kind::kReplace:
        s = replace_all(*n.pattern, s, n.content);
        break;
    }
  }
  return s;
}

// Splits `text` around the added tokens `matcher` finds (Hugging Face's AddedVocabulary::find_matches, including
// single_word / lstrip / rstrip) and hands each piece and its offset to `on_text` / each token id to `on_token`.
template <typename OnText, typename OnToken>
void split_added(const TokenizerImpl& t, const AddedMatcher& matcher, std::string_view s, OnText on_text,
                 OnToken on_token) {
  if (matcher.empty()) {
    if (!s.empty()) on_text(s, size_t{0});
    return;
  }
  size_t start_offset = 0, from = 0;
  while (auto m = matcher.find(s, from)) {
    from = m->end;
    const AddedToken& a = t.added[m->token];
    size_t start = m->begin, stop = m->end;
    if (a.single_word && (word_before(s, start) || word_after(s, stop))) continue;
    if (a.lstrip) {
      size_t p = start;
      while (p > 0) {
        size_t b;
        if (!is_white_space(prev_code_point(s, p, b))) break;
        p = b;
      }
      start = std::max(p, start_offset);
    }
    if (a.rstrip) {
      while (stop < s.size()) {
        size_t q = stop;
        if (!is_white_space(next_code_point(s, q))) break;
        stop = q;
      }
    }
    if (start_offset < start) on_text(s.substr(start_offset, start - start_offset), start_offset);
    on_token(a.id);
    start_offset = stop;
  }
  if (start_offset < s.size()) on_text(s.substr(start_offset), start_offset);
}

void TokenizerImpl::encode_piece(std::string_view piece, bool first, std::vector<std::string>* pieces,
                                 std::vector<int32_t>* ids) const {
  thread_local std::string arena;
  thread_local std::vector<Span> spans, next;
  arena.assign(piece);
  spans.assign(1, Span{0, arena.size(), first});
  for (const PreTokenizer& pt : pre_tokenizers) {
    next.clear();
    for (Span sp : spans) {
      if (pt.kind == PreTokenizer::Kind::kByteLevel) {
        if (pt.add_prefix_space && arena[sp.begin] != ' ') {
          const size_t len = sp.end - sp.begin;
          arena.reserve(arena.size() + len + 1);
          const size_t b = arena.size();
          arena += ' ';
          arena.append(arena.data() + sp.begin, len);
          sp = {b, b + len + 1, sp.origin};
        }
        if (!pt.use_regex) {
          next.push_back(sp);
          continue;
        }
        split_span(&Regex::gpt2(), SplitBehavior::kIsolated, false, arena, sp, next);
      } else if (pt.kind == PreTokenizer::Kind::kMetaspace) {
        // Spaces become the replacement, which is prepended per the scheme; the result is split before each
        // replacement (MergedWithNext) when `split`. Rewritten at the end of the arena.
        std::string text(arena, sp.begin, sp.end - sp.begin);
        replace_literal(text, " ", pt.replacement);
        const bool starts = text.compare(0, pt.replacement.size(), pt.replacement) == 0;
        if (!starts && (pt.prepend == PreTokenizer::Prepend::kAlways ||
                        (pt.prepend == PreTokenizer::Prepend::kFirst && sp.origin)))
          text.insert(0, pt.replacement);
        const size_t b = arena.size();
        arena += text;
        const Span rewritten{b, arena.size(), sp.origin};
        if (pt.split) {
          split_span(pt.regex.get(), SplitBehavior::kMergedWithNext, false, arena, rewritten, next);
        } else {
          next.push_back(rewritten);
        }
      } else {
        split_span(pt.regex.get(), pt.behavior, pt.invert, arena, sp, next);
      }
    }
    std::swap(spans, next);
  }
  if (pieces != nullptr) {
    for (Span sp : spans) pieces->emplace_back(arena, sp.begin, sp.end - sp.begin);
    return;
  }
  WordCache& cache = word_cache(uid);
  for (Span sp : spans) {
    const std::string_view word(arena.data() + sp.begin, sp.end - sp.begin);
    if (word.size() > kMaxCachedWord) {
      model.encode_word(word, *ids);
      continue;
    }
    if (auto it = cache.words.find(word); it != cache.words.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      continue;
    }
    const size_t before = ids->size();
    model.encode_word(word, *ids);
    cache.words.emplace(std::string(word),
                        std::vector<int32_t>(ids->begin() + static_cast<std::ptrdiff_t>(before), ids->end()));
  }
}

void TokenizerImpl::pre_tokenize(std::string_view text, std::vector<std::string>* pieces,
                                 std::vector<int32_t>* ids) const {
  std::string repaired;
  if (!is_valid_utf8(text)) {
    repaired = sanitize_utf8(text);
    text = repaired;
  }
  const auto on_token = [&](int32_t id) {
    if (ids != nullptr) ids->push_back(id);
    if (pieces != nullptr) pieces->push_back(id_token[id]);
  };
  split_added(
      *this, raw_matcher, text,
      [&](std::string_view raw, size_t raw_offset) {
        const std::string normalized = normalizers.empty() ? std::string() : normalize(raw);
        const std::string_view n = normalizers.empty() ? raw : std::string_view(normalized);
        split_added(
            *this, normalized_matcher, n,
            [&](std::string_view piece, size_t offset) {
              encode_piece(piece, raw_offset == 0 && offset == 0, pieces, ids);
            },
            on_token);
      },
      on_token);
}

std::string TokenizerImpl::decode_tokens(std::vector<std::string> tokens) const {
  std::string joined;
  if (decoders.empty()) {  // no decoder: Hugging Face joins the tokens with spaces
    for (size_t i = 0; i < tokens.size(); ++i) joined += (i ? " " : "") + tokens[i];
    return joined;
  }
  for (const DecodeStep& d : decoders) {
    switch (d.kind) {
      case DecodeStep::Kind::kByteLevel: {
        std::string bytes, all;
        for (const std::string& t : tokens) all += from_byte_level(t, bytes) ? bytes : t;
        tokens.assign(1, sanitize_utf8(all));
        break;
      }
      case DecodeStep::Kind::kReplace:
        for (std::string& t : tokens) replace_literal(t, d.pattern, d.content);
        break;
      case DecodeStep::Kind::kByteFallback: {
        std::vector<std::string> out;
        std::string pending;
        const auto flush = [&] {
          if (pending.empty()) return;
          if (is_valid_utf8(pending)) {
            out.push_back(pending);
          } else {
            for (size_t i = 0; i < pending.size(); ++i) out.emplace_back("\xEF\xBF\xBD");  // U+FFFD per byte
          }
          pending.clear();
        };
        for (std::string& t : tokens) {
          if (auto b = fallback_byte(t)) {
            pending += static_cast<char>(*b);
          } else {
            flush();
            out.push_back(std::move(t));
          }
        }
        flush();
        tokens = std::move(out);
        break;
      }
      case DecodeStep::Kind::kFuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens.clear();
        tokens.push_back(std::move(all));
        break;
      }
      case DecodeStep::Kind::kStrip:
        for (std::string& t : tokens) {
          size_t begin = 0, end = t.size();
          for (size_t k = 0; k < d.start && t.compare(begin, d.content.size(), d.content) == 0; ++k)
            begin += d.content.size();
          for (size_t k = 0; k < d.stop && end >= begin + d.content.size() &&
                             t.compare(end - d.content.size(), d.content.size(), d.content) == 0;
               ++k)
            end -= d.content.size();
          t = t.substr(begin, end - begin);
        }
        break;
      case DecodeStep::Kind::kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          std::string out;
          const std::string& t = tokens[i];
          for (size_t k = 0; k < t.size();) {
            const size_t len = std::min(utf8_length(static_cast<uint8_t>(t[k])), t.size() - k);
            if (t.compare(k, len, d.pattern) == 0) {
              if (i != 0 || !d.prepend) out += ' ';  // the first token's replacements are dropped
            } else {
              out.append(t, k, len);
            }
            k += len;
          }
          tokens[i] = std::move(out);
        }
        break;
    }
  }
  for (const std::string& t : tokens) joined += t;
  return joined;
}

}  // namespace detail

namespace {
constexpr const char* kTokenizerComponent = "tokenizer";
}

Tokenizer Tokenizer::from_file(const std::filesystem::path& path) {
  std::filesystem::path file = path;
  std::error_code ec;
  const bool folder = std::filesystem::is_directory(path, ec);
  if (folder) file = path / "tokenizer.json";
  std::error_code missing;
  if (folder && !std::filesystem::exists(file, missing)) {
    // LLM Foundry's tiktoken wrapper (DBRX's folders) has no tokenizer.json: tokenizer_config.json names its class.
    const std::filesystem::path config_file = path / "tokenizer_config.json";
    if (std::filesystem::is_regular_file(config_file, missing)) {
      nlohmann::ordered_json config;
      try {
        config = nlohmann::ordered_json::parse(util::read_file(config_file.string(), kTokenizerComponent));
      } catch (const nlohmann::json::exception& e) {
        throw Error(kTokenizerComponent, fmt::format("{}: malformed JSON: {}", config_file.string(), e.what()));
      }
      const std::string cls =
          config.is_object() && config.contains("tokenizer_class") && config["tokenizer_class"].is_string()
              ? config["tokenizer_class"].get<std::string>()
              : "";
      if (cls == "TiktokenTokenizerWrapper") {
        return Tokenizer(detail::load_tiktoken_wrapper(path, config, config_file.string()));
      }
      throw Error(kTokenizerComponent,
                  fmt::format("{}: no tokenizer.json beside it, and tokenizer_class \"{}\" is not one Tessera reads "
                              "without one (LLM Foundry's TiktokenTokenizerWrapper); Tessera runs no code from a "
                              "tokenizer folder",
                              config_file.string(), cls));
    }
  }
  auto impl = detail::load_tokenizer_json(util::read_file(file.string(), kTokenizerComponent), file.string());
  if (folder) detail::load_tokenizer_config(path, *impl);
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_json(std::string_view json, const std::string& source_name) {
  return Tokenizer(detail::load_tokenizer_json(json, source_name));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids.insert(ids.end(), impl_->template_prefix.begin(), impl_->template_prefix.end());
  impl_->pre_tokenize(text, nullptr, &ids);
  if (add_special_tokens) ids.insert(ids.end(), impl_->template_suffix.begin(), impl_->template_suffix.end());
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const detail::TokenizerImpl& t = *impl_;
  const auto wanted = [&](int32_t id) {
    return id >= 0 && static_cast<size_t>(id) < t.id_present.size() && t.id_present[id] &&
           !(skip_special_tokens && t.id_special[id]);
  };
  if (!t.id_spaced.empty()) {  // a slow tokenizer's _decode: spaced words between runs of byte-level tokens
    std::vector<std::string> words;
    std::string run;
    for (int32_t id : ids) {
      if (!wanted(id)) continue;
      if (static_cast<size_t>(id) < t.id_spaced.size() && t.id_spaced[id]) {
        if (std::string text = sanitize_utf8(run); !text.empty()) words.push_back(std::move(text));
        run.clear();
        words.push_back(t.id_token[id]);
      } else {
        run += t.id_bytes[id];
      }
    }
    if (!run.empty() || words.empty()) words.push_back(sanitize_utf8(run));
    std::string out;
    for (size_t i = 0; i < words.size(); ++i) out += (i ? " " : "") + words[i];
    return out;
  }
  if (t.byte_level_decoder) {  // the common case, without building the token list
    std::string out;
    for (int32_t id : ids) {
      if (wanted(id)) out += t.id_bytes[id];
    }
    return sanitize_utf8(out);
  }
  std::vector<std::string> tokens;
  for (int32_t id : ids) {
    if (wanted(id)) tokens.push_back(t.id_token[id]);
  }
  return t.decode_tokens(std::move(tokens));
}

int64_t Tokenizer::vocab_size() const {
  return impl_->vocab_size;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_ids.find(token); it != impl_->added_ids.end()) return it->second;
  if (auto it = impl_->model.vocab.find(token); it != impl_->model.vocab.end()) return it->second;
  return std::nullopt;
}

std::optional<std::string> Tokenizer::bos_token() const {
  return impl_->bos_token;
}
std::optional<std::string> Tokenizer::eos_token() const {
  return impl_->eos_token;
}
std::optional<std::string> Tokenizer::pad_token() const {
  return impl_->pad_token;
}
std::optional<std::string> Tokenizer::unk_token() const {
  return impl_->unk_token;
}
const std::vector<std::string>& Tokenizer::additional_special_tokens() const {
  return impl_->additional_special_tokens;
}
const std::optional<std::string>& Tokenizer::chat_template() const {
  return impl_->chat_template;
}
const std::string& Tokenizer::padding_side() const {
  return impl_->padding_side;
}
std::optional<int32_t> Tokenizer::bos_token_id() const {
  return impl_->bos_token ? token_to_id(*impl_->bos_token) : std::nullopt;
}
std::optional<int32_t> Tokenizer::eos_token_id() const {
  return impl_->eos_token ? token_to_id(*impl_->eos_token) : std::nullopt;
}
std::optional<int32_t> Tokenizer::pad_token_id() const {
  return impl_->pad_token ? token_to_id(*impl_->pad_token) : std::nullopt;
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_present.size() || !impl_->id_present[id]) return std::nullopt;
  return impl_->id_token[id];
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  std::vector<std::string> pieces;
  impl_->pre_tokenize(text, &pieces, nullptr);
  return pieces;
}

std::string Tokenizer::to_json() const {
  return impl_->json;
}

void Tokenizer::save(const std::filesystem::path& path) const {
  util::write_file_atomically(path.string(), impl_->json, kTokenizerComponent);
}

}  // namespace tessera::data
