// Chat templates' values: JSON data, jinja2's undefined, namespaces and globals, with the Python semantics templates
// rely on (str(), repr(), truthiness, ==, str methods over code points).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::data::chat_template::detail {

using Json = nlohmann::ordered_json;

// The component of every chat-template error ("[jinja] ...").
inline constexpr const char* kComponent = "jinja";

struct Value {
  enum class Kind { kUndefined, kData, kNamespace, kFunction };
  Kind kind = Kind::kUndefined;
  // kData: the JSON, never changed once made and shared by every copy of the value, so that looking a name up,
  // binding a loop item or taking a list item or dict value copies nothing (a copy per lookup let a loop over a big
  // value run for hours). It may point into a larger value (part()) and keep that alive, or into the render's context.
  std::shared_ptr<const Json> ref;
  std::shared_ptr<Json> ns;  // kNamespace: a mutable object shared by every copy
  std::string name;          // kFunction: the global's name; kUndefined: what was looked up (for messages)

  // kData's JSON; null for the other kinds.
  const Json& data() const {
    static const Json kNull;
    return ref ? *ref : kNull;
  }
  static Value undefined(std::string what) {
    Value v;
    v.name = std::move(what);
    return v;
  }
  static Value of(Json j) {
    Value v;
    v.kind = Kind::kData;
    v.ref = std::make_shared<const Json>(std::move(j));
    return v;
  }
  // `j`, which is inside `whole`'s JSON (a list item, a dict value), shared with `whole` rather than copied.
  static Value part(const Value& whole, const Json& j) {
    Value v;
    v.kind = Kind::kData;
    v.ref = std::shared_ptr<const Json>(whole.ref, &j);
    return v;
  }
  // `j` without a copy or an owner: for the render's context, which outlives every value of the render.
  static Value borrowed(const Json& j) {
    Value v;
    v.kind = Kind::kData;
    v.ref = std::shared_ptr<const Json>(std::shared_ptr<const Json>(), &j);
    return v;
  }
  bool defined() const { return kind != Kind::kUndefined; }
  bool is(Json::value_t t) const { return kind == Kind::kData && data().type() == t; }
  bool is_string() const { return kind == Kind::kData && data().is_string(); }
  bool is_number() const { return kind == Kind::kData && data().is_number(); }
  bool is_integer() const { return kind == Kind::kData && data().is_number_integer(); }
  bool is_list() const { return kind == Kind::kData && data().is_array(); }
  bool is_dict() const { return kind == Kind::kData && data().is_object(); }
  bool is_none() const { return kind == Kind::kData && data().is_null(); }
};

// Python whitespace (str.strip / str.split without arguments).
bool is_py_space(uint32_t c);

// The code points of valid UTF-8 text, with their byte offsets (size() + 1 entries, the last one the end).
std::vector<size_t> code_point_offsets(const std::string& s);

// The byte offset after the code point that starts at byte i (by its lead byte, as code_point_offsets steps).
size_t next_code_point(std::string_view s, size_t i);

// How many code points code_point_offsets finds in `s`, without allocating.
size_t code_point_count(std::string_view s);

// The first `needle` in `hay` at or after byte `from`, or npos; linear time whatever the two hold (memmem's Two-Way
// algorithm), where std::string::find takes time proportional to both lengths multiplied.
size_t find_text(std::string_view hay, std::string_view needle, size_t from = 0);

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

// Appends py_repr(j) to `out`; false (with `out` cut short) as soon as `out` would pass `limit` bytes. Recurses once
// a nesting level: the renderer checks the depth of what it prints first.
bool py_repr_append(std::string& out, const Json& j, size_t limit);

// Python's str() of a value, as `{{ }}` prints it.
std::string to_str(const Value& v);

// Python's truth value: empty strings, lists and dicts, 0, None, False and undefined are false.
bool truthy(const Value& v);

// Python ==: numbers across int/float (and bools as 0/1), everything else by type and value.
bool equal(const Value& a, const Value& b);

// Python's str.split(sep, maxsplit): without a separator, splits on runs of Python whitespace.
std::vector<std::string> py_split(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit);

}  // namespace tessera::data::chat_template::detail
