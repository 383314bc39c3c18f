// Python's str()/repr(), truthiness, == and str helpers over JSON values, as chat templates print and compare them.
#include "value.h"

#include <fmt/format.h>

#include <string.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "tessera/util/python_json.h"
#include "tessera/util/utf8.h"

namespace tessera::data::chat_template::detail {

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

size_t next_code_point(std::string_view s, size_t i) {
  const auto c = static_cast<uint8_t>(s[i]);
  return std::min(i + (c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1), s.size());
}

size_t code_point_count(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); i = next_code_point(s, i)) ++n;
  return n;
}

size_t find_text(std::string_view hay, std::string_view needle, size_t from) {
  if (from > hay.size()) return std::string_view::npos;
  if (needle.empty()) return from;
  const void* at = ::memmem(hay.data() + from, hay.size() - from, needle.data(), needle.size());
  return at == nullptr ? std::string_view::npos : static_cast<size_t>(static_cast<const char*>(at) - hay.data());
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

namespace {

void repr_string_append(std::string& out, const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  out += q;
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
}

}  // namespace

std::string py_repr_string(const std::string& s) {
  std::string out;
  repr_string_append(out, s);
  return out;
}

// Python's repr() of a JSON value (lists and dicts print their items this way).
std::string py_repr(const Json& j) {
  std::string out;
  py_repr_append(out, j, std::string::npos);
  return out;
}

bool py_repr_append(std::string& out, const Json& j, size_t limit) {
  if (out.size() > limit) return false;
  switch (j.type()) {
    case Json::value_t::null:
      out += "None";
      break;
    case Json::value_t::boolean:
      out += j.get<bool>() ? "True" : "False";
      break;
    case Json::value_t::number_integer:
      out += std::to_string(j.get<int64_t>());
      break;
    case Json::value_t::number_unsigned:
      out += std::to_string(j.get<uint64_t>());
      break;
    case Json::value_t::number_float:
      out += util::python_float_repr(j.get<double>());
      break;
    case Json::value_t::string:
      repr_string_append(out, j.get_ref<const std::string&>());
      break;
    case Json::value_t::array:
      out += '[';
      for (size_t i = 0; i < j.size(); ++i) {
        if (i) out += ", ";
        if (!py_repr_append(out, j[i], limit)) return false;
      }
      out += ']';
      break;
    case Json::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [k, v] : j.items()) {
        if (!first) out += ", ";
        repr_string_append(out, k);
        out += ": ";
        if (!py_repr_append(out, v, limit)) return false;
        first = false;
      }
      out += '}';
      break;
    }
    default:
      out += "None";
  }
  return out.size() <= limit;
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
  return v.data().is_string() ? v.data().get<std::string>() : py_repr(v.data());
}

bool truthy(const Value& v) {
  if (v.kind == Value::Kind::kUndefined) return false;
  if (v.kind != Value::Kind::kData) return true;
  const Json& j = v.data();
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
  if (numeric(a.data()) && numeric(b.data())) {
    const auto num = [](const Json& j) { return j.is_boolean() ? (j.get<bool>() ? 1.0 : 0.0) : j.get<double>(); };
    if (a.data().is_number_integer() && b.data().is_number_integer())
      return a.data().get<int64_t>() == b.data().get<int64_t>();
    return num(a.data()) == num(b.data());
  }
  return a.data() == b.data();
}

std::vector<std::string> py_split(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      const size_t at = find_text(s, *sep, pos);
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

}  // namespace tessera::data::chat_template::detail
