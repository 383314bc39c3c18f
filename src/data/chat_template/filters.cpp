// The chat-template builtins: globals (namespace, range, dict, raise_exception, strftime_now), str and dict methods,
// filters and tests, each with jinja2's argument names and Python's semantics. Whatever a builtin builds is sized
// before it is allocated or grown through Renderer::append, and charged against the render's budget (renderer.h).
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
namespace {

// The most bytes python_json_dumps can write for `j` with `o`: each string byte escaped as wide as it can be, each
// item with its separators, a newline and its indentation. `j` is no deeper than kMaxValueDepth (json_cost checked).
size_t json_text_bound(const Json& j, const util::PythonJsonOptions& o) {
  const size_t item_sep = o.separators ? o.separators->first.size() : 2;
  const size_t key_sep = o.separators ? o.separators->second.size() : 2;
  const auto indent = static_cast<size_t>(o.indent.value_or(0));
  size_t bound = 0;
  const auto add = [&](size_t n) { bound = bound > SIZE_MAX - n ? SIZE_MAX : bound + n; };
  const auto text = [&](const std::string& s) {
    add(2);
    for (const char ch : s) {
      const auto c = static_cast<unsigned char>(ch);
      add(c < 0x20 || c == 0x7f || (c >= 0x80 && o.ensure_ascii) ? 6 : c == '"' || c == '\\' ? 2 : 1);
    }
  };
  std::vector<std::pair<const Json*, size_t>> todo = {{&j, 0}};
  while (!todo.empty()) {
    const auto [node, depth] = todo.back();
    todo.pop_back();
    add(32);  // the longest number, or null/true/false, or the brackets
    add(item_sep);
    add(key_sep);
    add(2 * (1 + indent * (depth + 1)));  // the newlines and indentation before the item and its closing bracket
    if (node->is_string()) {
      text(node->get_ref<const std::string&>());
    } else if (node->is_object()) {
      for (const auto& [k, v] : node->items()) {
        text(k);
        todo.emplace_back(&v, depth + 1);
      }
    } else if (node->is_array()) {
      for (const Json& v : *node) todo.emplace_back(&v, depth + 1);
    }
  }
  return bound;
}

}  // namespace

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
    throw Error(kComponent, fmt::format("{}: {}", name_, a.pos.empty() ? std::string() : str(a.pos[0], e.line)));
  }
  if (f.name == "namespace" || f.name == "dict") {
    Json obj = Json::object();
    for (const Value& p : a.pos) {
      if (!p.is_dict()) fail(e.line, fmt::format("{}() takes keyword arguments or a dict", f.name));
      charge(json_cost(p.data(), e.line), e.line);
      for (const auto& [k, v] : p.data().items()) obj[k] = v;
    }
    for (const auto& [k, v] : a.kw) obj[k] = copy_of(v, e.line);
    if (f.name == "dict") return Value::of(std::move(obj));
    Value ns;
    ns.kind = Value::Kind::kNamespace;
    ns.ns = std::make_shared<Json>(std::move(obj));
    return ns;
  }
  if (f.name == "range") return range(a.pos, e.line);
  if (f.name == "strftime_now") {
    const std::string& fmt_text = string_arg(a, 0, "format", e.line, "strftime_now");
    const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    const size_t len = std::strftime(buf, sizeof(buf), fmt_text.c_str(), &tm);
    return Value::of(std::string(buf, len));
  }
  fail(e.line, fmt::format("unknown function '{}'", f.name));
}

