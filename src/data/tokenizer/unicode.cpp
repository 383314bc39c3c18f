// UTF-8 repair (Python's errors="replace"), GPT-2's byte-level character map, NFC through ICU, character classes.
#include "unicode.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <cstring>

#include "tessera/data/tokenizer.h"
#include "tessera/util/error.h"
#include "tessera/util/utf8.h"

namespace tessera::data {
namespace detail {
namespace {

struct ByteLevelTables {
  std::array<char32_t, 256> to_char{};
  std::array<int16_t, 512> to_byte{};  // every byte-level character is below U+0200
  ByteLevelTables() {
    to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_char[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      to_byte[to_char[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelTables& tables() {
  static const ByteLevelTables t;
  return t;
}

const icu::Normalizer2& nfc_instance() {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(status);
  if (U_FAILURE(status) || n == nullptr)
    throw Error("tokenizer", std::string("ICU NFC normalizer unavailable: ") + u_errorName(status));
  return *n;
}

}  // namespace

char32_t next_code_point(std::string_view s, size_t& i) {
  const auto b = static_cast<uint8_t>(s[i]);
  if (b < 0x80) {
    ++i;
    return b;
  }
  const int n = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
  char32_t cp = b & (0x7F >> n);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

char32_t prev_code_point(std::string_view s, size_t end, size_t& begin) {
  begin = end - 1;
  while (begin > 0 && (static_cast<uint8_t>(s[begin]) & 0xC0) == 0x80) --begin;
  size_t i = begin;
  return next_code_point(s, i);
}

char32_t byte_level_char(uint8_t b) {
  return tables().to_char[b];
}

int byte_of_byte_level_char(char32_t cp) {
  return cp < 512 ? tables().to_byte[cp] : -1;
}

std::string to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) util::append_utf8(out, byte_level_char(static_cast<uint8_t>(c)));
  return out;
}

bool from_byte_level(std::string_view token, std::string& bytes) {
  bytes.clear();
  if (!is_valid_utf8(token)) return false;
  size_t i = 0;
  while (i < token.size()) {
    const int b = byte_of_byte_level_char(next_code_point(token, i));
    if (b < 0) return false;
    bytes += static_cast<char>(b);
  }
  return true;
}

std::string nfc(std::string_view s) {
  static const icu::Normalizer2& normalizer = nfc_instance();
  bool ascii = true;
  for (char c : s) ascii = ascii && static_cast<uint8_t>(c) < 0x80;
  if (ascii) return std::string(s);
  UErrorCode status = U_ZERO_ERROR;
  const icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
  if (normalizer.isNormalized(u, status) && U_SUCCESS(status)) return std::string(s);
  status = U_ZERO_ERROR;
  const icu::UnicodeString normalized = normalizer.normalize(u, status);
  if (U_FAILURE(status)) throw Error("tokenizer", std::string("NFC normalization failed: ") + u_errorName(status));
  std::string out;
  normalized.toUTF8String(out);
  return out;
}

bool is_white_space(char32_t cp) {
  return u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_WHITE_SPACE);
}

bool is_word_char(char32_t cp) {
  const auto c = static_cast<UChar32>(cp);
  if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL)) return true;
  switch (u_charType(c)) {
    case U_NON_SPACING_MARK:
    case U_ENCLOSING_MARK:
    case U_COMBINING_SPACING_MARK:
    case U_DECIMAL_DIGIT_NUMBER:
    case U_CONNECTOR_PUNCTUATION:
      return true;
    default:
      return false;
  }
}

}  // namespace detail

std::string sanitize_utf8(std::string_view text) {
  if (detail::is_valid_utf8(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + 16);
  size_t i = 0;
  while (i < text.size()) {
    size_t bad;
    const size_t n = util::utf8_sequence(text, i, bad);
    if (n > 0) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
      i += bad;
    }
  }
  return out;
}

}  // namespace tessera::data
