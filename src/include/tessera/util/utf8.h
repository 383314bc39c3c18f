// UTF-8 well-formedness (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF), shared by the recipe
// loader (recipes must be UTF-8) and the tokenizer (invalid input is repaired with U+FFFD as HF tokenizers does).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace tessera::util {

// Length of the valid UTF-8 sequence at s[i], or 0 with `bad` = the length of the maximal invalid subpart (the bytes
// one U+FFFD replaces: a lead byte and the continuation bytes that could still have completed it).
size_t utf8_sequence(std::string_view s, size_t i, size_t& bad);

// Index of the first byte of `s` that does not start a well-formed sequence, or std::string_view::npos.
size_t first_invalid_utf8(std::string_view s);

// Appends code point `cp` (at most U+10FFFF, not a surrogate) as UTF-8.
void append_utf8(std::string& out, char32_t cp);

inline bool is_valid_utf8(std::string_view s) {
  return first_invalid_utf8(s) == std::string_view::npos;
}

}  // namespace tessera::util
