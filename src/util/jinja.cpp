// A Jinja interpreter for chat templates: a lexer with jinja2's whitespace rules (trim_blocks, lstrip_blocks, `-`,
// `+`), a recursive-descent parser with jinja2's operator precedence, and a tree-walking evaluator over JSON values
// with Python's semantics for the operations templates use.
#include "tessera/util/jinja.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <ctime>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "tessera/util/error.h"
#include "tessera/util/python_json.h"
#include "tessera/util/utf8.h"

namespace tessera::util::jinja {

using Json = nlohmann::ordered_json;

namespace detail {

namespace {

constexpr const char* kComponent = "jinja";

// ---- Values ------------------------------------------------------------------------------------------------------

struct Value {
  enum class Kind { kUndefined, kData, kNamespace, kFunction };
  Kind kind = Kind::kUndefined;
  Json data;                 // kData
  std::shared_ptr<Json> ns;  // kNamespace: a mutable object shared by every copy
  std::string name;          // kFunction: the global's name; kUndefined: what was looked up (for messages)

  static Value undefined(std::string what) {
    Value v;
    v.name = std::move(what);
    return v;
  }
  static Value of(Json j) {
    Value v;
    v.kind = Kind::kData;
    v.data = std::move(j);
    return v;
  }
  bool defined() const { return kind != Kind::kUndefined; }
  bool is(Json::value_t t) const { return kind == Kind::kData && data.type() == t; }
  bool is_string() const { return kind == Kind::kData && data.is_string(); }
  bool is_number() const { return kind == Kind::kData && data.is_number(); }
  bool is_integer() const { return kind == Kind::kData && data.is_number_integer(); }
  bool is_list() const { return kind == Kind::kData && data.is_array(); }
  bool is_dict() const { return kind == Kind::kData && data.is_object(); }
  bool is_none() const { return kind == Kind::kData && data.is_null(); }
};

// Python whitespace (str.strip / str.split without arguments).
bool is_py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

// The code points of valid UTF-8 text, with their byte offsets (size() + 1 entries, the last one the end).
std::vector<size_t> code_point_offsets(const std::string& s) {
  std::vector<size_t> out;
  for (size_t i = 0; i < s.size();) {
    out.push_back(i);
    const auto c = static_cast<uint8_t>(s[i]);
    i += c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
    i = std::min(i, s.size());
  }
  out.push_back(s.size());
  return out;
}

uint32_t decode_at(const std::string& s, size_t i) {
  const auto c = static_cast<uint8_t>(s[i]);
  if (c < 0x80) return c;
  const int len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
  uint32_t cp = c & (len == 4 ? 0x07 : len == 3 ? 0x0f : 0x1f);
  for (int k = 1; k < len && i + static_cast<size_t>(k) < s.size(); ++k)
    cp = (cp << 6) | (static_cast<uint8_t>(s[i + static_cast<size_t>(k)]) & 0x3f);
  return cp;
}

std::string py_strip(const std::string& s, bool left, bool right, const std::optional<std::string>& chars) {
  const std::vector<size_t> at = code_point_offsets(s);
  const size_t n = at.size() - 1;
  std::set<uint32_t> set;
  if (chars) {
    const std::vector<size_t> c = code_point_offsets(*chars);
    for (size_t k = 0; k + 1 < c.size(); ++k) set.insert(decode_at(*chars, c[k]));
  }
  const auto strip = [&](size_t k) {
    const uint32_t cp = decode_at(s, at[k]);
    return chars ? set.count(cp) > 0 : is_py_space(cp);
  };
  size_t b = 0, e = n;
  if (left) {
    while (b < e && strip(b)) ++b;
  }
  if (right) {
    while (e > b && strip(e - 1)) --e;
  }
  return s.substr(at[b], at[e] - at[b]);
}

std::string ascii_map(std::string s, int (*f)(int)) {
  for (char& c : s) {
    if (static_cast<uint8_t>(c) < 0x80) c = static_cast<char>(f(static_cast<unsigned char>(c)));
  }
  return s;
}

std::string py_title(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x80) {
      prev_cased = false;
      continue;
    }
    c = static_cast<char>(prev_cased ? std::tolower(u) : std::toupper(u));
    prev_cased = std::isalpha(u) != 0;
  }
  return out;
}

std::string py_capitalize(const std::string& s) {
  std::string out = ascii_map(s, [](int c) { return std::tolower(c); });
  if (!out.empty() && static_cast<uint8_t>(out[0]) < 0x80) out[0] = static_cast<char>(std::toupper(out[0]));
  return out;
}

std::string py_repr_string(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == q || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\x{:02x}", u);
    } else {
      out += c;
    }
  }
  out += q;
  return out;
}

// Python's repr() of a JSON value (lists and dicts print their items this way).
std::string py_repr(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null:
      return "None";
    case Json::value_t::boolean:
      return j.get<bool>() ? "True" : "False";
    case Json::value_t::number_integer:
      return std::to_string(j.get<int64_t>());
    case Json::value_t::number_unsigned:
      return std::to_string(j.get<uint64_t>());
    case Json::value_t::number_float:
      return python_float_repr(j.get<double>());
    case Json::value_t::string:
      return py_repr_string(j.get_ref<const std::string&>());
    case Json::value_t::array: {
      std::string out = "[";
      for (size_t i = 0; i < j.size(); ++i) out += (i ? ", " : "") + py_repr(j[i]);
      return out + "]";
    }
    case Json::value_t::object: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : j.items()) {
        out += (first ? "" : ", ") + py_repr_string(k) + ": " + py_repr(v);
        first = false;
      }
      return out + "}";
    }
    default:
      return "None";
  }
}

// Python's str() of a value, as `{{ }}` prints it.
std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNamespace:
      return "<Namespace " + py_repr(*v.ns) + ">";
    case Value::Kind::kFunction:
      return "<function " + v.name + ">";
    case Value::Kind::kData:
      break;
  }
  return v.data.is_string() ? v.data.get<std::string>() : py_repr(v.data);
}

bool truthy(const Value& v) {
  if (v.kind == Value::Kind::kUndefined) return false;
  if (v.kind != Value::Kind::kData) return true;
  const Json& j = v.data;
  switch (j.type()) {
    case Json::value_t::null:
      return false;
    case Json::value_t::boolean:
      return j.get<bool>();
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return j.get<int64_t>() != 0;
    case Json::value_t::number_float:
      return j.get<double>() != 0.0;
    case Json::value_t::string:
      return !j.get_ref<const std::string&>().empty();  // json::empty() is false for every string
    case Json::value_t::array:
    case Json::value_t::object:
      return !j.empty();
    default:
      return false;
  }
}

// Python ==: numbers across int/float (and bools as 0/1), everything else by type and value.
bool equal(const Value& a, const Value& b) {
  if (a.kind != Value::Kind::kData || b.kind != Value::Kind::kData) {
    if (a.kind == Value::Kind::kNamespace && b.kind == Value::Kind::kNamespace) return a.ns == b.ns;
    return a.kind == b.kind && a.kind == Value::Kind::kUndefined;
  }
  const auto numeric = [](const Json& j) { return j.is_number() || j.is_boolean(); };
  if (numeric(a.data) && numeric(b.data)) {
    const auto num = [](const Json& j) { return j.is_boolean() ? (j.get<bool>() ? 1.0 : 0.0) : j.get<double>(); };
    if (a.data.is_number_integer() && b.data.is_number_integer()) return a.data.get<int64_t>() == b.data.get<int64_t>();
    return num(a.data) == num(b.data);
  }
  return a.data == b.data;
}

// ---- Template source -> pieces ------------------------------------------------------------------------------------

struct Piece {
  enum class Kind { kText, kVar, kBlock } kind;
  std::string text;
  int line;
};

[[noreturn]] void syntax_error(const std::string& name, int line, const std::string& what) {
  throw Error(kComponent, fmt::format("{}:{}: {}", name, line, what));
}

bool only_blanks(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; });
}

int count_lines(std::string_view s) {
  return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
}

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

// ---- Expressions ---------------------------------------------------------------------------------------------------

struct Token {
  enum class Kind { kName, kString, kInt, kFloat, kOp, kEnd } kind;
  std::string text;
  Json value;
};

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
            append_utf8(v, cp);
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

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,
    kName,
    kList,
    kDict,
    kAttr,
    kItem,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kNeg,
    kNot,
    kAnd,
    kOr,
    kBinary,
    kCond
  } kind;
  int line = 0;
  Json literal;               // kLiteral
  std::string name;           // kName, kAttr, kFilter, kTest (its name), kBinary (the operator)
  bool negate = false;        // kTest: `is not`
  std::vector<ExprPtr> kids;  // operands; kDict: key, value, key, value...; kSlice: nullptr gaps
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // kCall, kFilter, kTest
  int depth = 1;                                        // of the tree below, bounded by the parser
};

