// tiktoken encodings: the ranks file (.tiktoken: one base64 token and its rank per line) becomes the byte-level BPE
// tokenizer.json that transformers' TikTokenConverter writes (every split of a token into two tokens a merge, the
// pieces matched whole first), merged by tiktoken's own priority (the rank of the merged token, leftmost first); the
// encodings tiktoken ships, tiktoken's cache, and LLM Foundry's TiktokenTokenizerWrapper folders.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <map>
#include <set>
#include <utility>

#include "tessera/data/tokenizer.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"
#include "tessera/util/hashing.h"
#include "tokenizer_impl.h"
#include "unicode.h"

namespace tessera::data {
namespace {

constexpr const char* kTiktokenComponent = "tokenizer";

using TiktokenJson = nlohmann::ordered_json;

// tiktoken_ext/openai_public.py (tiktoken 0.14).
const char* const kR50kPattern = R"('(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s)";
const char* const kCl100kPattern =
    R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s)";
const char* const kO200kPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kBlob = "https://openaipublic.blob.core.windows.net/encodings/";

// tiktoken/model.py: exact model names, then prefixes in order.
const std::vector<std::pair<std::string, std::string>>& model_encodings() {
  static const std::vector<std::pair<std::string, std::string>> m = {
      {"o1", "o200k_base"},
      {"o3", "o200k_base"},
      {"o4-mini", "o200k_base"},
      {"gpt-5", "o200k_base"},
      {"gpt-4.1", "o200k_base"},
      {"gpt-4o", "o200k_base"},
      {"gpt-4", "cl100k_base"},
      {"gpt-3.5-turbo", "cl100k_base"},
      {"gpt-3.5", "cl100k_base"},
      {"gpt-35-turbo", "cl100k_base"},
      {"davinci-002", "cl100k_base"},
      {"babbage-002", "cl100k_base"},
      {"text-embedding-ada-002", "cl100k_base"},
      {"text-embedding-3-small", "cl100k_base"},
      {"text-embedding-3-large", "cl100k_base"},
      {"text-davinci-003", "p50k_base"},
      {"text-davinci-002", "p50k_base"},
      {"text-davinci-001", "r50k_base"},
      {"text-curie-001", "r50k_base"},
      {"text-babbage-001", "r50k_base"},
      {"text-ada-001", "r50k_base"},
      {"davinci", "r50k_base"},
      {"curie", "r50k_base"},
      {"babbage", "r50k_base"},
      {"ada", "r50k_base"},
      {"code-davinci-002", "p50k_base"},
      {"code-davinci-001", "p50k_base"},
      {"code-cushman-002", "p50k_base"},
      {"code-cushman-001", "p50k_base"},
      {"davinci-codex", "p50k_base"},
      {"cushman-codex", "p50k_base"},
      {"text-davinci-edit-001", "p50k_edit"},
      {"code-davinci-edit-001", "p50k_edit"},
      {"text-similarity-davinci-001", "r50k_base"},
      {"text-similarity-curie-001", "r50k_base"},
      {"text-similarity-babbage-001", "r50k_base"},
      {"text-similarity-ada-001", "r50k_base"},
      {"text-search-davinci-doc-001", "r50k_base"},
      {"text-search-curie-doc-001", "r50k_base"},
      {"text-search-babbage-doc-001", "r50k_base"},
      {"text-search-ada-doc-001", "r50k_base"},
      {"code-search-babbage-code-001", "r50k_base"},
      {"code-search-ada-code-001", "r50k_base"},
      // (and two names of GPT-2's own encoding, in its vocab.bpe form, which Tessera does not read)
  };
  return m;
}
const std::vector<std::pair<std::string, std::string>>& model_prefix_encodings() {
  static const std::vector<std::pair<std::string, std::string>> m = {
      {"o1-", "o200k_base"},
      {"o3-", "o200k_base"},
      {"o4-mini-", "o200k_base"},
      {"gpt-5", "o200k_base"},
      {"gpt-4.5-", "o200k_base"},
      {"gpt-4.1-", "o200k_base"},
      {"chatgpt-4o-", "o200k_base"},
      {"gpt-4o-", "o200k_base"},
      {"gpt-4-", "cl100k_base"},
      {"gpt-3.5-turbo-", "cl100k_base"},
      {"gpt-35-turbo-", "cl100k_base"},
      {"gpt-oss-", "o200k_harmony"},
      {"ft:gpt-4o", "o200k_base"},
      {"ft:gpt-4", "cl100k_base"},
      {"ft:gpt-3.5-turbo", "cl100k_base"},
      {"ft:davinci-002", "cl100k_base"},
      {"ft:babbage-002", "cl100k_base"},
  };
  return m;
}

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Standard base64 with padding (Python's base64.b64decode of a well-formed token); false on anything else.
bool base64_decode(std::string_view in, std::string& out) {
  out.clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int j = 0; j < 4; ++j) {
      const char c = in[i + j];
      if (c == '=' && i + 4 == in.size() && j >= 2) {
        v[j] = 0;
        ++pad;
      } else if (pad > 0 || (v[j] = base64_value(c)) < 0) {
        return false;
      }
    }
    const uint32_t n = (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) | (uint32_t(v[2]) << 6) | uint32_t(v[3]);
    out += static_cast<char>((n >> 16) & 0xff);
    if (pad < 2) out += static_cast<char>((n >> 8) & 0xff);
    if (pad < 1) out += static_cast<char>(n & 0xff);
  }
  return true;
}

