// UTF-8 well-formedness checks and encoding (see utf8.h).
#include "tessera/util/utf8.h"

#include <cstdint>
#include <cstring>

namespace tessera::util {

size_t utf8_sequence(std::string_view s, size_t i, size_t& bad) {
  const auto at = [&](size_t k) { return k < s.size() ? static_cast<uint8_t>(s[k]) : 0x100; };
  const unsigned b = at(i);
  bad = 1;
  if (b < 0x80) return 1;
  unsigned n = 0, lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    n = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    n = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    n = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (unsigned k = 1; k < n; ++k) {
    const unsigned c = at(i + k);
    const unsigned l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (c < l || c > h) {
      bad = k;
      return 0;
    }
  }
  return n;
}

size_t first_invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= s.size()) break;
    size_t bad;
    const size_t n = utf8_sequence(s, i, bad);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace tessera::util