// range(stop), range(start, stop[, step]) as Python counts it, refused past kMaxRange items before anything is built.
// stop - start overflows int64 for far-apart bounds, and an index stepped past the last item can pass INT64_MAX: the
// count comes from the unsigned distance and the items are start + k * step.
Value Renderer::range(const std::vector<Value>& args, int line) {
  std::vector<int64_t> n;
  for (const Value& p : args) {
    if (!p.is_integer()) fail(line, "range() takes integers");
    n.push_back(p.data().get<int64_t>());
  }
  if (n.empty() || n.size() > 3) fail(line, "range() takes 1 to 3 arguments");
  const int64_t start = n.size() == 1 ? 0 : n[0], stop = n.size() == 1 ? n[0] : n[1], step = n.size() == 3 ? n[2] : 1;
  if (step == 0) fail(line, "range() step must not be zero");
  // Unsigned 64-bit arithmetic: the distance between the bounds is below 2^64, and start + k * step (wrapping, then
  // read back as int64) is the true item, which lies between the bounds.
  uint64_t count = 0;
  if (step > 0 && stop > start) {
    count = (static_cast<uint64_t>(stop) - static_cast<uint64_t>(start) - 1) / static_cast<uint64_t>(step) + 1;
  } else if (step < 0 && stop < start) {
    const uint64_t by = static_cast<uint64_t>(-(step + 1)) + 1;  // |step|, INT64_MIN's too
    count = (static_cast<uint64_t>(start) - static_cast<uint64_t>(stop) - 1) / by + 1;
  }
  if (count > static_cast<uint64_t>(kMaxRange)) {
    fail(line, fmt::format("range({}, {}, {}) has more items than the limit of {}", start, stop, step, kMaxRange));
  }
  charge(static_cast<size_t>(count) * kNodeBytes, line);
  Json out = Json::array();
  for (uint64_t k = 0; k < count; ++k) {
    out.push_back(static_cast<int64_t>(static_cast<uint64_t>(start) + k * static_cast<uint64_t>(step)));
  }
  return Value::of(std::move(out));
}

// str.replace: `to` for every `from` (for an empty `from`, around every code point, as Python does), with the result's
// size taken before it is built.
Value Renderer::replace(const std::string& s, const std::string& from, const std::string& to, int line) {
  charge(s.size(), line);
  const std::string_view text = s;
  std::string out;
  if (from.empty()) {
    const size_t n = code_point_count(s);
    out.reserve(sum_size(s.size(), product_size(to.size(), n + 1, line), line));
    append(out, to, line);
    for (size_t i = 0; i < s.size();) {
      const size_t j = next_code_point(s, i);
      append(out, text.substr(i, j - i), line);
      append(out, to, line);
      i = j;
    }
    return Value::of(std::move(out));
  }
  size_t count = 0;
  for (size_t at = find_text(s, from); at != std::string::npos; at = find_text(s, from, at + from.size())) ++count;
  out.reserve(sum_size(s.size() - count * from.size(), product_size(to.size(), count, line), line));
  size_t pos = 0;
  for (size_t at = find_text(s, from); at != std::string::npos; at = find_text(s, from, pos)) {
    append(out, text.substr(pos, at - pos), line);
    append(out, to, line);
    pos = at + from.size();
  }
  append(out, text.substr(pos), line);
  return Value::of(std::move(out));
}

