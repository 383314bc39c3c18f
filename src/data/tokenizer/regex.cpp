// PCRE2 behind an Oniguruma-compatible interface for the pre-tokenizer patterns.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "regex.h"

#include <fmt/format.h>
#include <pcre2.h>
#include <nlohmann/json.hpp>

#include "tessera/util/error.h"

namespace tessera::data::detail {
namespace {

constexpr const char* kComponent = "tokenizer";

#include "unicode_classes.inc"
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct MatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchState() {
    data = pcre2_match_data_create(32, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (data == nullptr || context == nullptr || stack == nullptr) throw std::bad_alloc();
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchState& match_state() {
  thread_local MatchState state;
  return state;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

std::string onig_to_pcre2(const std::string& pattern, const std::string& context) {
  // The classes whose membership depends on the Unicode version: spelled out as Oniguruma in Hugging Face tokenizers
  // has them (unicode_classes.inc), since Debian's PCRE2 knows an older Unicode.
  const auto class_of = [](std::string_view name) -> const char* {
    if (name == "s") return kSpaceClass;
    if (name == "L") return kLetterClass;
    if (name == "N") return kNumberClass;
    return nullptr;
  };
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      std::string name;
      bool negated = false;
      if (e == 's' || e == 'S') {
        name = "s";
        negated = e == 'S';
      } else if ((e == 'p' || e == 'P') && i + 1 < pattern.size() && pattern[i + 1] == '{') {
        const size_t close = pattern.find('}', i);
        if (close != std::string::npos) {
          name = pattern.substr(i + 2, close - i - 2);
          negated = e == 'P';
          if (!name.empty() && name[0] == '^') {
            name = name.substr(1);
            negated = !negated;
          }
          if (class_of(name) != nullptr) {
            i = close;
          } else {
            name.clear();
          }
        }
      } else if (e == 'h' || e == 'H') {
        // Oniguruma's \h is a hexadecimal digit, PCRE2's a horizontal space: refuse rather than guess.
        throw Error(kComponent, fmt::format("{}: \\{} is not supported (pattern {})", context, e, pattern));
      }
      if (!name.empty()) {
        const char* body = class_of(name);
        if (in_class && negated) {
          throw Error(kComponent, fmt::format("{}: a negated class escape inside a character class is not supported "
                                              "(pattern {})",
                                              context, pattern));
        }
        out += in_class ? std::string(body) : fmt::format("[{}{}]", negated ? "^" : "", body);
        continue;
      }
      out += '\\';
      out += e;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == '[') {
      throw Error(kComponent,
                  fmt::format("{}: nested character classes are not supported (pattern {})", context, pattern));
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

struct Regex::Impl {
  pcre2_code* code = nullptr;
  ~Impl() { pcre2_code_free(code); }
};

Regex::Regex(const std::string& pattern, bool literal, const std::string& context) : impl_(std::make_unique<Impl>()) {
  const std::string translated = literal ? pattern : onig_to_pcre2(pattern, context);
  uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE | PCRE2_NO_UTF_CHECK;
  if (literal) options = PCRE2_UTF | PCRE2_LITERAL | PCRE2_NO_UTF_CHECK;
  int error = 0;
  PCRE2_SIZE offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(), options, &error,
                              &offset, nullptr);
  if (impl_->code == nullptr) {
    throw Error(kComponent,
                fmt::format("{}: invalid regular expression {} at offset {}: {}", context,
                            nlohmann::json(pattern).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                            offset, pcre2_message(error)));
  }
  // JIT is an optimisation: without it (unsupported platform) pcre2_match interprets.
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);
}

Regex::~Regex() = default;

void Regex::find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>& out) const {
  MatchState& st = match_state();
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t start = 0;
  while (start <= subject.size()) {
    const int rc = pcre2_match(impl_->code, s, subject.size(), start, PCRE2_NO_UTF_CHECK, st.data, st.context);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) throw Error(kComponent, fmt::format("regular expression match failed: {}", pcre2_message(rc)));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(b, e);
      start = e;
    } else {
      // Empty match: Oniguruma's find_iter yields it and moves on by one character.
      out.emplace_back(b, b);
      if (b >= subject.size()) return;
      start = b + 1;
      while (start < subject.size() && (static_cast<uint8_t>(subject[start]) & 0xC0) == 0x80) ++start;
    }
  }
}

const Regex& Regex::gpt2() {
  static const Regex regex(kGpt2Pattern, false, "GPT-2 pre-tokenizer pattern");
  return regex;
}

}  // namespace tessera::data::detail
