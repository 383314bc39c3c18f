// The chat-template renderer: statements, expressions, attribute and item access, slices and operators.
#include "renderer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "tessera/util/error.h"
#include "tessera/util/utf8.h"

namespace tessera::data::chat_template::detail {

Renderer::Renderer(const std::string& name, const Json& context) : name_(name) {
  frames_.emplace_back();
  if (context.is_object()) {
    for (auto it = context.begin(); it != context.end(); ++it) frames_.back()[it.key()] = Value::borrowed(*it);
  }
}

Flow Renderer::run(const std::vector<Stmt>& body, std::string& out) {
  for (const Stmt& s : body) {
    const Flow f = exec(s, out);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

[[noreturn]] void Renderer::fail(int line, const std::string& what) const {
  throw Error(kComponent, fmt::format("{}:{}: {}", name_, line, what));
}

// Counts one statement or loop iteration against kMaxSteps, so that nested loops cannot run for hours.
void Renderer::tick(int line) {
  if (++steps_ > kMaxSteps) fail(line, fmt::format("the template ran more than {} statements", kMaxSteps));
}

void Renderer::charge(size_t bytes, int line) {
  if (__builtin_add_overflow(built_, bytes, &built_) || built_ > kMaxBuilt) {
    built_ = kMaxBuilt + 1;
    fail(line, fmt::format("the template built, copied or scanned more than {} bytes of text and values", kMaxBuilt));
  }
}

size_t Renderer::sum_size(size_t a, size_t b, int line) const {
  size_t n = 0;
  if (__builtin_add_overflow(a, b, &n) || n > kMaxString)
    fail(line, fmt::format("string too long: the result would be longer than the limit of {} bytes", kMaxString));
  return n;
}

size_t Renderer::product_size(size_t a, size_t b, int line) const {
  size_t n = 0;
  if (__builtin_mul_overflow(a, b, &n) || n > kMaxString)
    fail(line, fmt::format("string too long: the result would be longer than the limit of {} bytes", kMaxString));
  return n;
}

void Renderer::append(std::string& out, std::string_view piece, int line) {
  sum_size(out.size(), piece.size(), line);
  charge(piece.size(), line);
  out += piece;
}

size_t Renderer::json_cost(const Json& j, int line) const {
  if (!j.is_structured()) return kNodeBytes + (j.is_string() ? j.get_ref<const std::string&>().size() : 0);
  size_t cost = 0;
  std::vector<std::pair<const Json*, size_t>> todo = {{&j, 1}};
  while (!todo.empty() && cost <= kMaxBuilt) {  // past kMaxBuilt, charge() refuses it whatever the rest holds
    const auto [node, depth] = todo.back();
    todo.pop_back();
    if (depth > kMaxValueDepth) fail(line, fmt::format("a value nested more than {} levels deep", kMaxValueDepth));
    cost += kNodeBytes;
    if (node->is_string()) {
      cost += node->get_ref<const std::string&>().size();
    } else if (node->is_object()) {
      for (const auto& [k, v] : node->items()) {
        cost += k.size();
        todo.emplace_back(&v, depth + 1);
      }
    } else if (node->is_array()) {
      for (const Json& v : *node) todo.emplace_back(&v, depth + 1);
    }
  }
  return cost;
}

int64_t Renderer::indent_width(int64_t width, int line) const {
  if (width > kMaxIndent) fail(line, fmt::format("indent width {} is larger than the limit of {}", width, kMaxIndent));
  return std::max<int64_t>(width, 0);  // Python: " " * -1 is ""
}

Value Renderer::lookup(const std::string& n) const {
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

Flow Renderer::exec(const Stmt& s, std::string& out) {
  tick(s.line);
  if (out.size() > kMaxString) fail(s.line, "the rendered text is too long");
  switch (s.kind) {
    case Stmt::Kind::kText:
      append(out, s.text, s.line);
      return Flow::kNormal;
    case Stmt::Kind::kOutput: {
      const Value v = eval(*s.expr);
      if (v.is_string()) {
        append(out, v.data().get_ref<const std::string&>(), s.line);
      } else {
        append(out, str(v, s.line), s.line);
      }
      return Flow::kNormal;
    }
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
        (*ns.ns)[s.attr] = copy_of(v, s.line);
      } else if (s.targets.size() == 1) {
        frames_.back()[s.targets[0]] = v;
      } else {
        if (!v.is_list() || v.data().size() != s.targets.size()) fail(s.line, "cannot unpack the value");
        for (size_t k = 0; k < s.targets.size(); ++k) frames_.back()[s.targets[k]] = Value::part(v, v.data()[k]);
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

Flow Renderer::exec_for(const Stmt& s, std::string& out) {
  // The items are the list's own (shared, not copied); a filter keeps the indices of those it lets through.
  const Value seq = items_of(eval(*s.expr), s.line);
  const Json& all = seq.data();
  frames_.emplace_back();
  std::vector<size_t> kept;
  if (s.filter) {
    for (size_t k = 0; k < all.size(); ++k) {
      tick(s.line);
      bind(s, Value::part(seq, all[k]));
      if (truthy(eval(*s.filter))) kept.push_back(k);
    }
  }
  const auto n = static_cast<int64_t>(s.filter ? kept.size() : all.size());
  const auto at = [&](int64_t k) -> const Json& {
    return all[s.filter ? kept[static_cast<size_t>(k)] : static_cast<size_t>(k)];
  };
  for (int64_t k = 0; k < n; ++k) {
    tick(s.line);
    bind(s, Value::part(seq, at(k)));
    Json loop = {{"index", k + 1},  {"index0", k},        {"revindex", n - k}, {"revindex0", n - k - 1},
                 {"first", k == 0}, {"last", k == n - 1}, {"length", n},       {"depth", 1},
                 {"depth0", 0}};
    if (k > 0) {
      charge(json_cost(at(k - 1), s.line), s.line);
      loop["previtem"] = at(k - 1);
    }
    if (k + 1 < n) {
      charge(json_cost(at(k + 1), s.line), s.line);
      loop["nextitem"] = at(k + 1);
    }
    frames_.back()["loop"] = Value::of(std::move(loop));
    const Flow f = run(s.body, out);
    if (f == Flow::kBreak) break;
  }
  frames_.pop_back();
  if (n == 0 && !s.else_body.empty()) return run(s.else_body, out);
  return Flow::kNormal;
}

void Renderer::bind(const Stmt& s, const Value& item) {
  if (s.targets.size() == 1) {
    frames_.back()[s.targets[0]] = item;
    return;
  }
  if (!item.is_list() || item.data().size() != s.targets.size()) fail(s.line, "cannot unpack a loop item");
  for (size_t k = 0; k < s.targets.size(); ++k) frames_.back()[s.targets[k]] = Value::part(item, item.data()[k]);
}

Value Renderer::items_of(const Value& v, int line) {
  if (!v.defined()) return Value::of(Json::array());  // jinja2's Undefined iterates as empty
  if (v.is_list()) return v;
  Json out = Json::array();
  if (v.is_dict()) {
    charge(json_cost(v.data(), line), line);
    for (const auto& [k, val] : v.data().items()) out.emplace_back(k);
    return Value::of(std::move(out));
  }
  if (v.is_string()) {
    const std::string& s = v.data().get_ref<const std::string&>();
    size_t cost = 0;
    if (__builtin_mul_overflow(code_point_count(s), kNodeBytes, &cost)) cost = SIZE_MAX;
    charge(cost, line);  // before anything is allocated
    charge(s.size(), line);
    const std::vector<size_t> at = code_point_offsets(s);
    for (size_t k = 0; k + 1 < at.size(); ++k) out.emplace_back(s.substr(at[k], at[k + 1] - at[k]));
    return Value::of(std::move(out));
  }
  fail(line, fmt::format("'{}' is not iterable", type_name(v)));
}

std::string Renderer::type_name(const Value& v) {
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
  switch (v.data().type()) {
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

const Json& Renderer::json_of(const Value& v, int line) const {
  if (v.kind == Value::Kind::kNamespace) return *v.ns;
  if (v.kind == Value::Kind::kFunction) fail(line, "a function is not a value here");
  return v.data();  // null for undefined
}

Json Renderer::copy_of(const Value& v, int line) {
  const Json& j = json_of(v, line);
  charge(json_cost(j, line), line);
  return j;
}

std::string Renderer::str(const Value& v, int line) {
  if (v.is_string()) {
    charge(v.data().get_ref<const std::string&>().size(), line);
    return v.data().get<std::string>();
  }
  if (v.kind != Value::Kind::kNamespace && !v.is_list() && !v.is_dict()) return to_str(v);
  // A list, dict or namespace: printed into one buffer that stops at kMaxString.
  const Json& j = json_of(v, line);
  charge(json_cost(j, line), line);
  std::string out = v.kind == Value::Kind::kNamespace ? "<Namespace " : "";
  if (!py_repr_append(out, j, kMaxString))
    fail(line, fmt::format("string too long: the printed value is longer than the limit of {} bytes", kMaxString));
  if (v.kind == Value::Kind::kNamespace) out += ">";
  charge(out.size(), line);
  return out;
}

Value Renderer::require_defined(Value v, int line) const {
  if (!v.defined()) fail(line, fmt::format("'{}' is undefined", v.name));
  return v;
}

Value Renderer::eval(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return Value::borrowed(e.literal);  // the parsed template outlives the render
    case Expr::Kind::kName:
      return lookup(e.name);
    case Expr::Kind::kList: {
      Json list = Json::array();
      for (const auto& k : e.kids) list.push_back(copy_of(eval(*k), e.line));
      return Value::of(std::move(list));
    }
    case Expr::Kind::kDict: {
      Json dict = Json::object();
      for (size_t k = 0; k + 1 < e.kids.size(); k += 2) {
        const std::string key = str(eval(*e.kids[k]), e.line);
        dict[key] = copy_of(eval(*e.kids[k + 1]), e.line);
      }
      return Value::of(std::move(dict));
    }
    case Expr::Kind::kAttr:
      return attribute(require_defined(eval(*e.kids[0]), e.line), e.name, e.line);
    case Expr::Kind::kItem: {
      const Value obj = require_defined(eval(*e.kids[0]), e.line);
      return item(obj, eval(*e.kids[1]), e.line);
    }
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
        if (v.data().get<int64_t>() == INT64_MIN) fail(e.line, "integer overflow");
        return Value::of(-v.data().get<int64_t>());
      }
      if (v.is_number()) return Value::of(-v.data().get<double>());
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

Value Renderer::attribute(const Value& obj, const std::string& attr, int line) {
  if (obj.kind == Value::Kind::kNamespace) {
    // A namespace changes under `set`: its attributes are copied out, not shared.
    auto it = obj.ns->find(attr);
    if (it == obj.ns->end()) return Value::undefined(attr);
    charge(json_cost(*it, line), line);
    return Value::of(*it);
  }
  if (obj.is_dict()) {
    auto it = obj.data().find(attr);
    return it == obj.data().end() ? Value::undefined(attr) : Value::part(obj, *it);
  }
  return Value::undefined(attr);
}

Value Renderer::item(const Value& obj, const Value& key, int line) {
  if (obj.is_dict()) {
    if (!key.is_string()) return Value::undefined(str(key, line));
    auto it = obj.data().find(key.data().get_ref<const std::string&>());
    return it == obj.data().end() ? Value::undefined(key.data().get<std::string>()) : Value::part(obj, *it);
  }
  if (obj.kind == Value::Kind::kNamespace && key.is_string())
    return attribute(obj, key.data().get<std::string>(), line);
  if ((obj.is_list() || obj.is_string()) && key.is_integer()) {
    if (obj.is_list()) {
      const int64_t i = normalize_index(key.data().get<int64_t>(), static_cast<int64_t>(obj.data().size()));
      if (i < 0 || i >= static_cast<int64_t>(obj.data().size())) return Value::undefined("index");
      return Value::part(obj, obj.data()[static_cast<size_t>(i)]);
    }
    const std::string& s = obj.data().get_ref<const std::string&>();
    charge(s.size(), line);
    const auto n = static_cast<int64_t>(code_point_count(s));
    const int64_t i = normalize_index(key.data().get<int64_t>(), n);
    if (i < 0 || i >= n) return Value::undefined("index");
    size_t b = 0;  // the byte offset of code point i
    for (int64_t k = 0; k < i; ++k) b = next_code_point(s, b);
    return Value::of(s.substr(b, next_code_point(s, b) - b));
  }
  if (key.is_string()) return attribute(obj, key.data().get<std::string>(), line);
  fail(line, fmt::format("'{}' object is not subscriptable with {}", type_name(obj), type_name(key)));
}

Value Renderer::slice(const Expr& e) {
  const Value obj = require_defined(eval(*e.kids[0]), e.line);
  std::optional<int64_t> part[3];
  for (int k = 0; k < 3; ++k) {
    if (!e.kids[static_cast<size_t>(k) + 1]) continue;
    const Value v = eval(*e.kids[static_cast<size_t>(k) + 1]);
    if (v.is_none()) continue;
    if (!v.is_integer()) fail(e.line, "slice indices must be integers");
    part[k] = v.data().get<int64_t>();
  }
  const bool is_str = obj.is_string();
  if (!is_str && !obj.is_list()) fail(e.line, fmt::format("'{}' object cannot be sliced", type_name(obj)));
  std::vector<size_t> at;  // a string's code point offsets
  if (is_str) {
    charge(obj.data().get_ref<const std::string&>().size(), e.line);
    at = code_point_offsets(obj.data().get_ref<const std::string&>());
  }
  const auto n = static_cast<int64_t>(is_str ? at.size() - 1 : obj.data().size());
  const int64_t step = part[2].value_or(1);
  if (step == 0) fail(e.line, "slice step cannot be zero");
  // Python's slice.indices().
  const auto clamp = [&](std::optional<int64_t> v, int64_t dflt, int64_t lo, int64_t hi) {
    if (!v) return dflt;
    int64_t x = *v < 0 ? (*v < -n ? -n - 1 : *v + n) : *v;  // no overflow for INT64_MIN
    return std::clamp(x, lo, hi);
  };
  const int64_t start = step > 0 ? clamp(part[0], 0, 0, n) : clamp(part[0], n - 1, -1, n - 1);
  const int64_t stop = step > 0 ? clamp(part[1], n, 0, n) : clamp(part[1], -1, -1, n - 1);
  // Indices stay within [-1, n] and move by |step| <= 2^63: stop once past the end rather than overflow.
  const auto next = [&](int64_t i) {
    int64_t r = 0;
    return __builtin_add_overflow(i, step, &r) ? (step > 0 ? n : -1) : r;
  };
  if (is_str) {
    const std::string& s = obj.data().get_ref<const std::string&>();
    std::string out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i = next(i)) {
      const auto k = static_cast<size_t>(i);
      append(out, std::string_view(s).substr(at[k], at[k + 1] - at[k]), e.line);
    }
    return Value::of(std::move(out));
  }
  Json out = Json::array();
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i = next(i)) {
    const Json& x = obj.data()[static_cast<size_t>(i)];
    charge(json_cost(x, e.line), e.line);
    out.push_back(x);
  }
  return Value::of(std::move(out));
}

Renderer::Args Renderer::args_of(const Expr& e, size_t first) {
  Args a;
  for (size_t k = first; k < e.kids.size(); ++k) a.pos.push_back(eval(*e.kids[k]));
  for (const auto& [key, v] : e.kwargs) a.kw[key] = eval(*v);
  return a;
}

const std::string& Renderer::string_arg(const Args& a, size_t i, const std::string& key, int line,
                                        const char* what) const {
  const Value* v = a.get(i, key);
  if (!v || !v->is_string()) fail(line, fmt::format("{} expects a string argument", what));
  return v->data().get_ref<const std::string&>();
}

int Renderer::compare(const Value& a, const Value& b, int line) {
  if (a.is_number() && b.is_number()) {
    const double x = a.data().get<double>(), y = b.data().get<double>();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const std::string& x = a.data().get_ref<const std::string&>();
    const std::string& y = b.data().get_ref<const std::string&>();
    charge(std::min(x.size(), y.size()), line);
    const int c = x.compare(y);
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  fail(line, fmt::format("'<' not supported between '{}' and '{}'", type_name(a), type_name(b)));
}

bool Renderer::same(const Value& a, const Value& b, int line) {
  if (a.is_string() && b.is_string()) {
    charge(std::min(a.data().get_ref<const std::string&>().size(), b.data().get_ref<const std::string&>().size()),
           line);
  } else if ((a.is_list() && b.is_list()) || (a.is_dict() && b.is_dict())) {
    charge(std::min(json_cost(a.data(), line), json_cost(b.data(), line)), line);
  }
  return equal(a, b);
}

bool Renderer::contains(const Value& container, const Value& x, int line) {
  if (container.is_string()) {
    if (!x.is_string()) fail(line, "'in <string>' requires a string");
    const std::string& s = container.data().get_ref<const std::string&>();
    charge(s.size(), line);
    return find_text(s, x.data().get_ref<const std::string&>()) != std::string::npos;
  }
  if (container.is_list()) {
    for (const Json& item : container.data()) {
      charge(kNodeBytes, line);
      if (same(Value::part(container, item), x, line)) return true;
    }
    return false;
  }
  if (container.is_dict()) return x.is_string() && container.data().contains(x.data().get<std::string>());
  if (container.kind == Value::Kind::kNamespace)
    return x.is_string() && container.ns->contains(x.data().get<std::string>());
  if (!container.defined()) fail(line, fmt::format("'{}' is undefined", container.name));
  fail(line, fmt::format("argument of type '{}' is not iterable", type_name(container)));
}

// Python's sequence * int: n copies of a string or list, empty for n <= 0 or an empty sequence (without a loop of n
// steps); sizes are checked before anything is built.
Value Renderer::repeat(const Value& seq, int64_t n, int line) {
  if (seq.is_string()) {
    const std::string& s = seq.data().get_ref<const std::string&>();
    if (n <= 0 || s.empty()) return Value::of("");
    const size_t size = product_size(s.size(), static_cast<uint64_t>(n), line);
    charge(size, line);
    std::string out;
    out.reserve(size);
    for (int64_t k = 0; k < n; ++k) out += s;
    return Value::of(std::move(out));
  }
  const Json& list = seq.data();
  if (n <= 0 || list.empty()) return Value::of(Json::array());
  size_t items = 0;
  if (__builtin_mul_overflow(list.size(), static_cast<uint64_t>(n), &items) || items > static_cast<size_t>(kMaxRange))
    fail(line, fmt::format("list too long: the result would have more than {} items", kMaxRange));
  size_t cost = 0;
  if (__builtin_mul_overflow(json_cost(list, line), static_cast<uint64_t>(n), &cost)) cost = SIZE_MAX;
  charge(cost, line);
  Json out = Json::array();
  for (int64_t k = 0; k < n; ++k) {
    for (const Json& x : list) out.push_back(x);
  }
  return Value::of(std::move(out));
}

Value Renderer::binary(const Expr& e) {
  const std::string& op = e.name;
  const Value a = eval(*e.kids[0]);
  const Value b = eval(*e.kids[1]);
  if (op == "~") {
    std::string out = str(a, e.line);
    append(out, str(b, e.line), e.line);
    return Value::of(std::move(out));
  }
  if (op == "==") return Value::of(same(a, b, e.line));
  if (op == "!=") return Value::of(!same(a, b, e.line));
  if (op == "<" || op == "<=" || op == ">" || op == ">=") {
    const int c = compare(a, b, e.line);
    return Value::of(op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0);
  }
  if (op == "in") return Value::of(contains(b, a, e.line));
  if (op == "notin") return Value::of(!contains(b, a, e.line));
  if (!a.defined() || !b.defined()) fail(e.line, fmt::format("'{}' is undefined", a.defined() ? b.name : a.name));
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      const std::string& x = a.data().get_ref<const std::string&>();
      const std::string& y = b.data().get_ref<const std::string&>();
      std::string out;
      out.reserve(sum_size(x.size(), y.size(), e.line));
      append(out, x, e.line);
      append(out, y, e.line);
      return Value::of(std::move(out));
    }
    if (a.is_list() && b.is_list()) {
      if (a.data().size() + b.data().size() > static_cast<size_t>(kMaxRange))
        fail(e.line, fmt::format("list too long: the result would have more than {} items", kMaxRange));
      Json out = copy_of(a, e.line);
      for (const Json& x : b.data()) {
        charge(json_cost(x, e.line), e.line);
        out.push_back(x);
      }
      return Value::of(std::move(out));
    }
  }
  if (op == "*" && ((a.is_string() || a.is_list()) && b.is_integer()))
    return repeat(a, b.data().get<int64_t>(), e.line);
  if (op == "*" && (a.is_integer() && (b.is_string() || b.is_list())))
    return repeat(b, a.data().get<int64_t>(), e.line);
  const auto numeric = [](const Value& v) { return v.is_number() || v.is(Json::value_t::boolean); };
  if (!numeric(a) || !numeric(b)) {
    fail(e.line, fmt::format("unsupported operand types for {}: '{}' and '{}'", op, type_name(a), type_name(b)));
  }
  const auto as_int = [](const Value& v) {
    return v.is(Json::value_t::boolean) ? (v.data().get<bool>() ? 1 : 0) : v.data().get<int64_t>();
  };
  const auto as_double = [](const Value& v) {
    return v.is(Json::value_t::boolean) ? (v.data().get<bool>() ? 1.0 : 0.0) : v.data().get<double>();
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

}  // namespace tessera::data::chat_template::detail
