// JSON text exactly as Python's json.dumps writes it, for files other tools hash or compare byte for byte (MDS
// index.json and shard headers): separators ", " and ": ", no indent, ensure_ascii escaping (\uXXXX, surrogate pairs
// above U+FFFF), floats in Python's repr form (1.0, 1e-05, 1e+16, Infinity, NaN), keys sorted when asked.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <utility>

namespace tessera::util {

std::string python_json_dumps(const nlohmann::ordered_json& value, bool sort_keys = false);

// json.dumps's other options: ensure_ascii=False writes non-ASCII characters as they are; an indent puts each item
// on its own line (indent spaces per level) and makes the default item separator ","; separators replace
// (item, key) separators.
struct PythonJsonOptions {
  bool sort_keys = false;
  bool ensure_ascii = true;
  std::optional<int> indent;
  std::optional<std::pair<std::string, std::string>> separators;
};
std::string python_json_dumps(const nlohmann::ordered_json& value, const PythonJsonOptions& options);

// Python's repr() of a float: the shortest round-trip digits, ".0" for integral values below 1e16,
// exponents as e-05 / e+16, and "inf", "-inf", "nan".
std::string python_float_repr(double v);

}  // namespace tessera::util
