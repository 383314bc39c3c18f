// Secrets hidden from what leaves the process: URIs' user-info and query secrets, and the values of secret keys.
#include "tessera/util/redact.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <vector>

namespace tessera::util {
namespace {

// Substrings of a key (lower case, separators removed) that always name a secret.
constexpr std::array<std::string_view, 8> kSecretParts = {"password",   "passwd", "passphrase", "secret",
                                                          "credential", "apikey", "accesskey",  "privatekey"};
// Words of a key that always name a secret (`use_auth_token`, `auth`), matched whole: "author" is not one.
constexpr std::array<std::string_view, 4> kAuthWords = {"auth", "oauth", "authorization", "authentication"};
// The roles of a tokenizer's special tokens: `eos_token: "</s>"` is a token of the vocabulary, not a credential.
constexpr std::array<std::string_view, 36> kSpecialTokenRoles = {
    "pad",     "eos",        "bos",    "unk",    "sep",    "cls",   "mask",      "start", "end",
    "stop",    "special",    "eot",    "eom",    "eod",    "fim",   "image",     "img",   "audio",
    "video",   "prefix",     "suffix", "middle", "system", "user",  "assistant", "tool",  "think",
    "default", "additional", "added",  "add",    "new",    "extra", "begin",     "per",   "last"};
// Query parameters that hide a signature rather than a token.
constexpr std::array<std::string_view, 2> kSignatureParams = {"sig", "signature"};

template <size_t N>
bool among(std::string_view word, const std::array<std::string_view, N>& list) {
  return std::find(list.begin(), list.end(), word) != list.end();
}

// The key's words in lower case: split at '_', '-', '.', ' ' and where a lower-case letter or digit meets an upper-case
// one (hfToken, MLFLOW_TRACKING_TOKEN, x-amz-security-token).
std::vector<std::string> words_of(std::string_view key) {
  std::vector<std::string> words(1);
  for (size_t i = 0; i < key.size(); ++i) {
    const auto c = static_cast<unsigned char>(key[i]);
    if (c == '_' || c == '-' || c == '.' || c == ' ') {
      if (!words.back().empty()) words.emplace_back();
      continue;
    }
    if (std::isupper(c) && i > 0 && !words.back().empty() &&
        (std::islower(static_cast<unsigned char>(key[i - 1])) ||
         std::isdigit(static_cast<unsigned char>(key[i - 1])))) {
      words.emplace_back();
    }
    words.back() += static_cast<char>(std::tolower(c));
  }
  if (words.back().empty()) words.pop_back();
  return words;
}

// A special token as tokenizers spell them: "<|endoftext|>", "</s>", "[PAD]".
bool token_literal(std::string_view v) {
  return v.size() >= 2 && ((v.front() == '<' && v.back() == '>') || (v.front() == '[' && v.back() == ']'));
}

// Whether the value under `key` is hidden: `string` is the value when it is a string, nullptr for a number.
bool secret_entry(std::string_view key, const std::string* string) {
  const std::vector<std::string> words = words_of(key);
  if (words.empty()) return false;
  std::string joined;
  for (const std::string& w : words) joined += w;
  for (std::string_view part : kSecretParts) {
    if (joined.find(part) != std::string::npos) return true;
  }
  if (std::any_of(words.begin(), words.end(), [](const std::string& w) { return among(w, kAuthWords); })) return true;
  if (string == nullptr || words.back() != "token") return false;
  if (words.size() > 1 && among(words[words.size() - 2], kSpecialTokenRoles)) return false;
  return !token_literal(*string);
}

bool scheme_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.';
}

// Where a URI ends inside a longer text: whitespace, quotes and the brackets that enclose one in prose.
bool ends_uri(char c) {
  return std::isspace(static_cast<unsigned char>(c)) || c == '"' || c == '\'' || c == '`' || c == '<' || c == '>' ||
         c == '(' || c == ')';
}

// The query part of a URI ("?a=1&token=x#frag") with the values of secret parameters hidden.
std::string redact_query(std::string_view q) {
  std::string out;
  size_t i = 0;
  while (i < q.size()) {
    const char sep = q[i];
    out += sep;
    ++i;
    if (sep == '#') {  // the fragment is not parameters
      out.append(q.substr(i));
      break;
    }
    const size_t end = std::min(q.find_first_of("&;#", i), q.size());
    const std::string_view param = q.substr(i, end - i);
    const size_t eq = param.find('=');
    if (eq != std::string_view::npos) {
      const std::string name(param.substr(0, eq));
      const std::string value(param.substr(eq + 1));
      std::string lower = name;
      std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
      const bool hidden = !value.empty() &&
                          (secret_entry(name, &value) || among(lower, kSignatureParams) || lower == "x-amz-signature");
      out.append(name).append("=").append(hidden ? kRedacted : value);
    } else {
      out.append(param);
    }
    i = end;
  }
  return out;
}

template <typename Json>
Json hide_all(const Json& v) {
  if (v.is_object() || v.is_array()) {
    Json out = v;
    for (auto& child : out) child = hide_all(child);
    return out;
  }
  if (v.is_string() || v.is_number()) return Json(kRedacted);
  return v;  // null, booleans
}

template <typename Json>
Json redact(const Json& v) {
  if (v.is_object()) {
    Json out = Json::object();
    for (const auto& [key, child] : v.items()) {
      const std::string* text = child.is_string() ? child.template get_ptr<const std::string*>() : nullptr;
      const bool secret =
          (child.is_string() || child.is_number() || child.is_object() || child.is_array()) && secret_entry(key, text);
      out[key] = secret ? hide_all(child) : redact(child);
    }
    return out;
  }
  if (v.is_array()) {
    Json out = Json::array();
    for (const auto& child : v) out.push_back(redact(child));
    return out;
  }
  if (v.is_string()) return Json(redact_uri(v.template get_ref<const std::string&>()));
  return v;
}

}  // namespace

