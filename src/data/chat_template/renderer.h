// The chat-template renderer: walks the statements of a parsed template over a JSON context, with jinja2's scoping,
// loop variables and Python's semantics for the operators, filters, tests, str/dict methods and globals templates use.
// renderer.cpp holds statements, expressions and operators; filters.cpp the filters, tests, methods and globals.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "syntax.h"

namespace tessera::data::chat_template::detail {

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  Renderer(const std::string& name, const Json& context);

  // Runs `body`, appending its text to `out`; kBreak / kContinue when a loop control left it.
  Flow run(const std::vector<Stmt>& body, std::string& out);

 private:
  // Positional and keyword arguments of a call, filter or test, evaluated.
  struct Args {
    std::vector<Value> pos;
    std::map<std::string, Value> kw;
    const Value* get(size_t i, const std::string& key) const {
      if (i < pos.size()) return &pos[i];
      auto it = kw.find(key);
      return it == kw.end() ? nullptr : &it->second;
    }
  };

  // ---- renderer.cpp: errors, bounds, scopes, statements, expressions, operators
  [[noreturn]] void fail(int line, const std::string& what) const;
  // Counts one statement or loop iteration against kMaxSteps, so that nested loops cannot run for hours.
  void tick(int line);
  // Counts `bytes` built, copied or scanned against kMaxBuilt (saturating: a huge count fails, never wraps).
  void charge(size_t bytes, int line);
  // The sizes of a + b and a * b bytes of text, refused past kMaxString before anything is allocated.
  size_t sum_size(size_t a, size_t b, int line) const;
  size_t product_size(size_t a, size_t b, int line) const;
  // out += piece, refused once `out` would pass kMaxString, and charged.
  void append(std::string& out, std::string_view piece, int line);
  // What copying `j` costs (its strings' bytes and kNodeBytes an item), refusing a value nested deeper than
  // kMaxValueDepth (copying, printing and comparing recurse). Walks `j` without recursing.
  size_t json_cost(const Json& j, int line) const;
  int64_t indent_width(int64_t width, int line) const;
  Value lookup(const std::string& n) const;
  Flow exec(const Stmt& s, std::string& out);
  Flow exec_for(const Stmt& s, std::string& out);
  void bind(const Stmt& s, const Value& item);
  // The items of `v` as a list value: a list itself (nothing copied), a dict's keys or a string's code points
  // (built and charged), an undefined value as an empty list.
  Value items_of(const Value& v, int line);
  static std::string type_name(const Value& v);
  // The JSON of a value (a namespace's object; null for undefined), without a copy.
  const Json& json_of(const Value& v, int line) const;
  // A copy of the JSON of a value, charged.
  Json copy_of(const Value& v, int line);
  // Python's str(), charged and refused past kMaxString.
  std::string str(const Value& v, int line);
  Value require_defined(Value v, int line) const;
  Value eval(const Expr& e);
  Value attribute(const Value& obj, const std::string& attr, int line);
  static int64_t normalize_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }
  Value item(const Value& obj, const Value& key, int line);
  Value slice(const Expr& e);
  Args args_of(const Expr& e, size_t first);
  const std::string& string_arg(const Args& a, size_t i, const std::string& key, int line, const char* what) const;
  int compare(const Value& a, const Value& b, int line);
  // Python ==, with the cost of comparing long strings or large values charged.
  bool same(const Value& a, const Value& b, int line);
  bool contains(const Value& container, const Value& x, int line);
  Value repeat(const Value& seq, int64_t n, int line);
  Value binary(const Expr& e);

  // ---- filters.cpp: globals, methods, filters, tests
  Value call(const Expr& e);
  Value range(const std::vector<Value>& args, int line);
  Value method(const Value& obj, const std::string& m, const Args& a, int line);
  Value replace(const std::string& s, const std::string& from, const std::string& to, int line);
  Value filter(const Expr& e);
  Value apply_filter(const std::string& f, const Value& v, const Args& a, int line);
  Value tojson(const Value& v, const Args& a, int line);
  Value indent(const std::string& s, const Args& a, int line);
  bool test(const Expr& e);
  bool run_test(const std::string& t, const Value& v, const std::vector<Value>& args, int line);

  const std::string& name_;
  std::vector<std::map<std::string, Value>> frames_;
  int64_t steps_ = 0;
  size_t built_ = 0;  // bytes charged, against kMaxBuilt
};

}  // namespace tessera::data::chat_template::detail