// The ranks of a .tiktoken file: token bytes by rank (empty where a rank is unused). Errors name the file and line.
std::vector<std::string> read_ranks(std::string_view text, const std::string& source) {
  std::vector<std::string> by_rank;
  std::set<std::string, std::less<>> seen;
  size_t line_no = 0;
  std::string token;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(begin, end - begin);
    begin = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const auto fail = [&](const std::string& why) {
      throw Error(kTiktokenComponent, fmt::format("{}:{}: {}", source, line_no, why));
    };
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos)
      fail("expected \"<base64 token> <rank>\"");
    if (!base64_decode(line.substr(0, space), token) || token.empty()) fail("the token is not base64 of some bytes");
    const std::string_view rank_text = line.substr(space + 1);
    int64_t rank = 0;
    for (char c : rank_text) {
      if (c < '0' || c > '9' || rank > detail::kMaxTokenId)
        fail(fmt::format("the rank must be below {}", detail::kMaxTokenId + 1));
      rank = rank * 10 + (c - '0');
    }
    if (rank_text.empty() || rank > detail::kMaxTokenId)
      fail(fmt::format("the rank must be below {}", detail::kMaxTokenId + 1));
    if (!seen.insert(token).second) fail("the token is listed twice");
    if (static_cast<int64_t>(by_rank.size()) <= rank) by_rank.resize(rank + 1);
    if (!by_rank[rank].empty()) fail(fmt::format("rank {} is given twice", rank));
    by_rank[rank] = token;
  }
  if (by_rank.empty()) throw Error(kTiktokenComponent, fmt::format("{}: no ranks", source));
  return by_rank;
}

// tiktoken's pattern (fancy-regex, where X{n,m}+ is possessive) in the Oniguruma syntax of tokenizer.json (Ruby's,
// where X{n,m}+ repeats X{n,m}): each possessive interval becomes an atomic group, (?>X{n,m}). ?+, *+ and ++ mean the
// same in both.
std::string to_oniguruma(const std::string& pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    out += pattern[i];
    if (pattern[i] == '\\') {
      if (i + 1 < pattern.size()) out += pattern[++i];
      continue;
    }
    if (pattern[i] != '}' || i + 1 >= pattern.size() || pattern[i + 1] != '+') continue;
    const size_t open = out.rfind('{');
    if (open == std::string::npos || open + 1 >= out.size() || !std::isdigit(static_cast<unsigned char>(out[open + 1])))
      continue;  // not an interval
    // The atom before the interval: \p{..} / \P{..}, a [...] class, a (...) group, an escaped or a plain character.
    size_t atom = open - 1;
    if (out[atom] == '}' && (atom = out.rfind('{', atom)) != std::string::npos && atom >= 2 && out[atom - 2] == '\\') {
      atom -= 2;
    } else if (out[open - 1] == ']' || out[open - 1] == ')') {
      const char close = out[open - 1], opening = close == ']' ? '[' : '(';
      int depth = 0;
      for (atom = open - 1;; --atom) {
        if (out[atom] == close && (atom == 0 || out[atom - 1] != '\\')) ++depth;
        if (out[atom] == opening && (atom == 0 || out[atom - 1] != '\\') && --depth == 0) break;
        if (atom == 0)
          throw Error(kTiktokenComponent, fmt::format("tiktoken pattern {}: unbalanced {}", pattern, opening));
      }
    } else {
      atom = open - 1;
      if (atom >= 1 && out[atom - 1] == '\\') --atom;
    }
    out.insert(atom, "(?>");
    out += ')';
    ++i;  // the possessive '+'
  }
  return out;
}

