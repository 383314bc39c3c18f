// Unicode helpers of the tokenizer: UTF-8 decoding and repair, GPT-2's byte <-> character map, NFC, and the character
// classes Hugging Face's added-token matching uses.
#pragma once

#include "tessera/util/utf8.h"

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::data::detail {

// Decodes the code point starting at s[i] of VALID UTF-8 and advances i past it.
char32_t next_code_point(std::string_view s, size_t& i);
// Decodes the code point ending just before s[end] of VALID UTF-8; sets `begin` to its first byte.
char32_t prev_code_point(std::string_view s, size_t end, size_t& begin);

// True if `s` is well-formed UTF-8 (no surrogates, no overlongs, nothing above U+10FFFF).
using util::is_valid_utf8;

// GPT-2's bytes_to_unicode(): every byte maps to one printable character; byte_level_char(b) is its code point.
char32_t byte_level_char(uint8_t b);
// The byte whose character is `cp`, or -1.
int byte_of_byte_level_char(char32_t cp);
// The byte-level form of raw bytes (each byte -> its character, UTF-8 encoded).
std::string to_byte_level(std::string_view bytes);
// The raw bytes of a byte-level string; false if some character is not one of the 256 byte-level characters.
bool from_byte_level(std::string_view token, std::string& bytes);

// NFC normalization (ICU) of valid UTF-8.
std::string nfc(std::string_view s);

// Character classes of Rust's `regex` crate, which Hugging Face's added-token matching uses: \s is White_Space,
// \w is Alphabetic, marks, decimal numbers, connector punctuation and Join_Control.
bool is_white_space(char32_t cp);
bool is_word_char(char32_t cp);

}  // namespace tessera::data::detail
