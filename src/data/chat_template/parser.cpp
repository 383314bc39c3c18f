// The chat-template parser: recursive descent with jinja2's operator precedence over the tokens of each piece, and the
// statement structure (if/for/set/generation blocks) over the pieces.
#include <fmt/format.h>

#include <set>

#include "syntax.h"
#include "tessera/util/error.h"

namespace tessera::data::chat_template::detail {

namespace {

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

}  // namespace

std::vector<Stmt> parse(std::vector<Piece> pieces, const std::string& name) {
  StatementParser parser(std::move(pieces), name);
  return parser.parse_all();
}

}  // namespace tessera::data::chat_template::detail