using Added = detail::AddedToken;

// The tokenizer.json of the encoding (as transformers' TikTokenConverter builds it) with `added` as added tokens, and
// the merges by tiktoken's priority.
std::shared_ptr<detail::TokenizerImpl> build_tiktoken(const std::vector<std::string>& by_rank,
                                                      const std::string& pattern, const std::vector<Added>& added,
                                                      const std::string& source) {
  detail::StringMap<int32_t> rank_of;
  rank_of.reserve(by_rank.size());
  for (size_t r = 0; r < by_rank.size(); ++r) {
    if (!by_rank[r].empty()) rank_of.emplace(by_rank[r], static_cast<int32_t>(r));
  }
  for (int b = 0; b < 256; ++b) {
    if (!rank_of.count(std::string(1, static_cast<char>(b))))
      throw Error(kTiktokenComponent,
                  fmt::format("{}: byte 0x{:02x} has no rank: tiktoken could not encode it", source, b));
  }
  struct Merge {
    int32_t left, right, merged;
  };
  std::vector<Merge> merges;
  std::vector<std::pair<std::string, int64_t>> vocab;
  for (size_t r = 0; r < by_rank.size(); ++r) {
    const std::string& t = by_rank[r];
    if (t.empty()) continue;
    vocab.emplace_back(detail::to_byte_level(t), static_cast<int64_t>(r));
    std::vector<Merge> local;
    for (size_t k = 1; k < t.size(); ++k) {
      auto l = rank_of.find(std::string_view(t).substr(0, k)), rr = rank_of.find(std::string_view(t).substr(k));
      if (l != rank_of.end() && rr != rank_of.end()) local.push_back({l->second, rr->second, static_cast<int32_t>(r)});
    }
    std::sort(local.begin(), local.end(),
              [](const Merge& a, const Merge& b) { return std::pair(a.left, a.right) < std::pair(b.left, b.right); });
    merges.insert(merges.end(), local.begin(), local.end());
  }
  std::vector<std::pair<std::string, std::string>> merge_list;
  for (const Merge& m : merges) {
    merge_list.emplace_back(detail::to_byte_level(by_rank[m.left]), detail::to_byte_level(by_rank[m.right]));
  }
  // Each added token is in the model's vocab too, at its id: Hugging Face gives an added token outside the vocab the
  // next id past it, not tiktoken's (cl100k_base's <|endoftext|> follows a gap).
  std::set<std::string, std::less<>> ranked;
  for (const auto& [token, id] : vocab) ranked.insert(token);
  for (const Added& a : added) {
    if (a.id < static_cast<int64_t>(by_rank.size()) && !by_rank[a.id].empty())
      throw Error(kTiktokenComponent,
                  fmt::format("{}: special token {} has id {}, a ranked token's", source, a.content, a.id));
    if (ranked.count(a.content))
      throw Error(kTiktokenComponent, fmt::format("{}: special token {} is also a ranked token", source, a.content));
    vocab.emplace_back(a.content, a.id);
  }
  const nlohmann::json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
  const nlohmann::json split = {{"type", "Sequence"},
                                {"pretokenizers",
                                 {{{"type", "Split"},
                                   {"pattern", {{"Regex", to_oniguruma(pattern)}}},
                                   {"behavior", "Isolated"},
                                   {"invert", false}},
                                  byte_level}}};
  // ignore_merges: tiktoken takes a piece that is a token whole.
  const std::string json =
      detail::bpe_tokenizer_json(added, vocab, merge_list, split, byte_level, byte_level, /*ignore_merges=*/true);
  auto impl = detail::load_tokenizer_json(json, source);
  // tiktoken merges the adjacent pair whose concatenation has the lowest rank (the leftmost of equals): every split
  // of one token shares that token's priority, where tokenizer.json's merge list would order them.
  detail::PairMap priority;
  priority.reserve(merges.size());
  for (const Merge& m : merges) priority.put(m.left, m.right, {m.merged, m.merged});
  impl->model.merges = std::move(priority);
  return impl;
}

