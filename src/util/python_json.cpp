// Python-compatible JSON serialisation.
#include "tessera/util/python_json.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

namespace tessera::util {
namespace {

void escape_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80 || !ensure_ascii) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        default:
          if (c < 0x20 || (c == 0x7f && ensure_ascii)) {
            out += fmt::format("\\u{:04x}", c);
          } else {
            out += static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    // Decode one UTF-8 sequence (the input is valid UTF-8: nlohmann validates on parse and dump).
    const int len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
    uint32_t cp = c & (len == 4 ? 0x07 : len == 3 ? 0x0f : 0x1f);
    for (int k = 1; k < len && i + static_cast<size_t>(k) < s.size(); ++k) {
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + static_cast<size_t>(k)]) & 0x3f);
    }
    i += static_cast<size_t>(len);
    if (cp >= 0x10000) {
      cp -= 0x10000;
      out += fmt::format("\\u{:04x}\\u{:04x}", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
    } else {
      out += fmt::format("\\u{:04x}", cp);
    }
  }
  out += '"';
}

struct Dumper {
  const PythonJsonOptions& o;
  std::string item_sep, key_sep;
  std::string out;

  void newline(int depth) {
    out += '\n';
    out.append(static_cast<size_t>(*o.indent) * static_cast<size_t>(depth), ' ');
  }

  void dump(const nlohmann::ordered_json& v, int depth) {
    switch (v.type()) {
      case nlohmann::json::value_t::null:
        out += "null";
        break;
      case nlohmann::json::value_t::boolean:
        out += v.get<bool>() ? "true" : "false";
        break;
      case nlohmann::json::value_t::number_integer:
        out += std::to_string(v.get<int64_t>());
        break;
      case nlohmann::json::value_t::number_unsigned:
        out += std::to_string(v.get<uint64_t>());
        break;
      case nlohmann::json::value_t::number_float: {
        const double d = v.get<double>();
        if (std::isnan(d)) {
          out += "NaN";
        } else if (std::isinf(d)) {
          out += d > 0 ? "Infinity" : "-Infinity";
        } else {
          out += python_float_repr(d);
        }
        break;
      }
      case nlohmann::json::value_t::string:
        escape_string(v.get_ref<const std::string&>(), o.ensure_ascii, out);
        break;
      case nlohmann::json::value_t::array: {
        if (v.empty()) {
          out += "[]";
          break;
        }
        out += '[';
        bool first = true;
        for (const auto& item : v) {
          if (!first) out += item_sep;
          first = false;
          if (o.indent) newline(depth + 1);
          dump(item, depth + 1);
        }
        if (o.indent) newline(depth);
        out += ']';
        break;
      }
      case nlohmann::json::value_t::object: {
        if (v.empty()) {
          out += "{}";
          break;
        }
        std::vector<std::string> keys;
        for (const auto& [k, val] : v.items()) keys.push_back(k);
        if (o.sort_keys) std::sort(keys.begin(), keys.end());  // Python sorts by code point; UTF-8 bytes sort the same
        out += '{';
        bool first = true;
        for (const std::string& k : keys) {
          if (!first) out += item_sep;
          first = false;
          if (o.indent) newline(depth + 1);
          escape_string(k, o.ensure_ascii, out);
          out += key_sep;
          dump(v.at(k), depth + 1);
        }
        if (o.indent) newline(depth);
        out += '}';
        break;
      }
      default:
        out += "null";  // binary / discarded values do not occur in the documents we write
    }
  }
};

}  // namespace

std::string python_float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  // Shortest round-trip digits (fmt's default, Dragonbox), normalised to digits d1d2d3... and a decimal exponent X
  // (value = d1.d2d3... x 10^X) whatever layout fmt chose, then laid out as Python's repr does: fixed notation when
  // -4 <= X < 16, else d.ddde+XX with at least two exponent digits.
  std::string text = fmt::format("{}", v);
  const bool negative = text[0] == '-';
  if (negative) text.erase(0, 1);
  int exponent = 0;
  if (const size_t e = text.find('e'); e != std::string::npos) {
    exponent = std::stoi(text.substr(e + 1));
    text.resize(e);
  }
  const size_t dot = text.find('.');
  const std::string int_part = text.substr(0, dot);
  const std::string frac_part = dot == std::string::npos ? "" : text.substr(dot + 1);
  std::string digits = int_part + frac_part;
  exponent += static_cast<int>(int_part.size()) - 1;
  const size_t first = digits.find_first_not_of('0');
  exponent -= static_cast<int>(first);
  digits = digits.substr(first);
  digits.erase(digits.find_last_not_of('0') + 1);
  std::string out;
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out = "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out = digits + std::string(static_cast<size_t>(exponent) + 1 - digits.size(), '0') + ".0";
    } else {
      const size_t point = static_cast<size_t>(exponent) + 1;  // exponent >= 0 here
      out = digits.substr(0, point) + "." + digits.substr(point);
    }
  } else {
    out = digits.substr(0, 1) + (digits.size() > 1 ? "." + digits.substr(1) : "") +
          fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  }
  return negative ? "-" + out : out;
}

std::string python_json_dumps(const nlohmann::ordered_json& value, bool sort_keys) {
  PythonJsonOptions o;
  o.sort_keys = sort_keys;
  return python_json_dumps(value, o);
}

std::string python_json_dumps(const nlohmann::ordered_json& value, const PythonJsonOptions& options) {
  Dumper d{options, options.indent ? "," : ", ", ": ", {}};
  if (options.separators) std::tie(d.item_sep, d.key_sep) = *options.separators;
  d.dump(value, 0);
  return std::move(d.out);
}

}  // namespace tessera::util
