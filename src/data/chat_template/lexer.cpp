// The chat-template lexer: template source -> pieces (jinja2's whitespace rules), and expression text -> tokens.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "syntax.h"
#include "tessera/util/error.h"
#include "tessera/util/utf8.h"

namespace tessera::data::chat_template::detail {

[[noreturn]] void syntax_error(const std::string& name, int line, const std::string& what) {
  throw Error(kComponent, fmt::format("{}:{}: {}", name, line, what));
}

namespace {

bool only_blanks(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; });
}

int count_lines(std::string_view s) {
  return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
}

}  // namespace

std::vector<Piece> lex(std::string src, const std::string& name) {
  // jinja2 normalises newlines to \n and drops one trailing newline (keep_trailing_newline=False).
  std::string norm;
  norm.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      norm += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      norm += src[i];
    }
  }
  if (!norm.empty() && norm.back() == '\n') norm.pop_back();
  src = std::move(norm);

  std::vector<Piece> out;
  size_t pos = 0;
  int line = 1;
  bool line_starting = true;
  while (true) {
    size_t start = pos;
    while (true) {
      start = src.find('{', start);
      if (start == std::string::npos || start + 1 >= src.size()) {
        start = std::string::npos;
        break;
      }
      const char k = src[start + 1];
      if (k == '{' || k == '%' || k == '#') break;
      ++start;
    }
    std::string text = src.substr(pos, start == std::string::npos ? std::string::npos : start - pos);
    if (start == std::string::npos) {
      if (!text.empty()) out.push_back({Piece::Kind::kText, text, line});
      break;
    }
    const char kind = src[start + 1];
    const char mod = start + 2 < src.size() ? src[start + 2] : '\0';
    if (mod == '-') {
      text.erase(text.find_last_not_of(" \t\n\r\v\f") + 1);
    } else if (mod != '+' && kind != '{') {  // lstrip_blocks
      const size_t l = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
      if ((l > 0 || line_starting) && l < text.size() && only_blanks(std::string_view(text).substr(l))) text.resize(l);
    }
    const int text_line = line;
    line += count_lines(src.substr(pos, start - pos));
    if (!text.empty()) out.push_back({Piece::Kind::kText, std::move(text), text_line});
    const size_t inner = start + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
    size_t close = std::string::npos;
    if (kind == '#') {
      close = src.find("#}", inner);
    } else {
      // The first closing delimiter outside string literals and brackets (jinja2's balancing stack), so that
      // `{{ {'a': {'b': 1}} }}` is one tag.
      const char end = kind == '{' ? '}' : '%';
      char quote = 0;
      int depth = 0;
      for (size_t i = inner; i + 1 < src.size(); ++i) {
        const char c = src[i];
        if (quote) {
          if (c == '\\') {
            ++i;
          } else if (c == quote) {
            quote = 0;
          }
        } else if (c == '\'' || c == '"') {
          quote = c;
        } else if (depth == 0 && c == end && src[i + 1] == '}') {
          close = i;
          break;
        } else if (c == '(' || c == '[' || c == '{') {
          ++depth;
        } else if ((c == ')' || c == ']' || c == '}') && depth > 0) {
          --depth;
        }
      }
    }
    if (close == std::string::npos) {
      syntax_error(name, line, kind == '#' ? "unclosed comment" : kind == '{' ? "unclosed '{{'" : "unclosed '{%'");
    }
    size_t inner_end = close;
    const char right = close > inner ? src[close - 1] : '\0';
    if (right == '-' || right == '+') --inner_end;
    if (kind != '#') {
      out.push_back(
          {kind == '{' ? Piece::Kind::kVar : Piece::Kind::kBlock, src.substr(inner, inner_end - inner), line});
    }
    line += count_lines(src.substr(start, close + 2 - start));
    pos = close + 2;
    line_starting = false;
    if (right == '-') {
      const size_t ws = src.find_first_not_of(" \t\n\r\v\f", pos);
      const size_t stop = ws == std::string::npos ? src.size() : ws;
      line += count_lines(src.substr(pos, stop - pos));
      line_starting = stop > pos && src[stop - 1] == '\n';
      pos = stop;
    } else if (right != '+' && kind != '{' && pos < src.size() && src[pos] == '\n') {  // trim_blocks
      ++pos;
      ++line;
      line_starting = true;
    }
  }
  return out;
}