std::vector<Added> encoding_specials(const TiktokenEncoding& e) {
  std::vector<Added> out;
  for (const auto& [content, id] : e.special_tokens) out.push_back({.content = content, .id = id, .normalized = false});
  return out;
}

const std::string& cache_dir_or_empty(std::string& storage) {
  if (const char* d = std::getenv("TIKTOKEN_CACHE_DIR")) return storage = d;
  if (const char* d = std::getenv("DATA_GYM_CACHE_DIR")) return storage = d;
  return storage = (std::filesystem::temp_directory_path() / "data-gym-cache").string();
}

}  // namespace

std::optional<TiktokenEncoding> tiktoken_encoding(std::string_view name) {
  const std::string blob = kBlob;
  const std::string endoftext = "<|endoftext|>", prefix = "<|fim_prefix|>", middle = "<|fim_middle|>",
                    suffix = "<|fim_suffix|>", endofprompt = "<|endofprompt|>";
  if (name == "r50k_base") {
    return TiktokenEncoding{std::string(name),
                            kR50kPattern,
                            {{endoftext, 50256}},
                            blob + "r50k_base.tiktoken",
                            "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"};
  }
  const std::string p50k_hash = "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069";
  if (name == "p50k_base") {
    return TiktokenEncoding{
        std::string(name), kR50kPattern, {{endoftext, 50256}}, blob + "p50k_base.tiktoken", p50k_hash};
  }
  if (name == "p50k_edit") {
    return TiktokenEncoding{std::string(name),
                            kR50kPattern,
                            {{endoftext, 50256}, {prefix, 50281}, {middle, 50282}, {suffix, 50283}},
                            blob + "p50k_base.tiktoken",
                            p50k_hash};
  }
  if (name == "cl100k_base") {
    return TiktokenEncoding{
        std::string(name),
        kCl100kPattern,
        {{endoftext, 100257}, {prefix, 100258}, {middle, 100259}, {suffix, 100260}, {endofprompt, 100276}},
        blob + "cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"};
  }
  TiktokenEncoding o200k{std::string(name),
                         kO200kPattern,
                         {{endoftext, 199999}, {endofprompt, 200018}},
                         blob + "o200k_base.tiktoken",
                         "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"};
  if (name == "o200k_base") return o200k;
  if (name == "o200k_harmony") {
    // The base's specials, then (a dict union: a later key keeps the first one's place) the harmony ones.
    std::vector<std::pair<std::string, int32_t>> specials = {{"<|startoftext|>", 199998},
                                                             {"<|reserved_200000|>", 200000},
                                                             {"<|reserved_200001|>", 200001},
                                                             {"<|return|>", 200002},
                                                             {"<|constrain|>", 200003},
                                                             {"<|reserved_200004|>", 200004},
                                                             {"<|channel|>", 200005},
                                                             {"<|start|>", 200006},
                                                             {"<|end|>", 200007},
                                                             {"<|message|>", 200008},
                                                             {"<|reserved_200009|>", 200009},
                                                             {"<|reserved_200010|>", 200010},
                                                             {"<|reserved_200011|>", 200011},
                                                             {"<|call|>", 200012}};
    for (int32_t i = 200013; i < 201088; ++i) specials.push_back({fmt::format("<|reserved_{}|>", i), i});
    o200k.special_tokens.insert(o200k.special_tokens.end(), specials.begin(), specials.end());
    return o200k;
  }
  return std::nullopt;
}