Value Renderer::method(const Value& obj, const std::string& m, const Args& a, int line) {
  if (obj.is_string()) {
    const std::string& s = obj.data().get_ref<const std::string&>();
    const auto opt_chars = [&](size_t i) -> std::optional<std::string> {
      const Value* v = a.get(i, "chars");
      if (!v || v->is_none()) return std::nullopt;
      if (!v->is_string()) fail(line, m + "() takes a string");
      return v->data().get<std::string>();
    };
    if (m == "strip" || m == "lstrip" || m == "rstrip" || m == "upper" || m == "lower" || m == "title" ||
        m == "capitalize") {
      charge(s.size(), line);
    }
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
        options.push_back(v->data().get<std::string>());
      } else if (v && v->is_list()) {
        for (const Json& o : v->data()) {
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
      const int64_t ms = maxsplit && maxsplit->is_integer() ? maxsplit->data().get<int64_t>() : -1;
      if (m == "rsplit" && ms >= 0) fail(line, "rsplit() with maxsplit is not supported");
      std::optional<std::string> sep_text;
      if (sep && !sep->is_none()) {
        if (!sep->is_string()) fail(line, m + "() takes a string separator");
        sep_text = sep->data().get<std::string>();
        if (sep_text->empty()) fail(line, "empty separator");
      }
      // Each part costs a JSON item: count them first (at most one a separator, or a byte), then build.
      size_t parts = 1;
      if (sep_text) {
        for (size_t at = find_text(s, *sep_text); at != std::string::npos;
             at = find_text(s, *sep_text, at + sep_text->size()))
          ++parts;
      } else {
        parts += s.size() / 2;
      }
      charge(s.size(), line);
      charge(parts > kMaxBuilt / kNodeBytes ? kMaxBuilt + 1 : parts * kNodeBytes, line);
      Json out = Json::array();
      for (std::string& part : py_split(s, sep_text, ms)) out.push_back(std::move(part));
      return Value::of(std::move(out));
    }
    if (m == "replace") {
      return replace(s, string_arg(a, 0, "old", line, "replace"), string_arg(a, 1, "new", line, "replace"), line);
    }
    if (m == "find") {
      const std::string& sub = string_arg(a, 0, "sub", line, "find");
      charge(s.size(), line);
      const size_t at = find_text(s, sub);
      if (at == std::string::npos) return Value::of(-1);
      return Value::of(static_cast<int64_t>(code_point_count(std::string_view(s).substr(0, at))));
    }
    if (m == "count") {
      const std::string& sub = string_arg(a, 0, "sub", line, "count");
      charge(s.size(), line);
      if (sub.empty()) return Value::of(static_cast<int64_t>(code_point_count(s)) + 1);
      int64_t n = 0;
      for (size_t at = find_text(s, sub); at != std::string::npos; at = find_text(s, sub, at + sub.size())) ++n;
      return Value::of(n);
    }
    if (m == "join") {
      const Value* v = a.get(0, "iterable");
      if (!v) fail(line, "join() takes an iterable");
      const Value items = items_of(*v, line);
      std::string out;
      bool first = true;
      for (const Json& item : items.data()) {
        if (!item.is_string()) fail(line, "join() takes strings");
        if (!first) append(out, s, line);
        append(out, item.get_ref<const std::string&>(), line);
        first = false;
      }
      return Value::of(std::move(out));
    }
    if (m == "format") {
      std::string out;
      size_t next = 0, pos = 0;
      for (size_t at = find_text(s, "{}"); at != std::string::npos; at = find_text(s, "{}", pos)) {
        append(out, std::string_view(s).substr(pos, at - pos), line);
        if (next >= a.pos.size()) fail(line, "format(): not enough arguments");
        append(out, str(a.pos[next++], line), line);
        pos = at + 2;
      }
      append(out, std::string_view(s).substr(pos), line);
      return Value::of(std::move(out));
    }
  }
  if (obj.is_dict()) {
    if (m == "items" || m == "keys" || m == "values") {
      charge(json_cost(obj.data(), line), line);
      Json out = Json::array();
      for (const auto& [k, v] : obj.data().items()) {
        if (m == "items") out.push_back(Json::array({k, v}));
        if (m == "keys") out.push_back(k);
        if (m == "values") out.push_back(v);
      }
      return Value::of(std::move(out));
    }
    if (m == "get") {
      const Value* key = a.get(0, "key");
      if (key && key->is_string()) {
        auto it = obj.data().find(key->data().get_ref<const std::string&>());
        if (it != obj.data().end()) return Value::part(obj, *it);
      }
      const Value* d = a.get(1, "default");
      return d ? *d : Value::of(nullptr);
    }
  }
  if (obj.kind == Value::Kind::kData && obj.data().is_array() && (m == "append" || m == "pop" || m == "extend")) {
    fail(line, fmt::format("lists are immutable in chat templates ({}())", m));
  }
  fail(line, fmt::format("'{}' object has no method '{}'", type_name(obj), m));
}

Value Renderer::filter(const Expr& e) {
  const Value v = eval(*e.kids[0]);
  const Args a = args_of(e, 1);
  return apply_filter(e.name, v, a, e.line);
}

