// Pre-tokenizer regular expressions: PCRE2 (JIT, UTF + UCP) made to match like Oniguruma, the engine Hugging Face
// tokenizers uses. Patterns are rewritten where the two differ: \s, \S, \p{L}, \P{L}, \p{N}, \P{N} become explicit
// classes with exactly the code points Oniguruma in tokenizers 0.22 puts in them (unicode_classes.inc; Debian's
// PCRE2 knows Unicode 14, Oniguruma there a later version, and PCRE2's \s also takes U+180E). Other \p{...}
// properties are PCRE2's (Unicode 14).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::data::detail {

class Regex {
 public:
  // Compiles `pattern` (Oniguruma/Ruby syntax as used in tokenizer.json), or the literal string when `literal`.
  // Throws tessera::Error with `context` (file and JSON key) on a pattern PCRE2 cannot compile or we cannot translate.
  Regex(const std::string& pattern, bool literal, const std::string& context);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the [begin, end) byte ranges of the successive non-overlapping matches in `subject` (valid UTF-8), as
  // Oniguruma's find_iter would: the search resumes at the end of each match (one character further after an empty
  // match). Thread-safe.
  void find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>& out) const;

  // The GPT-2 pre-tokenizer pattern of Hugging Face's ByteLevel pre-tokenizer.
  static const Regex& gpt2();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The pattern with \s, \p{L}, \p{N} (and negations) replaced by explicit classes (exposed for tests).
std::string onig_to_pcre2(const std::string& pattern, const std::string& context);

}  // namespace tessera::data::detail
