// Chat templates' syntax tree: the pieces the lexer cuts a template into, the tokens of an expression, expressions,
// statements, and the bounds that keep a hostile template from exhausting the stack or memory.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "value.h"

namespace tessera::data::chat_template::detail {

struct Piece {
  enum class Kind { kText, kVar, kBlock } kind;
  std::string text;
  int line;
};

struct Token {
  enum class Kind { kName, kString, kInt, kFloat, kOp, kEnd } kind;
  std::string text;
  Json value;
};

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
inline constexpr int kMaxExprDepth = 200;
inline constexpr int kMaxBlockDepth = 100;
inline constexpr int64_t kMaxRange = 100000;  // jinja2's sandbox limit (MAX_RANGE)
inline constexpr size_t kMaxString = size_t{1} << 26;
inline constexpr int64_t kMaxSteps = 1000000;  // statements and loop iterations one render may execute
inline constexpr int64_t kMaxIndent = 1000;    // widths of `indent` and `tojson(indent=...)`
// Bytes of text and JSON one render may build or copy, all operations together (a string repeated, joined or
// concatenated, a list made, a value copied, a string scanned), so that a loop cannot repeat a costly operation for
// hours within kMaxSteps. A JSON item counts kNodeBytes, about what it costs in memory.
inline constexpr size_t kMaxBuilt = size_t{1} << 28;  // 256 MiB: four times kMaxString
inline constexpr size_t kNodeBytes = 64;
inline constexpr size_t kMaxValueDepth = 512;  // nesting of the lists and dicts a render copies, prints or compares

inline ExprPtr make(Expr::Kind k, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = k;
  e->line = line;
  return e;
}

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

struct Program {
  std::vector<Stmt> body;
};

// "{name}:{line}: {what}" as a tessera::Error of component "jinja".
[[noreturn]] void syntax_error(const std::string& name, int line, const std::string& what);

// Cuts a template into text, `{{ }}` and `{% %}` pieces with jinja2's whitespace rules (trim_blocks, lstrip_blocks,
// `-`,
// `+`), after normalising newlines and dropping one trailing newline.
std::vector<Piece> lex(std::string src, const std::string& name);

// The tokens of one expression or tag body at `line`.
std::vector<Token> tokenize(const std::string& s, const std::string& name, int line);

// The statements of a template's pieces; errors name the template and line.
std::vector<Stmt> parse(std::vector<Piece> pieces, const std::string& name);

}  // namespace tessera::data::chat_template::detail
