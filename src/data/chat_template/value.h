// Chat templates' values: JSON data, jinja2's undefined, namespaces and globals, with the Python semantics templates
// rely on (str(), repr(), truthiness, ==, str methods over code points).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tessera::data::chat_template::detail {

using Json = nlohmann::ordered_json;

// The component of every chat-template error ("[jinja] ...").
inline constexpr const char* kComponent = "jinja";

struct Value {
  enum class Kind { kUndefined, kData, kNamespace, kFunction };
  Kind kind = Kind::kUndefined;
  Json data;                 // kData
  std::shared_ptr<Json> ns;  // kNamespace: a mutable object shared by every copy
  std::string name;          // kFunction: the global's name; kUndefined: what was looked up (for messages)

  static Value undefined(std::string what) {
    Value v;
    v.name = std::move(what);
    return v;
  }
  static Value of(Json j) {
    Value v;
    v.kind = Kind::kData;
    v.data = std::move(j);
    return v;
  }
  bool defined() const { return kind != Kind::kUndefined; }
  bool is(Json::value_t t) const { return kind == Kind::kData && data.type() == t; }
  bool is_string() const { return kind == Kind::kData && data.is_string(); }
  bool is_number() const { return kind == Kind::kData && data.is_number(); }
  bool is_integer() const { return kind == Kind::kData && data.is_number_integer(); }
  bool is_list() const { return kind == Kind::kData && data.is_array(); }
  bool is_dict() const { return kind == Kind::kData && data.is_object(); }
  bool is_none() const { return kind == Kind::kData && data.is_null(); }
};

// Python whitespace (str.strip / str.split without arguments).
bool is_py_space(uint32_t c);

// The code points of valid UTF-8 text, with their byte offsets (size() + 1 entries, the last one the end).
std::vector<size_t> code_point_offsets(const std::string& s);

// The code point whose UTF-8 sequence starts at byte i.
uint32_t decode_at(const std::string& s, size_t i);

// str.strip / lstrip / rstrip: Python whitespace, or any of `chars`' code points.
std::string py_strip(const std::string& s, bool left, bool right, const std::optional<std::string>& chars);

// `f` over the ASCII letters only (str.upper / lower leave other code points alone here).
std::string ascii_map(std::string s, int (*f)(int));

// str.title() and str.capitalize() over ASCII letters.
std::string py_title(const std::string& s);

std::string py_capitalize(const std::string& s);

// Python's repr() of a str: single quotes unless the text holds one and no double quote.
std::string py_repr_string(const std::string& s);

// Python's repr() of a JSON value (lists and dicts print their items this way).
std::string py_repr(const Json& j);

// Python's str() of a value, as `{{ }}` prints it.
std::string to_str(const Value& v);

// Python's truth value: empty strings, lists and dicts, 0, None, False and undefined are false.
bool truthy(const Value& v);

// Python ==: numbers across int/float (and bools as 0/1), everything else by type and value.
bool equal(const Value& a, const Value& b);

// Python's str.split(sep, maxsplit): without a separator, splits on runs of Python whitespace.
std::vector<std::string> py_split(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit);

}  // namespace tessera::data::chat_template::detail