Value Renderer::tojson(const Value& v, const Args& a, int line) {
  util::PythonJsonOptions o;
  o.ensure_ascii = false;
  if (const Value* x = a.get(0, "ensure_ascii")) o.ensure_ascii = truthy(*x);
  if (const Value* x = a.get(1, "indent"); x && x->is_integer())
    o.indent = static_cast<int>(indent_width(x->data().get<int64_t>(), line));
  if (const Value* x = a.get(2, "separators"); x && !x->is_none()) {
    if (!x->is_list() || x->data().size() != 2 || !x->data()[0].is_string() || !x->data()[1].is_string())
      fail(line, "tojson separators must be a pair of strings");
    o.separators = std::make_pair(x->data()[0].get<std::string>(), x->data()[1].get<std::string>());
  }
  if (const Value* x = a.get(3, "sort_keys")) o.sort_keys = truthy(*x);
  const Json& j = json_of(v, line);
  charge(json_cost(j, line), line);
  const size_t bound = json_text_bound(j, o);
  if (bound > kMaxString)
    fail(line, fmt::format("string too long: tojson's text could be longer than the limit of {} bytes", kMaxString));
  charge(bound, line);
  return Value::of(util::python_json_dumps(j, o));
}

// jinja2's indent: `width` spaces before every line but the first (unless `first`), blank lines only if `blank`.
Value Renderer::indent(const std::string& s, const Args& a, int line) {
  const int64_t width =
      a.get(0, "width") && a.get(0, "width")->is_integer() ? a.get(0, "width")->data().get<int64_t>() : 4;
  const bool first = a.get(1, "first") && truthy(*a.get(1, "first"));
  const bool blank = a.get(2, "blank") && truthy(*a.get(2, "blank"));
  const std::string pad(static_cast<size_t>(indent_width(width, line)), ' ');
  const std::string_view text = s;
  std::string out;
  for (size_t k = 0, pos = 0;; ++k) {
    const size_t nl = text.find('\n', pos);
    const std::string_view ln = text.substr(pos, (nl == std::string_view::npos ? text.size() : nl) - pos);
    if (k > 0) append(out, "\n", line);
    const bool indented = (k > 0 || first) && (blank || !py_strip(std::string(ln), true, true, std::nullopt).empty());
    if (indented) append(out, pad, line);
    append(out, ln, line);
    if (nl == std::string_view::npos) break;
    pos = nl + 1;
  }
  return Value::of(std::move(out));
}

