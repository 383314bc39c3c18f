// Recipe value tree: YAML parsing with provenance, command-line overrides, and OmegaConf-style interpolation.
#include "tessera/config/value.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <regex>
#include <set>
#include <sstream>
#include <string_view>

#include "tessera/config/yaml_file.h"
#include "tessera/util/error.h"
#include "tessera/util/redact.h"
#include "tessera/util/utf8.h"

namespace tessera::config {
namespace {

constexpr const char* kComponent = "recipe";

[[noreturn]] void fail(const Origin& origin, const std::string& key, const std::string& message) {
  std::string where = origin.describe();
  std::string text = where.empty() ? "" : where + ": ";
  if (!key.empty()) text += key + ": ";
  throw ConfigError(kComponent, text + message);
}

// Fails unless `text` (a scalar or key as yaml-cpp decoded it) is UTF-8. The whole text is checked first; this guards
// what decoding makes of it (fuzz_recipe_yaml found a well-formed text whose decoded scalar was not).
void require_utf8(const std::string& text, const Origin& origin, const std::string& path) {
  if (const size_t bad = util::first_invalid_utf8(text); bad != std::string_view::npos) {
    fail(origin, path,
         fmt::format("not valid UTF-8 after YAML decoding (byte 0x{:02X})",
                     static_cast<unsigned>(static_cast<unsigned char>(text[bad]))));
  }
}

const std::regex& int_re() {
  static const std::regex re(R"([-+]?(0|[1-9][0-9_]*))");
  return re;
}
const std::regex& float_re() {
  // OmegaConf's float resolver (accepts `1e-8`, which PyYAML alone would read as a string).
  static const std::regex re(
      R"([-+]?(([0-9][0-9_]*)\.[0-9_]*([eE][-+]?[0-9]+)?|([0-9][0-9_]*)([eE][-+]?[0-9]+)|\.[0-9_]+([eE][-+]?[0-9]+)?|\.(inf|Inf|INF))|\.(nan|NaN|NAN))");
  return re;
}

bool is_null_text(const std::string& t) {
  return t.empty() || t == "~" || t == "null" || t == "Null" || t == "NULL";
}

std::string without_underscores(std::string s) {
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  return s;
}

Value convert(const YAML::Node& node, const Origin& base, const std::string& path) {
  Origin origin = base;
  if (!node.Mark().is_null()) origin.line = node.Mark().line + 1;
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      return Value::null(origin);
    case YAML::NodeType::Scalar: {
      const bool quoted = node.Tag() == "!";
      if (!quoted && is_null_text(node.Scalar())) return Value::null(origin);
      require_utf8(node.Scalar(), origin, path);
      return Value::scalar(node.Scalar(), quoted, origin);
    }
    case YAML::NodeType::Sequence: {
      Value seq = Value::sequence(origin);
      int i = 0;
      for (const auto& item : node) seq.items().push_back(convert(item, base, fmt::format("{}[{}]", path, i++)));
      return seq;
    }
    case YAML::NodeType::Map: {
      Value map = Value::map(origin);
      for (const auto& kv : node) {
        if (!kv.first.IsScalar()) fail(origin, path, "mapping keys must be plain strings");
        const std::string key = kv.first.Scalar();
        require_utf8(key, origin, path);
        const std::string child = path.empty() ? key : path + "." + key;
        if (map.find(key) != nullptr) {
          Origin at = base;
          at.line = kv.first.Mark().line + 1;
          fail(at, child, "duplicate key");
        }
        map.entries().emplace_back(key, convert(kv.second, base, child));
      }
      return map;
    }
  }
  return Value::null(origin);
}

std::vector<std::string> split_path(std::string_view path) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    parts.emplace_back(path.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return parts;
}

std::string join_path(const std::vector<std::string>& parts, size_t n) {
  std::string out;
  for (size_t i = 0; i < n && i < parts.size(); ++i) out += (i ? "." : "") + parts[i];
  return out;
}

std::optional<size_t> parse_index(const std::string& s) {
  if (s.empty() || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  return static_cast<size_t>(std::stoull(s));
}

// OmegaConf-style interpolation over the whole tree.
class Resolver {
 public:
  explicit Resolver(Value& root) : root_(root) {}

  void resolve(Value& v, const std::string& path) {
    if (done_.count(path)) return;
    if (in_progress_.count(path)) fail(v.origin(), path, "interpolation cycle through this key");
    in_progress_.insert(path);
    if (v.is_scalar() && v.text().find("${") != std::string::npos) {
      resolve_scalar(v, path);
    } else if (v.is_map()) {
      for (auto& [key, child] : v.entries()) resolve(child, path.empty() ? key : path + "." + key);
    } else if (v.is_sequence()) {
      for (size_t i = 0; i < v.items().size(); ++i) resolve(v.items()[i], path + "." + std::to_string(i));
    }
    in_progress_.erase(path);
    done_.insert(path);
  }

 private:
  struct Piece {
    bool reference;
    std::string text;
  };

  // Splits "a${x.y}b" into literal and reference pieces; `\${` is a literal.
  static std::vector<Piece> tokenize(const Value& v, const std::string& path) {
    std::vector<Piece> pieces;
    const std::string& s = v.text();
    std::string literal;
    size_t i = 0;
    while (i < s.size()) {
      if (s.compare(i, 3, "\\${") == 0) {
        literal += "${";
        i += 3;
      } else if (s.compare(i, 2, "${") == 0) {
        const size_t close = s.find('}', i + 2);
        if (close == std::string::npos) fail(v.origin(), path, fmt::format("unterminated interpolation in \"{}\"", s));
        std::string ref = s.substr(i + 2, close - i - 2);
        if (ref.find("${") != std::string::npos) {
          fail(v.origin(), path, fmt::format("nested interpolation \"{}\" is not supported", s));
        }
        if (!literal.empty()) pieces.push_back({false, literal});
        literal.clear();
        pieces.push_back({true, ref});
        i = close + 1;
      } else {
        literal += s[i++];
      }
    }
    if (!literal.empty()) pieces.push_back({false, literal});
    return pieces;
  }

  void resolve_scalar(Value& v, const std::string& path) {
    const std::vector<Piece> pieces = tokenize(v, path);
    if (pieces.size() == 1 && pieces[0].reference) {
      const Value& target = lookup(v, path, pieces[0].text);
      const Origin here = v.origin();
      v = target;  // the whole value, any type; it keeps the origin of where it was written
      if (v.origin().file.empty() && v.origin().override.empty()) v.set_origin(here);
      return;
    }
    std::string out;
    for (const Piece& p : pieces) {
      if (!p.reference) {
        out += p.text;
        continue;
      }
      const Value& target = lookup(v, path, p.text);
      if (target.is_map() || target.is_sequence()) {
        fail(v.origin(), path,
             fmt::format("cannot insert {} (${{{}}}) into the string \"{}\"", target.type_name(), p.text, v.text()));
      }
      out += target.is_null() ? "None" : target.text();  // OmegaConf renders None as "None"
    }
    v.set_text(out);
  }

  const Value& lookup(const Value& from, const std::string& from_path, const std::string& ref) {
    if (ref.empty() || ref.front() == '.' || ref.find(':') != std::string::npos) {
      fail(from.origin(), from_path,
           fmt::format("interpolation ${{{}}} is not supported (only absolute key paths such as ${{variables.x}})",
                       ref));
    }
    const std::vector<std::string> parts = split_path(ref);
    Value* node = &root_;
    for (size_t i = 0; i < parts.size(); ++i) {
      Value* next = nullptr;
      if (node->is_map()) {
        next = node->find(parts[i]);
      } else if (node->is_sequence()) {
        if (auto idx = parse_index(parts[i]); idx && *idx < node->items().size()) next = &node->items()[*idx];
      }
      if (next == nullptr) {
        fail(from.origin(), from_path,
             fmt::format("cannot resolve ${{{}}}: key '{}' not found", ref, join_path(parts, i + 1)));
      }
      // An intermediate value that is itself a reference must be resolved before descending through it.
      if (i + 1 < parts.size() && next->is_scalar() && next->text().find("${") != std::string::npos) {
        resolve(*next, join_path(parts, i + 1));
      }
      node = next;
    }
    resolve(*node, ref);
    return *node;
  }

  Value& root_;
  std::set<std::string> in_progress_;
  std::set<std::string> done_;
};

}  // namespace

std::string Origin::describe() const {
  if (!override.empty()) {
    // Messages leave the process: a secret's value and a URI's user-info are hidden (util/redact.h).
    const size_t eq = override.find('=');
    if (eq != std::string::npos && util::is_secret(override.substr(0, eq), nlohmann::json(override.substr(eq + 1)))) {
      return fmt::format("command line `{}={}`", override.substr(0, eq), util::kRedacted);
    }
    return fmt::format("command line `{}`", util::redact_uri(override));
  }
  if (file.empty()) return "";
  return line > 0 ? fmt::format("{}:{}", file, line) : file;
}

Value Value::null(Origin origin) {
  Value v;
  v.origin_ = std::move(origin);
  return v;
}

Value Value::scalar(std::string text, bool quoted, Origin origin) {
  Value v;
  v.kind_ = Kind::kScalar;
  v.text_ = std::move(text);
  v.quoted_ = quoted;
  v.origin_ = std::move(origin);
  return v;
}

Value Value::sequence(Origin origin) {
  Value v;
  v.kind_ = Kind::kSequence;
  v.origin_ = std::move(origin);
  return v;
}

Value Value::map(Origin origin) {
  Value v;
  v.kind_ = Kind::kMap;
  v.origin_ = std::move(origin);
  return v;
}

const Value* Value::find(std::string_view key) const {
  for (const auto& [k, v] : entries_) {
    if (k == key) return &v;
  }
  return nullptr;
}

Value* Value::find(std::string_view key) {
  return const_cast<Value*>(std::as_const(*this).find(key));
}

Value& Value::set(const std::string& key, Value value) {
  if (Value* existing = find(key)) return *existing = std::move(value);
  entries_.emplace_back(key, std::move(value));
  return entries_.back().second;
}

std::optional<int64_t> Value::as_int() const {
  if (kind_ != Kind::kScalar || quoted_ || !std::regex_match(text_, int_re())) return std::nullopt;
  try {
    return std::stoll(without_underscores(text_));
  } catch (const std::out_of_range&) {
    return std::nullopt;
  }
}

std::optional<double> Value::as_double() const {
  if (kind_ != Kind::kScalar || quoted_) return std::nullopt;
  if (auto i = as_int()) return static_cast<double>(*i);
  if (!std::regex_match(text_, float_re())) return std::nullopt;
  std::string t = without_underscores(text_);
  const bool negative = !t.empty() && t[0] == '-';
  if (t.find("inf") != std::string::npos || t.find("Inf") != std::string::npos || t.find("INF") != std::string::npos) {
    return negative ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  }
  if (t.find("nan") != std::string::npos || t.find("NaN") != std::string::npos || t.find("NAN") != std::string::npos) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  // Out of double's range, Python's float() (which OmegaConf and PyYAML use) gives +-inf or rounds to zero; stod
  // would throw std::out_of_range for both (found by fuzz_recipe_yaml). strtod returns those values.
  return std::strtod(t.c_str(), nullptr);
}

std::optional<bool> Value::as_bool() const {
  if (kind_ != Kind::kScalar || quoted_) return std::nullopt;
  static const std::set<std::string> kTrue = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
  static const std::set<std::string> kFalse = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};
  if (kTrue.count(text_)) return true;
  if (kFalse.count(text_)) return false;
  return std::nullopt;
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::kNull:
      return "null";
    case Kind::kSequence:
      return "a list";
    case Kind::kMap:
      return "a mapping";
    case Kind::kScalar:
      if (as_bool()) return "a boolean";
      if (as_int()) return "an integer";
      if (as_double()) return "a number";
      return "a string";
  }
  return "a value";
}