std::string redact_uri(std::string_view text) {
  std::string out;
  size_t done = 0;  // text[0, done) is in `out`
  for (size_t sep = text.find("://"); sep != std::string_view::npos; sep = text.find("://", done)) {
    size_t scheme = sep;
    while (scheme > done && scheme_char(text[scheme - 1])) --scheme;
    if (scheme == sep || !std::isalpha(static_cast<unsigned char>(text[scheme]))) {  // "://" with no scheme before
      out.append(text.substr(done, sep + 3 - done));
      done = sep + 3;
      continue;
    }
    size_t end = sep + 3;  // the URI: up to whitespace, a quote or a bracket
    while (end < text.size() && !ends_uri(text[end])) ++end;
    const std::string_view uri = text.substr(sep + 3, end - sep - 3);
    const size_t authority_end = std::min(uri.find_first_of("/?#"), uri.size());
    const size_t at = uri.substr(0, authority_end).rfind('@');
    out.append(text.substr(done, sep + 3 - done));
    if (at != std::string_view::npos) {
      out.append(kRedacted).append(uri.substr(at, authority_end - at));
    } else {
      out.append(uri.substr(0, authority_end));
    }
    std::string_view rest = uri.substr(authority_end);
    const size_t query = rest.find_first_of("?#");
    out.append(rest.substr(0, query));
    if (query != std::string_view::npos) out.append(redact_query(rest.substr(query)));
    done = end;
  }
  out.append(text.substr(done));
  return out;
}

bool is_secret(std::string_view key, const nlohmann::json& value) {
  if (!(value.is_string() || value.is_number() || value.is_object() || value.is_array())) return false;
  return secret_entry(key, value.is_string() ? value.get_ptr<const std::string*>() : nullptr);
}

nlohmann::json redact_secrets(const nlohmann::json& config) {
  return redact(config);
}

nlohmann::ordered_json redact_secrets(const nlohmann::ordered_json& config) {
  return redact(config);
}

}  // namespace tessera::util
