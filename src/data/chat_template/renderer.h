// The chat-template renderer: walks the statements of a parsed template over a JSON context, with jinja2's scoping,
// loop variables and Python's semantics for the operators, filters, tests, str/dict methods and globals templates use.
// renderer.cpp holds statements, expressions and operators; filters.cpp the filters, tests, methods and globals.
#pragma once

#include <cstdint>
#include <map>
#include <string>
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
  std::string bounded(std::string s, int line) const;
  int64_t indent_width(int64_t width, int line) const;
  Value lookup(const std::string& n) const;
  Flow exec(const Stmt& s, std::string& out);
  Flow exec_for(const Stmt& s, std::string& out);
  void bind(const Stmt& s, const Json& item);
  std::vector<Json> iterate(const Value& v, int line) const;
  static std::string type_name(const Value& v);
  Json data_of(const Value& v, int line) const;
  Value require_defined(Value v, int line) const;
  Value eval(const Expr& e);
  Value attribute(const Value& obj, const std::string& attr) const;
  static int64_t normalize_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }
  Value item(const Value& obj, const Value& key, int line) const;
  Value slice(const Expr& e);
  Args args_of(const Expr& e, size_t first);
  std::string string_arg(const Args& a, size_t i, const std::string& key, int line, const char* what) const;
  int compare(const Value& a, const Value& b, int line) const;
  bool contains(const Value& container, const Value& x, int line) const;
  Value binary(const Expr& e);

  // ---- filters.cpp: globals, methods, filters, tests
  Value call(const Expr& e);
  Value method(const Value& obj, const std::string& m, const Args& a, int line);
  Value filter(const Expr& e);
  bool test(const Expr& e);
  bool run_test(const std::string& t, const Value& v, const std::vector<Value>& args, int line);

  const std::string& name_;
  std::vector<std::map<std::string, Value>> frames_;
  int64_t steps_ = 0;
};

}  // namespace tessera::data::chat_template::detail