std::string Value::brief() const {
  switch (kind_) {
    case Kind::kNull:
      return "null";
    case Kind::kSequence: {
      std::string out = "[";
      for (size_t i = 0; i < items_.size(); ++i) out += (i ? ", " : "") + items_[i].brief();
      return out + "]";
    }
    case Kind::kMap:
      return "{...}";
    case Kind::kScalar:
      return (quoted_ || type_name() == "a string") ? "\"" + text_ + "\"" : text_;
  }
  return "";
}

nlohmann::ordered_json Value::to_json() const {
  switch (kind_) {
    case Kind::kNull:
      return nullptr;
    case Kind::kSequence: {
      nlohmann::ordered_json arr = nlohmann::ordered_json::array();
      for (const Value& v : items_) arr.push_back(v.to_json());
      return arr;
    }
    case Kind::kMap: {
      nlohmann::ordered_json obj = nlohmann::ordered_json::object();
      for (const auto& [k, v] : entries_) obj[k] = v.to_json();
      return obj;
    }
    case Kind::kScalar:
      if (auto b = as_bool()) return *b;
      if (auto i = as_int()) return *i;
      if (auto d = as_double()) return *d;
      return text_;
  }
  return nullptr;
}

Value parse_yaml(const std::string& text, const Origin& origin) {
  // Recipes are UTF-8 (YAML's encoding, and the JSON that checkpoints and loggers write the resolved recipe into).
  // Another encoding would otherwise surface only when the recipe is first written out, at the first checkpoint.
  if (const size_t bad = util::first_invalid_utf8(text); bad != std::string_view::npos) {
    Origin at = origin;
    if (origin.override.empty()) at.line = static_cast<int>(std::count(text.begin(), text.begin() + bad, '\n')) + 1;
    fail(at, "",
         fmt::format("not valid UTF-8 (byte 0x{:02X}); save the recipe as UTF-8",
                     static_cast<unsigned>(static_cast<unsigned char>(text[bad]))));
  }
  YAML::Node node;
  try {
    node = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    Origin at = origin;
    if (!e.mark.is_null()) at.line = e.mark.line + 1;
    fail(at, "", "invalid YAML: " + e.msg);
  }
  return convert(node, origin, "");
}