// Bounds on what a template may nest (expressions, blocks) and compute (range sizes, repeated strings), so that
// a hostile tokenizer_config.json cannot exhaust the stack or memory.
constexpr int kMaxExprDepth = 200;
constexpr int kMaxBlockDepth = 100;
constexpr int64_t kMaxRange = 100000;  // jinja2's sandbox limit (MAX_RANGE)
constexpr size_t kMaxString = size_t{1} << 26;
constexpr int64_t kMaxSteps = 1000000;  // statements and loop iterations one render may execute
constexpr int64_t kMaxIndent = 1000;    // widths of `indent` and `tojson(indent=...)`

ExprPtr make(Expr::Kind k, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = k;
  e->line = line;
  return e;
}

class Parser {
 public:
  Parser(std::vector<Token> tokens, const std::string& name, int line)
      : t_(std::move(tokens)), name_(name), line_(line) {}

  [[noreturn]] void fail(const std::string& what) const { syntax_error(name_, line_, what); }
  const Token& peek(size_t k = 0) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  bool at_op(const char* op) const { return peek().kind == Token::Kind::kOp && peek().text == op; }
  bool at_name(const char* n) const { return peek().kind == Token::Kind::kName && peek().text == n; }
  bool at_end() const { return peek().kind == Token::Kind::kEnd; }
  void expect_op(const char* op) {
    if (!at_op(op)) fail(fmt::format("expected '{}', got {}", op, describe(peek())));
    ++i_;
  }
  std::string expect_name() {
    if (peek().kind != Token::Kind::kName) fail(fmt::format("expected a name, got {}", describe(peek())));
    return t_[i_++].text;
  }
  void expect_end() {
    if (!at_end()) fail(fmt::format("unexpected {}", describe(peek())));
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case Token::Kind::kEnd:
        return "the end of the tag";
      case Token::Kind::kString:
        return "a string";
      default:
        return "'" + t.text + "'";
    }
  }
  void skip() { ++i_; }

  // Counts the parser's own recursion (parentheses, unary operators, `not`), which nests before any node exists.
  struct Nesting {
    explicit Nesting(Parser& p) : p_(p) {
      if (++p_.nesting_ > kMaxExprDepth) p_.fail("expression nested too deeply");
    }
    ~Nesting() { --p_.nesting_; }
    Nesting(const Nesting&) = delete;
    Nesting& operator=(const Nesting&) = delete;
    Parser& p_;
  };

  // Appends `kid` to `e`, keeping the tree's depth within kMaxExprDepth.
  void add(Expr& e, ExprPtr kid, bool allow_null = false) {
    if (kid) {
      e.depth = std::max(e.depth, kid->depth + 1);
      if (e.depth > kMaxExprDepth) fail("expression nested too deeply");
    } else if (!allow_null) {
      fail("missing operand");
    }
    e.kids.push_back(std::move(kid));
  }

  // `with_cond`: a trailing `if` makes a conditional expression (not in a for loop's iterable, where it filters).
  ExprPtr expression(bool with_cond = true) {
    const Nesting nesting(*this);
    ExprPtr e = or_expr();
    if (with_cond && at_name("if")) {
      ++i_;
      auto c = make(Expr::Kind::kCond, line_);
      ExprPtr cond = or_expr();
      ExprPtr other;
      if (at_name("else")) {
        ++i_;
        other = expression();
      }
      add(*c, std::move(cond));
      add(*c, std::move(e));
      add(*c, std::move(other), /*allow_null=*/true);
      return c;
    }
    return e;
  }

  // A comma-separated expression list that forms a tuple when it has a comma (`{% for a, b in ... %}` targets use
  // names only, handled by the statement parser).
  ExprPtr tuple_or_expression() {
    ExprPtr first = expression();
    if (!at_op(",")) return first;
    auto list = make(Expr::Kind::kList, line_);
    add(*list, std::move(first));
    while (at_op(",")) {
      ++i_;
      if (at_end()) break;
      add(*list, expression());
    }
    return list;
  }

 private:
  ExprPtr binary(Expr::Kind k, ExprPtr a, ExprPtr b, std::string op = {}) {
    auto e = make(k, line_);
    e->name = std::move(op);
    add(*e, std::move(a));
    add(*e, std::move(b));
    return e;
  }
  ExprPtr or_expr() {
    ExprPtr e = and_expr();
    while (at_name("or")) {
      ++i_;
      e = binary(Expr::Kind::kOr, std::move(e), and_expr());
    }
    return e;
  }
  ExprPtr and_expr() {
    ExprPtr e = not_expr();
    while (at_name("and")) {
      ++i_;
      e = binary(Expr::Kind::kAnd, std::move(e), not_expr());
    }
    return e;
  }
  ExprPtr not_expr() {
    const Nesting nesting(*this);
    if (at_name("not")) {
      ++i_;
      auto e = make(Expr::Kind::kNot, line_);
      add(*e, not_expr());
      return e;
    }
    return compare();
  }
  ExprPtr compare() {
    ExprPtr e = arithmetic();
    while (true) {
      std::string op;
      if (peek().kind == Token::Kind::kOp && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                              peek().text == "<=" || peek().text == ">" || peek().text == ">=")) {
        op = peek().text;
        ++i_;
      } else if (at_name("in")) {
        op = "in";
        ++i_;
      } else if (at_name("not") && peek(1).kind == Token::Kind::kName && peek(1).text == "in") {
        op = "notin";
        i_ += 2;
      } else {
        return e;
      }
      e = binary(Expr::Kind::kBinary, std::move(e), arithmetic(), op);
    }
  }
  // The operator levels between comparisons and unary operators, loosest first (jinja2's parse_math1, parse_concat,
  // parse_math2, parse_pow), each left-associative over the next.
  ExprPtr arithmetic(size_t level = 0) {
    static const std::vector<std::vector<std::string>> kLevels = {{"+", "-"}, {"~"}, {"*", "/", "//", "%"}, {"**"}};
    if (level == kLevels.size()) return unary();
    ExprPtr e = arithmetic(level + 1);
    while (peek().kind == Token::Kind::kOp) {
      const std::vector<std::string>& ops = kLevels[level];
      if (std::find(ops.begin(), ops.end(), peek().text) == ops.end()) break;
      const std::string op = t_[i_++].text;
      e = binary(Expr::Kind::kBinary, std::move(e), arithmetic(level + 1), op);
    }
    return e;
  }
  // jinja2's parse_unary: `-x|f` is (-x)|f, the filters applying once, outside the sign.
  ExprPtr unary(bool with_filter = true) {
    const Nesting nesting(*this);
    ExprPtr e;
    if (at_op("-")) {
      ++i_;
      e = make(Expr::Kind::kNeg, line_);
      add(*e, unary(false));
    } else if (at_op("+")) {
      ++i_;
      e = unary(false);
    } else {
      e = postfix(primary());
    }
    return with_filter ? filters(std::move(e)) : std::move(e);
  }
  void call_args(Expr& e) {
    expect_op("(");
    while (!at_op(")")) {
      if (peek().kind == Token::Kind::kName && peek(1).kind == Token::Kind::kOp && peek(1).text == "=") {
        std::string key = t_[i_].text;
        i_ += 2;
        e.kwargs.emplace_back(std::move(key), expression());
      } else {
        add(e, expression());
      }
      if (!at_op(",")) break;
      ++i_;
    }
    expect_op(")");
  }
  ExprPtr primary() {
    const Token& t = peek();
    switch (t.kind) {
      case Token::Kind::kString: {
        auto e = make(Expr::Kind::kLiteral, line_);
        std::string s = t.value.get<std::string>();
        ++i_;
        while (peek().kind == Token::Kind::kString) s += t_[i_++].value.get<std::string>();  // "a" "b"
        e->literal = s;
        return e;
      }
      case Token::Kind::kInt:
      case Token::Kind::kFloat: {
        auto e = make(Expr::Kind::kLiteral, line_);
        e->literal = t.value;
        ++i_;
        return e;
      }
      case Token::Kind::kName: {
        ++i_;
        auto e = make(Expr::Kind::kLiteral, line_);
        if (t.text == "true" || t.text == "True") {
          e->literal = true;
        } else if (t.text == "false" || t.text == "False") {
          e->literal = false;
        } else if (t.text == "none" || t.text == "None") {
          e->literal = nullptr;
        } else {
          e->kind = Expr::Kind::kName;
          e->name = t.text;
        }
        return e;
      }
      case Token::Kind::kOp:
        break;
      case Token::Kind::kEnd:
        fail("unexpected end of the tag");
    }
    if (t.text == "(") {
      ++i_;
      if (at_op(")")) {
        ++i_;
        return make(Expr::Kind::kList, line_);
      }
      ExprPtr e = tuple_or_expression();
      expect_op(")");
      return e;
    }
    if (t.text == "[") {
      ++i_;
      auto e = make(Expr::Kind::kList, line_);
      while (!at_op("]")) {
        add(*e, expression());
        if (!at_op(",")) break;
        ++i_;
      }
      expect_op("]");
      return e;
    }
    if (t.text == "{") {
      ++i_;
      auto e = make(Expr::Kind::kDict, line_);
      while (!at_op("}")) {
        add(*e, expression());
        expect_op(":");
        add(*e, expression());
        if (!at_op(",")) break;
        ++i_;
      }
      expect_op("}");
      return e;
    }
    fail(fmt::format("unexpected {}", describe(t)));
  }
  ExprPtr postfix(ExprPtr e) {
    while (true) {
      if (at_op(".")) {
        ++i_;
        auto a = make(Expr::Kind::kAttr, line_);
        if (peek().kind == Token::Kind::kInt) {  // foo.0 is foo[0]
          a->kind = Expr::Kind::kItem;
          auto idx = make(Expr::Kind::kLiteral, line_);
          idx->literal = t_[i_++].value;
          add(*a, std::move(e));
          add(*a, std::move(idx));
        } else {
          a->name = expect_name();
          add(*a, std::move(e));
        }
        e = std::move(a);
      } else if (at_op("[")) {
        ++i_;
        ExprPtr parts[3];
        int n = 0;
        bool slice = false;
        while (true) {
          if (!at_op(":") && !at_op("]")) parts[n] = expression();
          if (at_op(":") && n < 2) {
            ++i_;
            ++n;
            slice = true;
            continue;
          }
          break;
        }
        expect_op("]");
        auto s = make(slice ? Expr::Kind::kSlice : Expr::Kind::kItem, line_);
        add(*s, std::move(e));
        if (slice) {
          for (auto& p : parts) add(*s, std::move(p), /*allow_null=*/true);
        } else {
          if (!parts[0]) fail("empty subscript");
          add(*s, std::move(parts[0]));
        }
        e = std::move(s);
      } else if (at_op("(")) {
        auto c = make(Expr::Kind::kCall, line_);
        add(*c, std::move(e));
        call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }
  ExprPtr filters(ExprPtr e) {
    while (true) {
      if (at_op("|")) {
        ++i_;
        auto f = make(Expr::Kind::kFilter, line_);
        f->name = expect_name();
        add(*f, std::move(e));
        if (at_op("(")) call_args(*f);
        e = std::move(f);
      } else if (at_name("is")) {
        ++i_;
        auto t = make(Expr::Kind::kTest, line_);
        if (at_name("not")) {
          ++i_;
          t->negate = true;
        }
        t->name = expect_name();
        add(*t, std::move(e));
        if (at_op("(")) {
          call_args(*t);
        } else if (peek().kind == Token::Kind::kString || peek().kind == Token::Kind::kInt ||
                   peek().kind == Token::Kind::kFloat || at_op("[") || at_op("{") ||
                   (peek().kind == Token::Kind::kName && !at_name("and") && !at_name("or") && !at_name("else") &&
                    !at_name("if") && !at_name("is") && !at_name("in") && !at_name("not"))) {
          add(*t, postfix(primary()));  // `is divisibleby 3`, `is equalto 'x'`
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  const std::string& name_;
  int line_;
  int nesting_ = 0;
};

// ---- Statements --------------------------------------------------------------------------------------------------

struct Stmt {
  enum class Kind { kText, kOutput, kIf, kFor, kSet, kBreak, kContinue, kBlock } kind;
  int line = 0;
  std::string text;                                             // kText
  ExprPtr expr;                                                 // kOutput; kFor: the iterable; kSet: the value
  std::vector<std::pair<ExprPtr, std::vector<Stmt>>> branches;  // kIf: (condition, body); the else has none
  std::vector<std::string> targets;                             // kFor loop variables; kSet names
  std::string attr;                                             // kSet: `ns.attr`
  ExprPtr filter;                                               // kFor: `if` condition
  std::vector<Stmt> body, else_body;                            // kFor, kBlock
};

}  // namespace

struct Program {
  std::vector<Stmt> body;
};

namespace {

class StatementParser {
 public:
  StatementParser(std::vector<Piece> pieces, const std::string& name) : p_(std::move(pieces)), name_(name) {}

  std::vector<Stmt> parse_all() {
    std::string stop;
    std::vector<Stmt> body = parse_until({}, stop);
    return body;
  }

 private:
  struct Tag {
    std::string keyword;
    std::unique_ptr<Parser> parser;
    int line;
  };

  Tag open_tag(const Piece& piece) {
    Tag t;
    t.line = piece.line;
    t.parser = std::make_unique<Parser>(tokenize(piece.text, name_, piece.line), name_, piece.line);
    if (t.parser->peek().kind != Token::Kind::kName) t.parser->fail("expected a statement name");
    t.keyword = t.parser->peek().text;
    t.parser->skip();
    return t;
  }

  // Statements up to one of `stops` (a block tag keyword), which is returned in `stop` with its parser in `tag_`.
  std::vector<Stmt> parse_until(const std::set<std::string>& stops, std::string& stop) {
    std::vector<Stmt> out;
    while (i_ < p_.size()) {
      const Piece& piece = p_[i_++];
      if (piece.kind == Piece::Kind::kText) {
        Stmt s;
        s.kind = Stmt::Kind::kText;
        s.line = piece.line;
        s.text = piece.text;
        out.push_back(std::move(s));
        continue;
      }
      if (piece.kind == Piece::Kind::kVar) {
        Parser parser(tokenize(piece.text, name_, piece.line), name_, piece.line);
        Stmt s;
        s.kind = Stmt::Kind::kOutput;
        s.line = piece.line;
        s.expr = parser.expression();
        parser.expect_end();
        out.push_back(std::move(s));
        continue;
      }
      Tag tag = open_tag(piece);
      if (stops.count(tag.keyword)) {
        stop = tag.keyword;
        tag_ = std::move(tag);
        return out;
      }
      out.push_back(statement(std::move(tag)));
    }
    if (!stops.empty()) {
      const auto end =
          std::find_if(stops.begin(), stops.end(), [](const std::string& t) { return t.rfind("end", 0) == 0; });
      syntax_error(
          name_, p_.empty() ? 1 : p_.back().line,
          fmt::format("unexpected end of template, expected '{}'", end != stops.end() ? *end : *stops.begin()));
    }
    return out;
  }

  Stmt statement(Tag tag) {
    if (++depth_ > kMaxBlockDepth) syntax_error(name_, tag.line, "blocks nested too deeply");
    Stmt s = statement_body(std::move(tag));
    --depth_;
    return s;
  }

  Stmt statement_body(Tag tag) {
    Stmt s;
    s.line = tag.line;
    Parser& p = *tag.parser;
    const std::string& kw = tag.keyword;
    if (kw == "if") {
      s.kind = Stmt::Kind::kIf;
      ExprPtr cond = p.expression();
      p.expect_end();
      while (true) {
        std::string stop;
        std::vector<Stmt> body = parse_until({"elif", "else", "endif"}, stop);
        s.branches.emplace_back(std::move(cond), std::move(body));
        if (stop == "endif") break;
        if (stop == "elif") {
          cond = tag_.parser->expression();
          tag_.parser->expect_end();
          continue;
        }
        tag_.parser->expect_end();
        std::vector<Stmt> else_body = parse_until({"endif"}, stop);
        s.branches.emplace_back(nullptr, std::move(else_body));
        break;
      }
      tag_.parser->expect_end();
    } else if (kw == "for") {
      s.kind = Stmt::Kind::kFor;
      s.targets.push_back(p.expect_name());
      while (p.at_op(",")) {
        p.skip();
        s.targets.push_back(p.expect_name());
      }
      if (!p.at_name("in")) p.fail("expected 'in' in a for loop");
      p.skip();
      s.expr = p.expression(/*with_cond=*/false);
      if (p.at_name("if")) {
        p.skip();
        s.filter = p.expression();
      }
      if (p.at_name("recursive")) p.fail("recursive loops are not supported");
      p.expect_end();
      std::string stop;
      s.body = parse_until({"else", "endfor"}, stop);
      if (stop == "else") {
        tag_.parser->expect_end();
        s.else_body = parse_until({"endfor"}, stop);
      }
      tag_.parser->expect_end();
    } else if (kw == "set") {
      s.kind = Stmt::Kind::kSet;
      s.targets.push_back(p.expect_name());
      if (p.at_op(".")) {
        p.skip();
        s.attr = p.expect_name();
      }
      while (p.at_op(",")) {
        p.skip();
        s.targets.push_back(p.expect_name());
      }
      if (!p.at_op("=")) p.fail("block assignments ({% set x %}...{% endset %}) are not supported");
      p.skip();
      s.expr = p.tuple_or_expression();
      p.expect_end();
    } else if (kw == "break" || kw == "continue") {
      s.kind = kw == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      p.expect_end();
    } else if (kw == "generation") {
      s.kind = Stmt::Kind::kBlock;
      p.expect_end();
      std::string stop;
      s.body = parse_until({"endgeneration"}, stop);
      tag_.parser->expect_end();
    } else {
      syntax_error(name_, tag.line, fmt::format("unsupported tag '{}'", kw));
    }
    return s;
  }

  std::vector<Piece> p_;
  size_t i_ = 0;
  const std::string& name_;
  Tag tag_;
  int depth_ = 0;
};

// ---- Evaluation --------------------------------------------------------------------------------------------------

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  Renderer(const std::string& name, const Json& context) : name_(name) {
    frames_.emplace_back();
    if (context.is_object()) {
      for (const auto& [k, v] : context.items()) frames_.back()[k] = Value::of(v);
    }
  }

  Flow run(const std::vector<Stmt>& body, std::string& out) {
    for (const Stmt& s : body) {
      const Flow f = exec(s, out);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

 private:
  [[noreturn]] void fail(int line, const std::string& what) const {
    throw Error(kComponent, fmt::format("{}:{}: {}", name_, line, what));
  }

  // Counts one statement or loop iteration against kMaxSteps, so that nested loops cannot run for hours.
  void tick(int line) {
    if (++steps_ > kMaxSteps) fail(line, fmt::format("the template ran more than {} statements", kMaxSteps));
  }

  std::string bounded(std::string s, int line) const {
    if (s.size() > kMaxString) fail(line, "string too long");
    return s;
  }

  int64_t indent_width(int64_t width, int line) const {
    if (width > kMaxIndent)
      fail(line, fmt::format("indent width {} is larger than the limit of {}", width, kMaxIndent));
    return width;
  }

  Value lookup(const std::string& n) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      if (auto f = it->find(n); f != it->end()) return f->second;
    }
    static const std::set<std::string> kGlobals = {"namespace", "range", "dict", "raise_exception", "strftime_now"};
    if (kGlobals.count(n)) {
      Value v;
      v.kind = Value::Kind::kFunction;
      v.name = n;
      return v;
    }
    return Value::undefined(n);
  }

  Flow exec(const Stmt& s, std::string& out) {
    tick(s.line);
    if (out.size() > kMaxString) fail(s.line, "the rendered text is too long");
    switch (s.kind) {
      case Stmt::Kind::kText:
        out += s.text;
        return Flow::kNormal;
      case Stmt::Kind::kOutput:
        out += to_str(eval(*s.expr));
        return Flow::kNormal;
      case Stmt::Kind::kIf:
        for (const auto& [cond, body] : s.branches) {
          if (!cond || truthy(eval(*cond))) return run(body, out);
        }
        return Flow::kNormal;
      case Stmt::Kind::kSet: {
        Value v = eval(*s.expr);
        if (!s.attr.empty()) {
          Value ns = lookup(s.targets[0]);
          if (ns.kind != Value::Kind::kNamespace) fail(s.line, fmt::format("'{}' is not a namespace", s.targets[0]));
          (*ns.ns)[s.attr] = data_of(v, s.line);
        } else if (s.targets.size() == 1) {
          frames_.back()[s.targets[0]] = v;
        } else {
          if (!v.is_list() || v.data.size() != s.targets.size()) fail(s.line, "cannot unpack the value");
          for (size_t k = 0; k < s.targets.size(); ++k) frames_.back()[s.targets[k]] = Value::of(v.data[k]);
        }
        return Flow::kNormal;
      }
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
      case Stmt::Kind::kBlock:
        return run(s.body, out);
      case Stmt::Kind::kFor:
        return exec_for(s, out);
    }
    return Flow::kNormal;
  }

  Flow exec_for(const Stmt& s, std::string& out) {
    const Value seq = eval(*s.expr);
    std::vector<Json> items = iterate(seq, s.line);
    frames_.emplace_back();
    if (s.filter) {
      std::vector<Json> kept;
      for (Json& item : items) {
        tick(s.line);
        bind(s, item);
        if (truthy(eval(*s.filter))) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      tick(s.line);
      bind(s, items[static_cast<size_t>(k)]);
      Json loop = {{"index", k + 1},  {"index0", k},        {"revindex", n - k}, {"revindex0", n - k - 1},
                   {"first", k == 0}, {"last", k == n - 1}, {"length", n},       {"depth", 1},
                   {"depth0", 0}};
      if (k > 0) loop["previtem"] = items[static_cast<size_t>(k - 1)];
      if (k + 1 < n) loop["nextitem"] = items[static_cast<size_t>(k + 1)];
      frames_.back()["loop"] = Value::of(std::move(loop));
      const Flow f = run(s.body, out);
      if (f == Flow::kBreak) break;
    }
    frames_.pop_back();
    if (n == 0 && !s.else_body.empty()) return run(s.else_body, out);
    return Flow::kNormal;
  }

  void bind(const Stmt& s, const Json& item) {
    if (s.targets.size() == 1) {
      frames_.back()[s.targets[0]] = Value::of(item);
      return;
    }
    if (!item.is_array() || item.size() != s.targets.size()) fail(s.line, "cannot unpack a loop item");
    for (size_t k = 0; k < s.targets.size(); ++k) frames_.back()[s.targets[k]] = Value::of(item[k]);
  }

  std::vector<Json> iterate(const Value& v, int line) const {
    std::vector<Json> out;
    if (!v.defined()) return out;  // jinja2's Undefined iterates as empty
    if (v.kind == Value::Kind::kData) {
      if (v.data.is_array()) return std::vector<Json>(v.data.begin(), v.data.end());
      if (v.data.is_object()) {
        for (const auto& [k, val] : v.data.items()) out.emplace_back(k);
        return out;
      }
      if (v.data.is_string()) {
        const std::string& s = v.data.get_ref<const std::string&>();
        const std::vector<size_t> at = code_point_offsets(s);
        for (size_t k = 0; k + 1 < at.size(); ++k) out.emplace_back(s.substr(at[k], at[k + 1] - at[k]));
        return out;
      }
    }
    fail(line, fmt::format("'{}' is not iterable", type_name(v)));
  }

  static std::string type_name(const Value& v) {
    switch (v.kind) {
      case Value::Kind::kUndefined:
        return "undefined";
      case Value::Kind::kNamespace:
        return "namespace";
      case Value::Kind::kFunction:
        return "function";
      case Value::Kind::kData:
        break;
    }
    switch (v.data.type()) {
      case Json::value_t::null:
        return "NoneType";
      case Json::value_t::boolean:
        return "bool";
      case Json::value_t::number_float:
        return "float";
      case Json::value_t::string:
        return "str";
      case Json::value_t::array:
        return "list";
      case Json::value_t::object:
        return "dict";
      default:
        return "int";
    }
  }

  Json data_of(const Value& v, int line) const {
    if (v.kind == Value::Kind::kData) return v.data;
    if (v.kind == Value::Kind::kNamespace) return *v.ns;
    if (v.kind == Value::Kind::kUndefined) return nullptr;
    fail(line, "a function is not a value here");
  }

  Value require_defined(Value v, int line) const {
    if (!v.defined()) fail(line, fmt::format("'{}' is undefined", v.name));
    return v;
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return Value::of(e.literal);
      case Expr::Kind::kName:
        return lookup(e.name);
      case Expr::Kind::kList: {
        Json list = Json::array();
        for (const auto& k : e.kids) list.push_back(data_of(eval(*k), e.line));
        return Value::of(std::move(list));
      }
      case Expr::Kind::kDict: {
        Json dict = Json::object();
        for (size_t k = 0; k + 1 < e.kids.size(); k += 2) {
          const Value key = eval(*e.kids[k]);
          dict[to_str(key)] = data_of(eval(*e.kids[k + 1]), e.line);
        }
        return Value::of(std::move(dict));
      }
      case Expr::Kind::kAttr:
        return attribute(require_defined(eval(*e.kids[0]), e.line), e.name);
      case Expr::Kind::kItem:
        return item(require_defined(eval(*e.kids[0]), e.line), eval(*e.kids[1]), e.line);
      case Expr::Kind::kSlice:
        return slice(e);
      case Expr::Kind::kCall:
        return call(e);
      case Expr::Kind::kFilter:
        return filter(e);
      case Expr::Kind::kTest: {
        const bool r = test(e);
        return Value::of(e.negate ? !r : r);
      }
      case Expr::Kind::kNeg: {
        const Value v = eval(*e.kids[0]);
        if (v.is_integer()) {
          if (v.data.get<int64_t>() == INT64_MIN) fail(e.line, "integer overflow");
          return Value::of(-v.data.get<int64_t>());
        }
        if (v.is_number()) return Value::of(-v.data.get<double>());
        fail(e.line, fmt::format("bad operand type for unary -: '{}'", type_name(v)));
      }
      case Expr::Kind::kNot:
        return Value::of(!truthy(eval(*e.kids[0])));
      case Expr::Kind::kAnd: {
        Value a = eval(*e.kids[0]);
        return truthy(a) ? eval(*e.kids[1]) : a;
      }
      case Expr::Kind::kOr: {
        Value a = eval(*e.kids[0]);
        return truthy(a) ? a : eval(*e.kids[1]);
      }
      case Expr::Kind::kCond:
        if (truthy(eval(*e.kids[0]))) return eval(*e.kids[1]);
        return e.kids[2] ? eval(*e.kids[2]) : Value::undefined("else branch");
      case Expr::Kind::kBinary:
        return binary(e);
    }
    fail(e.line, "unknown expression");
  }

  Value attribute(const Value& obj, const std::string& attr) const {
    if (obj.kind == Value::Kind::kNamespace) {
      auto it = obj.ns->find(attr);
      return it == obj.ns->end() ? Value::undefined(attr) : Value::of(*it);
    }
    if (obj.is_dict()) {
      auto it = obj.data.find(attr);
      return it == obj.data.end() ? Value::undefined(attr) : Value::of(*it);
    }
    return Value::undefined(attr);
  }

  static int64_t normalize_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }

  Value item(const Value& obj, const Value& key, int line) const {
    if (obj.is_dict()) {
      if (!key.is_string()) return Value::undefined(to_str(key));
      auto it = obj.data.find(key.data.get<std::string>());
      return it == obj.data.end() ? Value::undefined(key.data.get<std::string>()) : Value::of(*it);
    }
    if (obj.kind == Value::Kind::kNamespace && key.is_string()) return attribute(obj, key.data.get<std::string>());
    if ((obj.is_list() || obj.is_string()) && key.is_integer()) {
      if (obj.is_list()) {
        const int64_t i = normalize_index(key.data.get<int64_t>(), static_cast<int64_t>(obj.data.size()));
        if (i < 0 || i >= static_cast<int64_t>(obj.data.size())) return Value::undefined("index");
        return Value::of(obj.data[static_cast<size_t>(i)]);
      }
      const std::string& s = obj.data.get_ref<const std::string&>();
      const std::vector<size_t> at = code_point_offsets(s);
      const auto n = static_cast<int64_t>(at.size()) - 1;
      const int64_t i = normalize_index(key.data.get<int64_t>(), n);
      if (i < 0 || i >= n) return Value::undefined("index");
      return Value::of(
          s.substr(at[static_cast<size_t>(i)], at[static_cast<size_t>(i) + 1] - at[static_cast<size_t>(i)]));
    }
    if (key.is_string()) return attribute(obj, key.data.get<std::string>());
    fail(line, fmt::format("'{}' object is not subscriptable with {}", type_name(obj), type_name(key)));
  }

  Value slice(const Expr& e) {
    const Value obj = require_defined(eval(*e.kids[0]), e.line);
    std::optional<int64_t> part[3];
    for (int k = 0; k < 3; ++k) {
      if (!e.kids[static_cast<size_t>(k) + 1]) continue;
      const Value v = eval(*e.kids[static_cast<size_t>(k) + 1]);
      if (v.is_none()) continue;
      if (!v.is_integer()) fail(e.line, "slice indices must be integers");
      part[k] = v.data.get<int64_t>();
    }
    std::vector<Json> items;
    const bool is_str = obj.is_string();
    if (is_str) {
      items = iterate(obj, e.line);
    } else if (obj.is_list()) {
      items.assign(obj.data.begin(), obj.data.end());
    } else {
      fail(e.line, fmt::format("'{}' object cannot be sliced", type_name(obj)));
    }
    const auto n = static_cast<int64_t>(items.size());
    const int64_t step = part[2].value_or(1);
    if (step == 0) fail(e.line, "slice step cannot be zero");
    // Python's slice.indices().
    const auto clamp = [&](std::optional<int64_t> v, int64_t dflt, int64_t lo, int64_t hi) {
      if (!v) return dflt;
      int64_t x = *v < 0 ? *v + n : *v;
      return std::clamp(x, lo, hi);
    };
    const int64_t start = step > 0 ? clamp(part[0], 0, 0, n) : clamp(part[0], n - 1, -1, n - 1);
    const int64_t stop = step > 0 ? clamp(part[1], n, 0, n) : clamp(part[1], -1, -1, n - 1);
    Json out = is_str ? Json("") : Json::array();
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (is_str) {
        out.get_ref<std::string&>() += items[static_cast<size_t>(i)].get<std::string>();
      } else {
        out.push_back(items[static_cast<size_t>(i)]);
      }
    }
    return Value::of(std::move(out));
  }

  // Positional and keyword arguments, evaluated.
  struct Args {
    std::vector<Value> pos;
    std::map<std::string, Value> kw;
    const Value* get(size_t i, const std::string& key) const {
      if (i < pos.size()) return &pos[i];
      auto it = kw.find(key);
      return it == kw.end() ? nullptr : &it->second;
    }
  };
  Args args_of(const Expr& e, size_t first) {
    Args a;
    for (size_t k = first; k < e.kids.size(); ++k) a.pos.push_back(eval(*e.kids[k]));
    for (const auto& [key, v] : e.kwargs) a.kw[key] = eval(*v);
    return a;
  }

  std::string string_arg(const Args& a, size_t i, const std::string& key, int line, const char* what) const {
    const Value* v = a.get(i, key);
    if (!v || !v->is_string()) fail(line, fmt::format("{} expects a string argument", what));
    return v->data.get<std::string>();
  }

  Value call(const Expr& e) {
    const Expr& callee = *e.kids[0];
    if (callee.kind == Expr::Kind::kAttr) {  // a method
      const Value obj = require_defined(eval(*callee.kids[0]), e.line);
      const Args a = args_of(e, 1);
      return method(obj, callee.name, a, e.line);
    }
    const Value f = eval(callee);
    const Args a = args_of(e, 1);
    if (f.kind != Value::Kind::kFunction) {
      fail(e.line, fmt::format("'{}' is not callable", f.defined() ? type_name(f) : f.name));
    }
    if (f.name == "raise_exception") {
      throw Error(kComponent, fmt::format("{}: {}", name_, a.pos.empty() ? std::string() : to_str(a.pos[0])));
    }
    if (f.name == "namespace" || f.name == "dict") {
      Json obj = Json::object();
      for (const Value& p : a.pos) {
        if (!p.is_dict()) fail(e.line, fmt::format("{}() takes keyword arguments or a dict", f.name));
        for (const auto& [k, v] : p.data.items()) obj[k] = v;
      }
      for (const auto& [k, v] : a.kw) obj[k] = data_of(v, e.line);
      if (f.name == "dict") return Value::of(std::move(obj));
      Value ns;
      ns.kind = Value::Kind::kNamespace;
      ns.ns = std::make_shared<Json>(std::move(obj));
      return ns;
    }
    if (f.name == "range") {
      std::vector<int64_t> n;
      for (const Value& p : a.pos) {
        if (!p.is_integer()) fail(e.line, "range() takes integers");
        n.push_back(p.data.get<int64_t>());
      }
      if (n.empty() || n.size() > 3) fail(e.line, "range() takes 1 to 3 arguments");
      const int64_t start = n.size() == 1 ? 0 : n[0], stop = n.size() == 1 ? n[0] : n[1],
                    step = n.size() == 3 ? n[2] : 1;
      if (step == 0) fail(e.line, "range() step must not be zero");
      const double count =
          std::ceil((static_cast<double>(stop) - static_cast<double>(start)) / static_cast<double>(step));
      if (count > static_cast<double>(kMaxRange))
        fail(e.line, fmt::format("range() of {} items is larger than the limit of {}", count, kMaxRange));
      Json out = Json::array();
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(i);
      return Value::of(std::move(out));
    }
    if (f.name == "strftime_now") {
      const std::string fmt_text = string_arg(a, 0, "format", e.line, "strftime_now");
      const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const size_t len = std::strftime(buf, sizeof(buf), fmt_text.c_str(), &tm);
      return Value::of(std::string(buf, len));
    }
    fail(e.line, fmt::format("unknown function '{}'", f.name));
  }

  static std::vector<std::string> py_split(const std::string& s, const std::optional<std::string>& sep,
                                           int64_t maxsplit) {
    std::vector<std::string> out;
    if (sep) {
      size_t pos = 0;
      while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
        const size_t at = s.find(*sep, pos);
        if (at == std::string::npos) break;
        out.push_back(s.substr(pos, at - pos));
        pos = at + sep->size();
      }
      out.push_back(s.substr(pos));
      return out;
    }
    const std::vector<size_t> at = code_point_offsets(s);
    size_t k = 0;
    const size_t n = at.size() - 1;
    while (k < n) {
      while (k < n && is_py_space(decode_at(s, at[k]))) ++k;
      if (k == n) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        std::string rest = s.substr(at[k]);
        out.push_back(py_strip(rest, false, true, std::nullopt));
        return out;
      }
      size_t j = k;
      while (j < n && !is_py_space(decode_at(s, at[j]))) ++j;
      out.push_back(s.substr(at[k], at[j] - at[k]));
      k = j;
    }
    return out;
  }

  Value method(const Value& obj, const std::string& m, const Args& a, int line) {
    if (obj.is_string()) {
      const std::string& s = obj.data.get_ref<const std::string&>();
      const auto opt_chars = [&](size_t i) -> std::optional<std::string> {
        const Value* v = a.get(i, "chars");
        if (!v || v->is_none()) return std::nullopt;
        if (!v->is_string()) fail(line, m + "() takes a string");
        return v->data.get<std::string>();
      };
      if (m == "strip") return Value::of(py_strip(s, true, true, opt_chars(0)));
      if (m == "lstrip") return Value::of(py_strip(s, true, false, opt_chars(0)));
      if (m == "rstrip") return Value::of(py_strip(s, false, true, opt_chars(0)));
      if (m == "upper") return Value::of(ascii_map(s, [](int c) { return std::toupper(c); }));
      if (m == "lower") return Value::of(ascii_map(s, [](int c) { return std::tolower(c); }));
      if (m == "title") return Value::of(py_title(s));
      if (m == "capitalize") return Value::of(py_capitalize(s));
      if (m == "startswith" || m == "endswith") {
        std::vector<std::string> options;
        const Value* v = a.get(0, "prefix");
        if (v && v->is_string()) {
          options.push_back(v->data.get<std::string>());
        } else if (v && v->is_list()) {
          for (const Json& o : v->data) {
            if (!o.is_string()) fail(line, m + "() takes a string or a tuple of strings");
            options.push_back(o.get<std::string>());
          }
        } else {
          fail(line, m + "() takes a string or a tuple of strings");
        }
        for (const std::string& o : options) {
          if (o.size() <= s.size() && s.compare(m == "startswith" ? 0 : s.size() - o.size(), o.size(), o) == 0)
            return Value::of(true);
        }
        return Value::of(false);
      }
      if (m == "split" || m == "rsplit") {
        const Value* sep = a.get(0, "sep");
        const Value* maxsplit = a.get(1, "maxsplit");
        const int64_t ms = maxsplit && maxsplit->is_integer() ? maxsplit->data.get<int64_t>() : -1;
        if (m == "rsplit" && ms >= 0) fail(line, "rsplit() with maxsplit is not supported");
        std::optional<std::string> sep_text;
        if (sep && !sep->is_none()) {
          if (!sep->is_string()) fail(line, m + "() takes a string separator");
          sep_text = sep->data.get<std::string>();
          if (sep_text->empty()) fail(line, "empty separator");
        }
        Json out = Json::array();
        for (std::string& part : py_split(s, sep_text, ms)) out.push_back(std::move(part));
        return Value::of(std::move(out));
      }
      if (m == "replace") {
        const std::string from = string_arg(a, 0, "old", line, "replace"),
                          to = string_arg(a, 1, "new", line, "replace");
        std::string out;
        if (from.empty()) {
          const std::vector<size_t> at = code_point_offsets(s);
          out = to;
          for (size_t k = 0; k + 1 < at.size(); ++k) out += s.substr(at[k], at[k + 1] - at[k]) + to;
          return Value::of(out);
        }
        size_t pos = 0;
        for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, pos)) {
          out += s.substr(pos, at - pos) + to;
          pos = at + from.size();
        }
        return Value::of(out + s.substr(pos));
      }
      if (m == "find") {
        const size_t at = s.find(string_arg(a, 0, "sub", line, "find"));
        if (at == std::string::npos) return Value::of(-1);
        return Value::of(static_cast<int64_t>(code_point_offsets(s.substr(0, at)).size()) - 1);
      }
      if (m == "count") {
        const std::string sub = string_arg(a, 0, "sub", line, "count");
        int64_t n = 0;
        if (sub.empty()) return Value::of(static_cast<int64_t>(code_point_offsets(s).size()));
        for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
        return Value::of(n);
      }
      if (m == "join") {
        const Value* v = a.get(0, "iterable");
        if (!v) fail(line, "join() takes an iterable");
        std::string out;
        bool first = true;
        for (const Json& item : iterate(*v, line)) {
          if (!item.is_string()) fail(line, "join() takes strings");
          out += (first ? "" : s) + item.get<std::string>();
          first = false;
        }
        return Value::of(out);
      }
      if (m == "format") {
        std::string out;
        size_t next = 0;
        for (size_t i = 0; i < s.size(); ++i) {
          if (s.compare(i, 2, "{}") == 0) {
            if (next >= a.pos.size()) fail(line, "format(): not enough arguments");
            out += to_str(a.pos[next++]);
            ++i;
          } else {
            out += s[i];
          }
        }
        return Value::of(out);
      }
    }
    if (obj.is_dict()) {
      if (m == "items") {
        Json out = Json::array();
        for (const auto& [k, v] : obj.data.items()) out.push_back(Json::array({k, v}));
        return Value::of(std::move(out));
      }
      if (m == "keys") {
        Json out = Json::array();
        for (const auto& [k, v] : obj.data.items()) out.push_back(k);
        return Value::of(std::move(out));
      }
      if (m == "values") {
        Json out = Json::array();
        for (const auto& [k, v] : obj.data.items()) out.push_back(v);
        return Value::of(std::move(out));
      }
      if (m == "get") {
        const Value* key = a.get(0, "key");
        if (key && key->is_string()) {
          auto it = obj.data.find(key->data.get<std::string>());
          if (it != obj.data.end()) return Value::of(*it);
        }
        const Value* d = a.get(1, "default");
        return d ? *d : Value::of(nullptr);
      }
    }
    if (obj.kind == Value::Kind::kData && obj.data.is_array() && (m == "append" || m == "pop" || m == "extend")) {
      fail(line, fmt::format("lists are immutable in chat templates ({}())", m));
    }
    fail(line, fmt::format("'{}' object has no method '{}'", type_name(obj), m));
  }

  Value filter(const Expr& e) {
    const Value v = eval(*e.kids[0]);
    const Args a = args_of(e, 1);
    const std::string& f = e.name;
    if (f == "safe" || f == "e" || f == "escape" || f == "forceescape") {
      if (f != "safe") fail(e.line, "HTML escaping is not supported");
      return v;
    }
    if (f == "default" || f == "d") {
      const Value* dflt = a.get(0, "default_value");
      const Value* boolean = a.get(1, "boolean");
      const bool use = !v.defined() || (boolean && truthy(*boolean) && !truthy(v));
      return use ? (dflt ? *dflt : Value::of("")) : v;
    }
    if (f == "trim") {
      std::optional<std::string> chars;
      if (const Value* c = a.get(0, "chars"); c && c->is_string()) chars = c->data.get<std::string>();
      return Value::of(py_strip(to_str(v), true, true, chars));
    }
    if (f == "string") return Value::of(to_str(v));
    if (f == "upper") return Value::of(ascii_map(to_str(v), [](int c) { return std::toupper(c); }));
    if (f == "lower") return Value::of(ascii_map(to_str(v), [](int c) { return std::tolower(c); }));
    if (f == "capitalize") return Value::of(py_capitalize(to_str(v)));
    if (f == "title") return Value::of(py_title(to_str(v)));
    if (f == "length" || f == "count") {
      if (!v.defined()) return Value::of(0);
      if (v.is_string())
        return Value::of(static_cast<int64_t>(code_point_offsets(v.data.get<std::string>()).size()) - 1);
      if (v.is_list() || v.is_dict()) return Value::of(static_cast<int64_t>(v.data.size()));
      if (v.kind == Value::Kind::kNamespace) return Value::of(static_cast<int64_t>(v.ns->size()));
      fail(e.line, fmt::format("object of type '{}' has no len()", type_name(v)));
    }
    if (f == "tojson") {
      PythonJsonOptions o;
      o.ensure_ascii = false;
      if (const Value* x = a.get(0, "ensure_ascii")) o.ensure_ascii = truthy(*x);
      if (const Value* x = a.get(1, "indent"); x && x->is_integer())
        o.indent = static_cast<int>(indent_width(x->data.get<int64_t>(), e.line));
      if (const Value* x = a.get(2, "separators"); x && !x->is_none()) {
        if (!x->is_list() || x->data.size() != 2 || !x->data[0].is_string() || !x->data[1].is_string())
          fail(e.line, "tojson separators must be a pair of strings");
        o.separators = std::make_pair(x->data[0].get<std::string>(), x->data[1].get<std::string>());
      }
      if (const Value* x = a.get(3, "sort_keys")) o.sort_keys = truthy(*x);
      return Value::of(python_json_dumps(data_of(v, e.line), o));
    }
    if (f == "first" || f == "last") {
      const std::vector<Json> items = iterate(v, e.line);
      if (items.empty()) return Value::undefined(f);
      return Value::of(f == "first" ? items.front() : items.back());
    }
    if (f == "join") {
      const std::string sep = a.get(0, "d") ? to_str(*a.get(0, "d")) : "";
      const Value* attr = a.get(1, "attribute");
      std::string out;
      bool first = true;
      for (const Json& item : iterate(v, e.line)) {
        Value x = Value::of(item);
        if (attr) x = attribute(x, to_str(*attr));
        out += (first ? "" : sep) + to_str(x);
        first = false;
      }
      return Value::of(out);
    }
    if (f == "replace") {
      Args m;
      const Value* from = a.get(0, "old");
      const Value* to = a.get(1, "new");
      if (!from || !to) fail(e.line, "replace takes the old and the new string");
      m.pos = {Value::of(to_str(*from)), Value::of(to_str(*to))};
      return method(Value::of(to_str(v)), "replace", m, e.line);
    }
    if (f == "int") {
      if (v.is_integer()) return v;
      if (v.is_number()) return Value::of(static_cast<int64_t>(v.data.get<double>()));
      if (v.is(Json::value_t::boolean)) return Value::of(v.data.get<bool>() ? 1 : 0);
      try {
        return Value::of(static_cast<int64_t>(std::stoll(py_strip(to_str(v), true, true, std::nullopt))));
      } catch (const std::exception&) {
        return Value::of(a.get(0, "default") ? data_of(*a.get(0, "default"), e.line) : Json(0));
      }
    }
    if (f == "float") {
      if (v.is_number()) return Value::of(v.data.get<double>());
      try {
        return Value::of(std::stod(to_str(v)));
      } catch (const std::exception&) {
        return Value::of(0.0);
      }
    }
    if (f == "abs") {
      if (v.is_integer()) return Value::of(std::abs(v.data.get<int64_t>()));
      if (v.is_number()) return Value::of(std::abs(v.data.get<double>()));
      fail(e.line, "abs takes a number");
    }
    if (f == "round") {
      if (!v.is_number()) fail(e.line, "round takes a number");
      const int64_t digits = a.get(0, "precision") ? a.get(0, "precision")->data.get<int64_t>() : 0;
      const double scale = std::pow(10.0, static_cast<double>(digits));
      return Value::of(std::nearbyint(v.data.get<double>() * scale) / scale);
    }
    if (f == "list") {
      Json out = Json::array();
      for (Json& item : iterate(v, e.line)) out.push_back(std::move(item));
      return Value::of(std::move(out));
    }
    if (f == "items") {
      if (!v.defined()) return Value::of(Json::array());
      if (!v.is_dict()) fail(e.line, "items expects a mapping");
      Args none;
      return method(v, "items", none, e.line);
    }
    if (f == "dictsort") {
      if (!v.is_dict()) fail(e.line, "dictsort expects a mapping");
      std::vector<std::pair<std::string, Json>> items;
      for (const auto& [k, x] : v.data.items()) items.emplace_back(k, x);
      std::sort(items.begin(), items.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
      Json out = Json::array();
      for (auto& [k, x] : items) out.push_back(Json::array({k, x}));
      return Value::of(std::move(out));
    }
    if (f == "reverse") {
      if (v.is_string()) {
        std::vector<Json> cps = iterate(v, e.line);
        std::string out;
        for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += it->get<std::string>();
        return Value::of(out);
      }
      std::vector<Json> items = iterate(v, e.line);
      return Value::of(Json(std::vector<Json>(items.rbegin(), items.rend())));
    }
    if (f == "unique") {
      Json out = Json::array();
      for (Json& item : iterate(v, e.line)) {
        if (std::find(out.begin(), out.end(), item) == out.end()) out.push_back(std::move(item));
      }
      return Value::of(std::move(out));
    }
    if (f == "select" || f == "reject") {
      Json out = Json::array();
      for (Json& item : iterate(v, e.line)) {
        const Value x = Value::of(item);
        bool keep = truthy(x);
        if (!a.pos.empty()) {
          std::vector<Value> targs(a.pos.begin() + 1, a.pos.end());
          keep = run_test(to_str(a.pos[0]), x, targs, e.line);
        }
        if (keep == (f == "select")) out.push_back(std::move(item));
      }
      return Value::of(std::move(out));
    }
    if (f == "selectattr" || f == "rejectattr") {
      if (a.pos.empty()) fail(e.line, f + " needs an attribute name");
      const std::string attr = to_str(a.pos[0]);
      Json out = Json::array();
      for (Json& item : iterate(v, e.line)) {
        const Value x = attribute(Value::of(item), attr);
        bool keep = truthy(x);
        if (a.pos.size() >= 2) {
          std::vector<Value> targs(a.pos.begin() + 2, a.pos.end());
          keep = run_test(to_str(a.pos[1]), x, targs, e.line);
        }
        if (keep == (f == "selectattr")) out.push_back(std::move(item));
      }
      return Value::of(std::move(out));
    }
    if (f == "map") {
      Json out = Json::array();
      const Value* attr = a.get(99, "attribute");
      for (const Json& item : iterate(v, e.line)) {
        if (attr) {
          Value x = attribute(Value::of(item), to_str(*attr));
          if (!x.defined() && a.kw.count("default")) x = a.kw.at("default");
          out.push_back(data_of(x, e.line));
        } else if (!a.pos.empty()) {
          Expr call_filter;
          call_filter.kind = Expr::Kind::kFilter;
          call_filter.line = e.line;
          call_filter.name = to_str(a.pos[0]);
          auto lit = make(Expr::Kind::kLiteral, e.line);
          lit->literal = item;
          call_filter.kids.push_back(std::move(lit));
          out.push_back(data_of(filter(call_filter), e.line));
        } else {
          fail(e.line, "map needs attribute= or a filter name");
        }
      }
      return Value::of(std::move(out));
    }
    if (f == "indent") {
      const int64_t width =
          a.get(0, "width") && a.get(0, "width")->is_integer() ? a.get(0, "width")->data.get<int64_t>() : 4;
      const bool first = a.get(1, "first") && truthy(*a.get(1, "first"));
      const bool blank = a.get(2, "blank") && truthy(*a.get(2, "blank"));
      const std::string pad(static_cast<size_t>(std::max<int64_t>(indent_width(width, e.line), 0)), ' ');
      const std::vector<std::string> lines = py_split(to_str(v), std::string("\n"), -1);
      std::string out;
      for (size_t k = 0; k < lines.size(); ++k) {
        if (k > 0) out += '\n';
        const bool indent = (k > 0 || first) && (blank || !py_strip(lines[k], true, true, std::nullopt).empty());
        out += (indent ? pad : "") + lines[k];
      }
      return Value::of(out);
    }
    fail(e.line, fmt::format("unknown filter '{}'", f));
  }

  bool test(const Expr& e) {
    const Value v = eval(*e.kids[0]);
    std::vector<Value> args;
    for (size_t k = 1; k < e.kids.size(); ++k) args.push_back(eval(*e.kids[k]));
    return run_test(e.name, v, args, e.line);
  }

  bool run_test(const std::string& t, const Value& v, const std::vector<Value>& args, int line) {
    const auto arg = [&](size_t i) -> const Value& {
      if (i >= args.size()) fail(line, fmt::format("test '{}' needs an argument", t));
      return args[i];
    };
    if (t == "defined") return v.defined();
    if (t == "undefined") return !v.defined();
    if (t == "none") return v.is_none();
    if (t == "string") return v.is_string();
    if (t == "number") return v.is_number();
    if (t == "integer") return v.is_integer();
    if (t == "float") return v.is(Json::value_t::number_float);
    if (t == "boolean") return v.is(Json::value_t::boolean);
    if (t == "true") return v.is(Json::value_t::boolean) && v.data.get<bool>();
    if (t == "false") return v.is(Json::value_t::boolean) && !v.data.get<bool>();
    if (t == "mapping") return v.is_dict() || v.kind == Value::Kind::kNamespace;
    if (t == "iterable") return v.is_list() || v.is_dict() || v.is_string() || !v.defined();
    if (t == "sequence") return v.is_list() || v.is_dict() || v.is_string();
    if (t == "callable") return v.kind == Value::Kind::kFunction;
    if (t == "equalto" || t == "eq" || t == "==" || t == "sameas") return equal(v, arg(0));
    if (t == "ne" || t == "!=") return !equal(v, arg(0));
    if (t == "gt" || t == "ge" || t == "lt" || t == "le") {
      const int c = compare(v, arg(0), line);
      return t == "gt" ? c > 0 : t == "ge" ? c >= 0 : t == "lt" ? c < 0 : c <= 0;
    }
    if (t == "in") return contains(arg(0), v, line);
    if (t == "odd" || t == "even") {
      if (!v.is_integer()) fail(line, fmt::format("test '{}' needs an integer", t));
      return (v.data.get<int64_t>() % 2 != 0) == (t == "odd");
    }
    if (t == "divisibleby") {
      if (!v.is_integer() || !arg(0).is_integer() || arg(0).data.get<int64_t>() == 0)
        fail(line, "divisibleby needs integers");
      return v.data.get<int64_t>() % arg(0).data.get<int64_t>() == 0;
    }
    if (t == "lower" || t == "upper") {
      const std::string s = to_str(v);
      return s == ascii_map(
                      s, t == "lower" ? [](int c) { return std::tolower(c); } : [](int c) { return std::toupper(c); });
    }
    fail(line, fmt::format("unknown test '{}'", t));
  }

  int compare(const Value& a, const Value& b, int line) const {
    if (a.is_number() && b.is_number()) {
      const double x = a.data.get<double>(), y = b.data.get<double>();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.is_string() && b.is_string()) {
      const int c = a.data.get<std::string>().compare(b.data.get<std::string>());
      return c < 0 ? -1 : c > 0 ? 1 : 0;
    }
    fail(line, fmt::format("'<' not supported between '{}' and '{}'", type_name(a), type_name(b)));
  }

  bool contains(const Value& container, const Value& x, int line) const {
    if (container.is_string()) {
      if (!x.is_string()) fail(line, "'in <string>' requires a string");
      return container.data.get<std::string>().find(x.data.get<std::string>()) != std::string::npos;
    }
    if (container.is_list()) {
      for (const Json& item : container.data) {
        if (equal(Value::of(item), x)) return true;
      }
      return false;
    }
    if (container.is_dict()) return x.is_string() && container.data.contains(x.data.get<std::string>());
    if (container.kind == Value::Kind::kNamespace)
      return x.is_string() && container.ns->contains(x.data.get<std::string>());
    if (!container.defined()) fail(line, fmt::format("'{}' is undefined", container.name));
    fail(line, fmt::format("argument of type '{}' is not iterable", type_name(container)));
  }

  Value binary(const Expr& e) {
    const std::string& op = e.name;
    const Value a = eval(*e.kids[0]);
    const Value b = eval(*e.kids[1]);
    if (op == "~") return Value::of(bounded(to_str(a) + to_str(b), e.line));
    if (op == "==") return Value::of(equal(a, b));
    if (op == "!=") return Value::of(!equal(a, b));
    if (op == "<" || op == "<=" || op == ">" || op == ">=") {
      const int c = compare(a, b, e.line);
      return Value::of(op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0);
    }
    if (op == "in") return Value::of(contains(b, a, e.line));
    if (op == "notin") return Value::of(!contains(b, a, e.line));
    if (!a.defined() || !b.defined()) fail(e.line, fmt::format("'{}' is undefined", a.defined() ? b.name : a.name));
    if (op == "+") {
      if (a.is_string() && b.is_string()) {
        return Value::of(bounded(a.data.get<std::string>() + b.data.get<std::string>(), e.line));
      }
      if (a.is_list() && b.is_list()) {
        if (a.data.size() + b.data.size() > static_cast<size_t>(kMaxRange)) fail(e.line, "list too long");
        Json out = a.data;
        for (const Json& x : b.data) out.push_back(x);
        return Value::of(std::move(out));
      }
    }
    if (op == "*" && ((a.is_string() && b.is_integer()) || (a.is_integer() && b.is_string()))) {
      const std::string& s =
          a.is_string() ? a.data.get_ref<const std::string&>() : b.data.get_ref<const std::string&>();
      const int64_t n = a.is_integer() ? a.data.get<int64_t>() : b.data.get<int64_t>();
      if (n > 0 && s.size() * static_cast<uint64_t>(n) > kMaxString) fail(e.line, "repeated string too long");
      std::string out;
      for (int64_t k = 0; k < n; ++k) out += s;
      return Value::of(out);
    }
    const auto numeric = [](const Value& v) { return v.is_number() || v.is(Json::value_t::boolean); };
    if (!numeric(a) || !numeric(b)) {
      fail(e.line, fmt::format("unsupported operand types for {}: '{}' and '{}'", op, type_name(a), type_name(b)));
    }
    const auto as_int = [](const Value& v) {
      return v.is(Json::value_t::boolean) ? (v.data.get<bool>() ? 1 : 0) : v.data.get<int64_t>();
    };
    const auto as_double = [](const Value& v) {
      return v.is(Json::value_t::boolean) ? (v.data.get<bool>() ? 1.0 : 0.0) : v.data.get<double>();
    };
    const bool ints = !a.is(Json::value_t::number_float) && !b.is(Json::value_t::number_float);
    if (op == "/") {
      if (as_double(b) == 0) fail(e.line, "division by zero");
      return Value::of(as_double(a) / as_double(b));
    }
    if (ints) {
      const int64_t x = as_int(a), y = as_int(b);
      int64_t r = 0;
      if ((op == "+" && __builtin_add_overflow(x, y, &r)) || (op == "-" && __builtin_sub_overflow(x, y, &r)) ||
          (op == "*" && __builtin_mul_overflow(x, y, &r)))
        fail(e.line, "integer overflow");
      if (op == "+" || op == "-" || op == "*") return Value::of(r);
      if (op == "//" || op == "%") {
        if (y == 0) fail(e.line, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) fail(e.line, "integer overflow");
        int64_t q = x / y, rem = x % y;
        if (rem != 0 && ((rem < 0) != (y < 0))) {  // Python floors
          --q;
          rem += y;
        }
        return Value::of(op == "//" ? q : rem);
      }
      if (op == "**") {
        if (y < 0) return Value::of(std::pow(static_cast<double>(x), static_cast<double>(y)));
        if (y == 0 || x == 1) return Value::of(int64_t{1});
        if (x == 0) return Value::of(int64_t{0});
        if (x == -1) return Value::of(int64_t{y % 2 ? -1 : 1});
        int64_t p = 1;  // |x| >= 2: overflows within 63 steps
        for (int64_t k = 0; k < y; ++k) {
          if (__builtin_mul_overflow(p, x, &p)) fail(e.line, "integer overflow");
        }
        return Value::of(p);
      }
    }
    const double x = as_double(a), y = as_double(b);
    if (op == "+") return Value::of(x + y);
    if (op == "-") return Value::of(x - y);
    if (op == "*") return Value::of(x * y);
    if (op == "**") return Value::of(std::pow(x, y));
    if (op == "//" || op == "%") {
      if (y == 0) fail(e.line, "float division or modulo by zero");
      const double q = std::floor(x / y);
      return Value::of(op == "//" ? q : x - q * y);
    }
    fail(e.line, fmt::format("unknown operator {}", op));
  }

  const std::string& name_;
  std::vector<std::map<std::string, Value>> frames_;
  int64_t steps_ = 0;
};

}  // namespace
}  // namespace detail

Template::Template(std::string_view source, std::string name)
    : name_(std::move(name)), program_(std::make_unique<detail::Program>()) {
  detail::StatementParser parser(detail::lex(std::string(source), name_), name_);
  program_->body = parser.parse_all();
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const nlohmann::ordered_json& context) const {
  detail::Renderer r(name_, context);
  std::string out;
  detail::Flow f = detail::Flow::kNormal;
  try {
    f = r.run(program_->body, out);
  } catch (const nlohmann::json::exception& e) {
    // A value of a type an operation does not take, where no check above named it first.
    throw Error(detail::kComponent, fmt::format("{}: {}", name_, e.what()));
  }
  if (f != detail::Flow::kNormal) throw Error(detail::kComponent, name_ + ": break or continue outside a loop");
  return out;
}

}  // namespace tessera::util::jinja