std::optional<std::string> tiktoken_encoding_for_model(std::string_view model) {
  for (const auto& [name, encoding] : model_encodings()) {
    if (model == name) return encoding;
  }
  for (const auto& [prefix, encoding] : model_prefix_encodings()) {
    if (model.starts_with(prefix)) return encoding;
  }
  return std::nullopt;
}

namespace {

// `e`'s ranks file in tiktoken's cache and its contents, read once and checked against the sha256 tiktoken expects.
std::pair<std::filesystem::path, std::string> cached_ranks(const TiktokenEncoding& e) {
  std::string dir;
  cache_dir_or_empty(dir);
  const std::filesystem::path file = std::filesystem::path(dir) / util::hex_digest("sha1", e.ranks_url);
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) {
    throw Error(kTiktokenComponent,
                fmt::format("tiktoken encoding {}: its ranks file is not in tiktoken's cache ({}, from "
                            "$TIKTOKEN_CACHE_DIR, else $DATA_GYM_CACHE_DIR, else the temporary folder's "
                            "data-gym-cache); Tessera downloads nothing: run tiktoken.get_encoding(\"{}\") where the "
                            "network reaches {}, or copy that file there",
                            e.name, file.string(), e.name, e.ranks_url));
  }
  std::string contents = util::read_file(file.string(), kTiktokenComponent);
  const std::string digest = util::hex_digest("sha256", contents);
  if (!e.ranks_sha256.empty() && digest != e.ranks_sha256) {
    throw Error(kTiktokenComponent,
                fmt::format("{}: sha256 {} is not the {} ranks file's ({}): refusing it, as tiktoken does",
                            file.string(), digest, e.name, e.ranks_sha256));
  }
  return {file, std::move(contents)};
}

}  // namespace

Tokenizer Tokenizer::from_tiktoken(const TiktokenEncoding& encoding) {
  const auto [file, contents] = cached_ranks(encoding);
  return Tokenizer(build_tiktoken(read_ranks(contents, file.string()), encoding.pattern, encoding_specials(encoding),
                                  file.string()));
}

Tokenizer Tokenizer::from_tiktoken(const std::filesystem::path& ranks_file, const TiktokenEncoding& encoding) {
  const std::string source = ranks_file.string();
  const std::vector<std::string> by_rank = read_ranks(util::read_file(source, kTiktokenComponent), source);
  return Tokenizer(build_tiktoken(by_rank, encoding.pattern, encoding_specials(encoding), source));
}

namespace detail {

namespace {

// TiktokenTokenizerWrapper.default_chat_template (llmfoundry/tokenizers/tiktoken.py), with USE_DEFAULT_PROMPT and
// DEFAULT_SYSTEM_PROMPT replaced as the wrapper replaces them.
std::string wrapper_chat_template(bool use_default_system_prompt) {
  std::string t =
      "{% if messages[0]['role'] == 'system' %}"
      "{% set loop_messages = messages[1:] %}"
      "{% set system_message = messages[0]['content'] %}"
      "{% elif USE_DEFAULT_PROMPT == true and not 'system' in messages[0]['role'] %}"
      "{% set loop_messages = messages %}"
      "{% set system_message = 'DEFAULT_SYSTEM_PROMPT' %}"
      "{% else %}"
      "{% set loop_messages = messages %}"
      "{% set system_message = false %}"
      "{% endif %}"
      "{% for message in loop_messages %}"
      "{% if loop.index0 == 0 %}"
      "{% if system_message != false %}"
      "{{ '<|im_start|>system\n' + system_message.strip() + '<|im_end|>\n'}}"
      "{% endif %}"
      "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' }}"
      "{% else %}"
      "{{ '\n' + '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' }}"
      "{% endif %}"
      "{% if (add_generation_prompt == true and loop.last) %}"
      "{{ '\n' + '<|im_start|>' + 'assistant' + '\n' }}"
      "{% endif %}"
      "{% endfor %}";
  const auto replace = [&t](const std::string& from, const std::string& to) {
    for (size_t at = t.find(from); at != std::string::npos; at = t.find(from, at + to.size()))
      t.replace(at, from.size(), to);
  };
  replace("USE_DEFAULT_PROMPT", use_default_system_prompt ? "true" : "false");
  replace("DEFAULT_SYSTEM_PROMPT",
          "You are a helpful, respectful and honest assistant. Always answer as helpfully as possible.");
  return t;
}

std::optional<std::string> string_key(const TiktokenJson& config, const char* key, const std::string& source) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) throw Error(kTiktokenComponent, fmt::format("{}: {}: expected a string or null", source, key));
  return it->get<std::string>();
}