Value load_yaml_file(const std::string& path, const std::string& component, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(component, fmt::format("{}: cannot open the {}", path, what));
  std::stringstream buf;
  buf << in.rdbuf();
  Origin origin;
  origin.file = path;
  Value root = parse_yaml(buf.str(), origin);
  if (root.is_null()) return Value::map(origin);
  if (!root.is_map()) {
    throw ConfigError(component, fmt::format("{}: the {} must be a YAML mapping of keys, got {}",
                                             root.origin().describe(), what, root.type_name()));
  }
  return root;
}

Value load_yaml_file(const std::string& path) {
  return load_yaml_file(path, kComponent, "recipe file");
}

void apply_override(Value& root, std::string_view assignment) {
  Origin origin;
  origin.override = std::string(assignment);
  const size_t eq = assignment.find('=');
  if (eq == std::string_view::npos || eq == 0) {
    fail(origin, "", "an override must look like key.sub=value");
  }
  const std::string key(assignment.substr(0, eq));
  const std::string text(assignment.substr(eq + 1));
  const std::vector<std::string> parts = split_path(key);
  for (const std::string& p : parts) {
    if (p.empty()) fail(origin, key, "empty key segment in the override");
  }
  Value value = parse_yaml(text, origin);
  // Stamp the override on the whole parsed value (parse_yaml set lines inside the override text).
  std::vector<Value*> stack{&value};
  while (!stack.empty()) {
    Value* v = stack.back();
    stack.pop_back();
    v->set_origin(origin);
    for (auto& item : v->items()) stack.push_back(&item);
    for (auto& [k, child] : v->entries()) stack.push_back(&child);
  }
  Value* node = &root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (node->is_null()) *node = Value::map(origin);
    if (node->is_map()) {
      Value* next = node->find(parts[i]);
      node = next ? next : &node->set(parts[i], Value::map(origin));
    } else if (node->is_sequence()) {
      auto idx = parse_index(parts[i]);
      if (!idx || *idx >= node->items().size()) {
        fail(origin, join_path(parts, i + 1), "no such list element to override");
      }
      node = &node->items()[*idx];
    } else {
      fail(origin, join_path(parts, i + 1), "cannot override inside " + node->type_name());
    }
  }
  const std::string& last = parts.back();
  if (node->is_null()) *node = Value::map(origin);
  if (node->is_map()) {
    node->set(last, std::move(value));
  } else if (node->is_sequence()) {
    auto idx = parse_index(last);
    if (!idx || *idx >= node->items().size()) fail(origin, key, "no such list element to override");
    node->items()[*idx] = std::move(value);
  } else {
    fail(origin, key, "cannot override inside " + node->type_name());
  }
}

void resolve_interpolations(Value& root) {
  Resolver resolver(root);
  resolver.resolve(root, "");
}

}  // namespace tessera::config
