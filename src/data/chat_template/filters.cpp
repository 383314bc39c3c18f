// The chat-template builtins: globals (namespace, range, dict, raise_exception, strftime_now), str and dict methods,
// filters and tests, each with jinja2's argument names and Python's semantics.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <ctime>
#include <functional>
#include <set>

#include "renderer.h"
#include "tessera/util/error.h"
#include "tessera/util/python_json.h"
#include "tessera/util/utf8.h"

namespace tessera::data::chat_template::detail {

Value Renderer::call(const Expr& e) {
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
    const int64_t start = n.size() == 1 ? 0 : n[0], stop = n.size() == 1 ? n[0] : n[1], step = n.size() == 3 ? n[2] : 1;
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

Value Renderer::method(const Value& obj, const std::string& m, const Args& a, int line) {
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
      const std::string from = string_arg(a, 0, "old", line, "replace"), to = string_arg(a, 1, "new", line, "replace");
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

Value Renderer::filter(const Expr& e) {
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
    if (v.is_string()) return Value::of(static_cast<int64_t>(code_point_offsets(v.data.get<std::string>()).size()) - 1);
    if (v.is_list() || v.is_dict()) return Value::of(static_cast<int64_t>(v.data.size()));
    if (v.kind == Value::Kind::kNamespace) return Value::of(static_cast<int64_t>(v.ns->size()));
    fail(e.line, fmt::format("object of type '{}' has no len()", type_name(v)));
  }
  if (f == "tojson") {
    util::PythonJsonOptions o;
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
    return Value::of(util::python_json_dumps(data_of(v, e.line), o));
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

bool Renderer::test(const Expr& e) {
  const Value v = eval(*e.kids[0]);
  std::vector<Value> args;
  for (size_t k = 1; k < e.kids.size(); ++k) args.push_back(eval(*e.kids[k]));
  return run_test(e.name, v, args, e.line);
}

bool Renderer::run_test(const std::string& t, const Value& v, const std::vector<Value>& args, int line) {
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

}  // namespace tessera::data::chat_template::detail