bool bool_key(const TiktokenJson& config, const char* key, bool fallback, const std::string& source) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) throw Error(kTiktokenComponent, fmt::format("{}: {}: expected true or false", source, key));
  return it->get<bool>();
}

}  // namespace

std::shared_ptr<TokenizerImpl> load_tiktoken_wrapper(const std::filesystem::path& folder, const TiktokenJson& config,
                                                     const std::string& source) {
  const std::optional<std::string> model = string_key(config, "model_name", source);
  const std::optional<std::string> encoding_name = string_key(config, "encoding_name", source);
  if (model.has_value() == encoding_name.has_value()) {
    throw Error(kTiktokenComponent,
                fmt::format("{}: model_name, encoding_name: TiktokenTokenizerWrapper takes exactly one", source));
  }
  std::string name;
  if (model) {
    const std::optional<std::string> mapped = tiktoken_encoding_for_model(*model);
    if (!mapped) {
      throw Error(kTiktokenComponent,
                  fmt::format("{}: model_name \"{}\" is not a model tiktoken maps to an encoding", source, *model));
    }
    name = *mapped;
  } else {
    name = *encoding_name;
  }
  const std::optional<TiktokenEncoding> encoding = tiktoken_encoding(name);
  if (!encoding) {
    throw Error(kTiktokenComponent,
                fmt::format("{}: {}: tiktoken encoding \"{}\" is not one Tessera reads (r50k_base, p50k_base, "
                            "p50k_edit, cl100k_base, o200k_base, o200k_harmony)",
                            source, model ? "model_name" : "encoding_name", name));
  }
  const std::string errors = string_key(config, "errors", source).value_or("replace");
  if (errors != "replace") {
    throw Error(kTiktokenComponent,
                fmt::format("{}: errors \"{}\": Tessera decodes invalid UTF-8 as \"replace\" only", source, errors));
  }
  // The wrapper's special tokens (transformers' all_special_tokens): bos, eos and unk (<|endoftext|> unless the config
  // says otherwise), pad, additional_special_tokens. Only these are special to decode(skip_special_tokens); the
  // encoding's other special tokens are split out all the same (allowed_special="all").
  std::set<std::string> specials;
  const auto content_of = [&](const TiktokenJson& v) -> std::optional<std::string> {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
    return std::nullopt;
  };
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    auto it = config.find(key);
    if (it == config.end()) {
      if (std::string(key) != "pad_token") specials.insert("<|endoftext|>");
    } else if (auto c = content_of(*it)) {
      specials.insert(*c);
    }
  }
  std::set<std::string> additional;
  if (auto it = config.find("additional_special_tokens"); it != config.end() && it->is_array()) {
    for (const TiktokenJson& v : *it) {
      if (auto c = content_of(v)) additional.insert(*c);
    }
  }
  specials.insert(additional.begin(), additional.end());
  std::vector<Added> added = encoding_specials(*encoding);
  int32_t n_vocab = 0;  // tiktoken's n_vocab, the wrapper's vocab_size: the largest id + 1
  for (const Added& a : added) n_vocab = std::max(n_vocab, a.id + 1);
  if (auto it = config.find("added_tokens_decoder"); it != config.end() && !it->is_null()) {
    if (!it->is_object())
      throw Error(kTiktokenComponent, fmt::format("{}: added_tokens_decoder: expected an object", source));
    for (const auto& item : it->items()) {
      const std::string& key = item.key();
      const TiktokenJson& token = item.value();
      const std::string where = fmt::format("{}: added_tokens_decoder.{}", source, key);
      int64_t id = -1;
      try {
        size_t used = 0;
        id = std::stoll(key, &used);
        if (used != key.size()) id = -1;
      } catch (const std::exception&) {
        id = -1;
      }
      if (id < 0 || id > detail::kMaxTokenId)
        throw Error(kTiktokenComponent, fmt::format("{}: the id must be below {}", where, detail::kMaxTokenId + 1));
      if (!token.is_object() || !token.contains("content") || !token["content"].is_string())
        throw Error(kTiktokenComponent, fmt::format("{}: expected an AddedToken object with a content string", where));
      const std::string content = token["content"].get<std::string>();
      const auto flag = [&](const char* k, bool fallback) {
        return token.contains(k) && token[k].is_boolean() ? token[k].get<bool>() : fallback;
      };
      auto same = std::find_if(added.begin(), added.end(), [&](const Added& a) { return a.content == content; });
      if (same != added.end()) {
        if (same->id != id)
          throw Error(kTiktokenComponent, fmt::format("{}: {} is token {} of {}", where, content, same->id, name));
        continue;
      }
      added.push_back({content, static_cast<int32_t>(id), flag("special", true), flag("lstrip", false),
                       flag("rstrip", false), flag("single_word", false), flag("normalized", false)});
    }
  }
  const auto [ranks, contents] = cached_ranks(*encoding);
  const std::vector<std::string> by_rank = read_ranks(contents, ranks.string());
  n_vocab = std::max(n_vocab, static_cast<int32_t>(by_rank.size()));
  // transformers' legacy_added_tokens: added tokens that are not special, and additional special tokens past the
  // encoding's ids; its slow decode spaces them from their neighbours.
  std::vector<int32_t> spaced;
  for (Added& a : added) {
    const bool decoder_entry = &a - added.data() >= static_cast<std::ptrdiff_t>(encoding->special_tokens.size());
    if ((decoder_entry && !specials.count(a.content)) || (additional.count(a.content) && a.id >= n_vocab))
      spaced.push_back(a.id);
    a.special = specials.count(a.content) > 0;
  }
  auto impl = build_tiktoken(by_rank, encoding->pattern, added, ranks.string());
  for (int32_t id : spaced) {
    if (impl->id_spaced.size() <= static_cast<size_t>(id)) impl->id_spaced.resize(id + 1);
    impl->id_spaced[id] = 1;
  }
  load_tokenizer_config(folder, *impl);
  // The wrapper's defaults for keys the config leaves out; its template from add_bos_token / add_eos_token.
  for (auto [key, slot] : {std::pair{"bos_token", &impl->bos_token}, std::pair{"eos_token", &impl->eos_token},
                           std::pair{"unk_token", &impl->unk_token}}) {
    if (!config.contains(key)) *slot = "<|endoftext|>";
  }
  if (!impl->chat_template) {
    impl->chat_template = wrapper_chat_template(bool_key(config, "use_default_system_prompt", false, source));
  }
  const auto id_of = [&](const std::optional<std::string>& token, const char* key) {
    if (!token) throw Error(kTiktokenComponent, fmt::format("{}: add_{} is true but {} is not set", source, key, key));
    auto it = impl->added_ids.find(*token);
    if (it == impl->added_ids.end())
      throw Error(kTiktokenComponent, fmt::format("{}: {} {} is not a token of {}", source, key, *token, name));
    return it->second;
  };
  if (bool_key(config, "add_bos_token", false, source)) impl->template_prefix = {id_of(impl->bos_token, "bos_token")};
  if (bool_key(config, "add_eos_token", false, source)) impl->template_suffix = {id_of(impl->eos_token, "eos_token")};
  return impl;
}

}  // namespace detail

}  // namespace tessera::data