Value Renderer::apply_filter(const std::string& f, const Value& v, const Args& a, int line) {
  if (f == "safe" || f == "e" || f == "escape" || f == "forceescape") {
    if (f != "safe") fail(line, "HTML escaping is not supported");
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
    if (const Value* c = a.get(0, "chars"); c && c->is_string()) chars = c->data().get<std::string>();
    return Value::of(py_strip(str(v, line), true, true, chars));
  }
  if (f == "string") return v.is_string() ? v : Value::of(str(v, line));
  if (f == "upper") return Value::of(ascii_map(str(v, line), [](int c) { return std::toupper(c); }));
  if (f == "lower") return Value::of(ascii_map(str(v, line), [](int c) { return std::tolower(c); }));
  if (f == "capitalize") return Value::of(py_capitalize(str(v, line)));
  if (f == "title") return Value::of(py_title(str(v, line)));
  if (f == "length" || f == "count") {
    if (!v.defined()) return Value::of(0);
    if (v.is_string()) {
      charge(v.data().get_ref<const std::string&>().size(), line);
      return Value::of(static_cast<int64_t>(code_point_count(v.data().get_ref<const std::string&>())));
    }
    if (v.is_list() || v.is_dict()) return Value::of(static_cast<int64_t>(v.data().size()));
    if (v.kind == Value::Kind::kNamespace) return Value::of(static_cast<int64_t>(v.ns->size()));
    fail(line, fmt::format("object of type '{}' has no len()", type_name(v)));
  }
  if (f == "tojson") return tojson(v, a, line);
  if (f == "first" || f == "last") {
    if (v.is_string()) {  // a code point, without listing them all
      const std::string& s = v.data().get_ref<const std::string&>();
      if (s.empty()) return Value::undefined(f);
      charge(s.size(), line);
      size_t b = 0;
      if (f == "last") {
        for (size_t i = 0; i < s.size(); i = next_code_point(s, i)) b = i;
      }
      return Value::of(s.substr(b, next_code_point(s, b) - b));
    }
    const Value items = items_of(v, line);
    if (items.data().empty()) return Value::undefined(f);
    return Value::part(items, f == "first" ? items.data().front() : items.data().back());
  }
  if (f == "join") {
    const std::string sep = a.get(0, "d") ? str(*a.get(0, "d"), line) : "";
    const Value* attr = a.get(1, "attribute");
    const std::string attr_name = attr ? str(*attr, line) : "";
    const Value items = items_of(v, line);
    std::string out;
    bool first = true;
    for (const Json& item : items.data()) {
      Value x = Value::part(items, item);
      if (attr) x = attribute(x, attr_name, line);
      if (!first) append(out, sep, line);
      if (x.is_string()) {
        append(out, x.data().get_ref<const std::string&>(), line);
      } else {
        append(out, str(x, line), line);
      }
      first = false;
    }
    return Value::of(std::move(out));
  }
  if (f == "replace") {
    const Value* from = a.get(0, "old");
    const Value* to = a.get(1, "new");
    if (!from || !to) fail(line, "replace takes the old and the new string");
    return replace(str(v, line), str(*from, line), str(*to, line), line);
  }
  if (f == "int") {
    if (v.is_integer()) return v;
    if (v.is_number()) return Value::of(static_cast<int64_t>(v.data().get<double>()));
    if (v.is(Json::value_t::boolean)) return Value::of(v.data().get<bool>() ? 1 : 0);
    try {
      return Value::of(static_cast<int64_t>(std::stoll(py_strip(str(v, line), true, true, std::nullopt))));
    } catch (const std::exception&) {
      return Value::of(a.get(0, "default") ? copy_of(*a.get(0, "default"), line) : Json(0));
    }
  }
  if (f == "float") {
    if (v.is_number()) return Value::of(v.data().get<double>());
    try {
      return Value::of(std::stod(str(v, line)));
    } catch (const std::exception&) {
      return Value::of(0.0);
    }
  }
  if (f == "abs") {
    if (v.is_integer()) {
      if (v.data().get<int64_t>() == INT64_MIN) fail(line, "integer overflow");
      return Value::of(std::abs(v.data().get<int64_t>()));
    }
    if (v.is_number()) return Value::of(std::abs(v.data().get<double>()));
    fail(line, "abs takes a number");
  }
  if (f == "round") {
    if (!v.is_number()) fail(line, "round takes a number");
    const int64_t digits = a.get(0, "precision") ? a.get(0, "precision")->data().get<int64_t>() : 0;
    const double scale = std::pow(10.0, static_cast<double>(digits));
    return Value::of(std::nearbyint(v.data().get<double>() * scale) / scale);
  }
  if (f == "list") return items_of(v, line);
  if (f == "items") {
    if (!v.defined()) return Value::of(Json::array());
    if (!v.is_dict()) fail(line, "items expects a mapping");
    Args none;
    return method(v, "items", none, line);
  }
  if (f == "dictsort") {
    if (!v.is_dict()) fail(line, "dictsort expects a mapping");
    charge(json_cost(v.data(), line), line);
    std::vector<std::pair<std::string, const Json*>> items;
    for (const auto& [k, x] : v.data().items()) items.emplace_back(k, &x);
    std::sort(items.begin(), items.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    Json out = Json::array();
    for (auto& [k, x] : items) out.push_back(Json::array({k, *x}));
    return Value::of(std::move(out));
  }
  if (f == "reverse") {
    if (v.is_string()) {
      const std::string& s = v.data().get_ref<const std::string&>();
      charge(s.size(), line);
      const std::vector<size_t> at = code_point_offsets(s);
      std::string out;
      out.reserve(s.size());
      for (size_t k = at.size() - 1; k > 0; --k) out.append(s, at[k - 1], at[k] - at[k - 1]);
      return Value::of(std::move(out));
    }
    const Value items = items_of(v, line);
    charge(json_cost(items.data(), line), line);
    return Value::of(Json(std::vector<Json>(items.data().rbegin(), items.data().rend())));
  }
  if (f == "unique") {
    const Value items = items_of(v, line);
    Json out = Json::array();
    for (const Json& item : items.data()) {
      charge(out.size() * kNodeBytes, line);  // the comparisons with the items kept so far
      if (std::find(out.begin(), out.end(), item) == out.end()) {
        charge(json_cost(item, line), line);
        out.push_back(item);
      }
    }
    return Value::of(std::move(out));
  }
  if (f == "select" || f == "reject") {
    const Value items = items_of(v, line);
    Json out = Json::array();
    for (const Json& item : items.data()) {
      const Value x = Value::part(items, item);
      bool keep = truthy(x);
      if (!a.pos.empty()) {
        std::vector<Value> targs(a.pos.begin() + 1, a.pos.end());
        keep = run_test(str(a.pos[0], line), x, targs, line);
      }
      if (keep == (f == "select")) out.push_back(copy_of(x, line));
    }
    return Value::of(std::move(out));
  }
  if (f == "selectattr" || f == "rejectattr") {
    if (a.pos.empty()) fail(line, f + " needs an attribute name");
    const std::string attr = str(a.pos[0], line);
    const Value items = items_of(v, line);
    Json out = Json::array();
    for (const Json& item : items.data()) {
      const Value x = attribute(Value::part(items, item), attr, line);
      bool keep = truthy(x);
      if (a.pos.size() >= 2) {
        std::vector<Value> targs(a.pos.begin() + 2, a.pos.end());
        keep = run_test(str(a.pos[1], line), x, targs, line);
      }
      if (keep == (f == "selectattr")) {
        charge(json_cost(item, line), line);
        out.push_back(item);
      }
    }
    return Value::of(std::move(out));
  }
  if (f == "map") {
    const Value* attr = a.get(99, "attribute");  // a keyword only
    const Value items = items_of(v, line);
    Json out = Json::array();
    for (const Json& item : items.data()) {
      const Value x = Value::part(items, item);
      if (attr) {
        Value y = attribute(x, str(*attr, line), line);
        if (!y.defined() && a.kw.count("default")) y = a.kw.at("default");
        out.push_back(copy_of(y, line));
      } else if (!a.pos.empty()) {
        out.push_back(copy_of(apply_filter(str(a.pos[0], line), x, Args{}, line), line));
      } else {
        fail(line, "map needs attribute= or a filter name");
      }
    }
    return Value::of(std::move(out));
  }
  if (f == "indent") return indent(str(v, line), a, line);
  fail(line, fmt::format("unknown filter '{}'", f));
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
  if (t == "true") return v.is(Json::value_t::boolean) && v.data().get<bool>();
  if (t == "false") return v.is(Json::value_t::boolean) && !v.data().get<bool>();
  if (t == "mapping") return v.is_dict() || v.kind == Value::Kind::kNamespace;
  if (t == "iterable") return v.is_list() || v.is_dict() || v.is_string() || !v.defined();
  if (t == "sequence") return v.is_list() || v.is_dict() || v.is_string();
  if (t == "callable") return v.kind == Value::Kind::kFunction;
  if (t == "equalto" || t == "eq" || t == "==" || t == "sameas") return same(v, arg(0), line);
  if (t == "ne" || t == "!=") return !same(v, arg(0), line);
  if (t == "gt" || t == "ge" || t == "lt" || t == "le") {
    const int c = compare(v, arg(0), line);
    return t == "gt" ? c > 0 : t == "ge" ? c >= 0 : t == "lt" ? c < 0 : c <= 0;
  }
  if (t == "in") return contains(arg(0), v, line);
  if (t == "odd" || t == "even") {
    if (!v.is_integer()) fail(line, fmt::format("test '{}' needs an integer", t));
    return (v.data().get<int64_t>() % 2 != 0) == (t == "odd");
  }
  if (t == "divisibleby") {
    if (!v.is_integer() || !arg(0).is_integer() || arg(0).data().get<int64_t>() == 0)
      fail(line, "divisibleby needs integers");
    const int64_t d = arg(0).data().get<int64_t>();
    return d == -1 || v.data().get<int64_t>() % d == 0;  // INT64_MIN % -1 traps
  }
  if (t == "lower" || t == "upper") {
    const std::string s = str(v, line);
    return s == ascii_map(
                    s, t == "lower" ? [](int c) { return std::tolower(c); } : [](int c) { return std::toupper(c); });
  }
  fail(line, fmt::format("unknown test '{}'", t));
}

}  // namespace tessera::data::chat_template::detail