std::vector<Token> tokenize(const std::string& s, const std::string& name, int line) {
  std::vector<Token> out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++i;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({Token::Kind::kName, s.substr(i, j - i), {}});
      i = j;
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool is_float = false;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      if (j + 1 < s.size() && s[j] == '.' && std::isdigit(static_cast<unsigned char>(s[j + 1]))) {
        is_float = true;
        ++j;
        while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      }
      if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
        size_t k = j + 1;
        if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
        if (k < s.size() && std::isdigit(static_cast<unsigned char>(s[k]))) {
          is_float = true;
          j = k;
          while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
        }
      }
      std::string digits = s.substr(i, j - i);
      digits.erase(std::remove(digits.begin(), digits.end(), '_'), digits.end());
      try {
        if (is_float) {
          out.push_back({Token::Kind::kFloat, digits, Json(std::stod(digits))});
        } else {
          out.push_back({Token::Kind::kInt, digits, Json(std::stoll(digits))});
        }
      } catch (const std::exception&) {
        syntax_error(name, line, fmt::format("number {} out of range", digits));
      }
      i = j;
      continue;
    }
    if (c == '\'' || c == '"') {
      std::string v;
      size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] != '\\' || j + 1 >= s.size()) {
          v += s[j];
          continue;
        }
        const char e = s[++j];
        switch (e) {
          case 'n':
            v += '\n';
            break;
          case 't':
            v += '\t';
            break;
          case 'r':
            v += '\r';
            break;
          case '0':
            v += '\0';
            break;
          case '\\':
          case '\'':
          case '"':
            v += e;
            break;
          case '\n':
            break;
          case 'x':
          case 'u':
          case 'U': {
            const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            if (j + n >= s.size()) syntax_error(name, line, "truncated escape in a string literal");
            uint32_t cp = 0;
            for (size_t k = 1; k <= n; ++k) {
              const char h = s[j + k];
              const int d = std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                            : (h >= 'a' && h <= 'f')                    ? h - 'a' + 10
                            : (h >= 'A' && h <= 'F')                    ? h - 'A' + 10
                                                                        : -1;
              if (d < 0) syntax_error(name, line, "bad hex escape in a string literal");
              cp = cp * 16 + static_cast<uint32_t>(d);
            }
            if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) syntax_error(name, line, "bad code point escape");
            j += n;
            util::append_utf8(v, cp);
            break;
          }
          default:  // Python keeps unknown escapes as written
            v += '\\';
            v += e;
        }
      }
      if (j >= s.size()) syntax_error(name, line, "unterminated string literal");
      out.push_back({Token::Kind::kString, {}, Json(v)});
      i = j + 1;
      continue;
    }
    static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">="};
    bool matched = false;
    for (const char* op : kOps) {
      if (s.compare(i, 2, op) == 0) {
        out.push_back({Token::Kind::kOp, op, {}});
        i += 2;
        matched = true;
        break;
      }
    }
    if (matched) continue;
    if (std::string_view("+-*/%~<>=|.,:()[]{}").find(c) != std::string_view::npos) {
      out.push_back({Token::Kind::kOp, std::string(1, c), {}});
      ++i;
      continue;
    }
    syntax_error(name, line, fmt::format("unexpected character '{}'", c));
  }
  out.push_back({Token::Kind::kEnd, {}, {}});
  return out;
}

}  // namespace tessera::data::chat_template::detail
