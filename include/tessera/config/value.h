// A recipe as a tree of values that remember where they came from (file and line, or a command-line override), so
// that every later error can name the file, the key path and the line.
//
// Loading is three steps: parse the YAML file, apply command-line overrides (`key.sub=value`, which win over the
// file), then resolve `${a.b}` interpolations as OmegaConf (and so LLM Foundry) does. The typed view of the tree is
// config::Section (reader.h).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::config {

// Where a value was written.
struct Origin {
  std::string file;      // recipe path as given by the user; empty for values that are not from a file
  int line = 0;          // 1-based line in `file`; 0 when unknown
  std::string override;  // the command-line assignment ("optimizer.lr=0.1") that set this value, if any

  // "recipes/x.yaml:12", "command line `optimizer.lr=0.1`", or "recipes/x.yaml" when the line is unknown.
  std::string describe() const;
};

class Value {
 public:
  enum class Kind { kNull, kScalar, kSequence, kMap };

  Value() = default;
  static Value null(Origin origin = {});
  static Value scalar(std::string text, bool quoted, Origin origin = {});
  static Value sequence(Origin origin = {});
  static Value map(Origin origin = {});

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::kNull; }
  bool is_scalar() const { return kind_ == Kind::kScalar; }
  bool is_sequence() const { return kind_ == Kind::kSequence; }
  bool is_map() const { return kind_ == Kind::kMap; }

  // Scalars keep their source text; `quoted` scalars ("16", '16') are always strings, plain ones are typed on use.
  const std::string& text() const { return text_; }
  bool quoted() const { return quoted_; }
  void set_text(std::string text) { text_ = std::move(text); }

  const std::vector<Value>& items() const { return items_; }
  std::vector<Value>& items() { return items_; }
  // Map entries in file order (keys are unique; the parser rejects duplicates).
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }
  std::vector<std::pair<std::string, Value>>& entries() { return entries_; }

  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  // Sets (or replaces, keeping its position) the entry `key` of a map.
  Value& set(const std::string& key, Value value);

  const Origin& origin() const { return origin_; }
  void set_origin(Origin origin) { origin_ = std::move(origin); }

  // Typed reads of a scalar, with YAML 1.1 plain-scalar rules (as OmegaConf uses): integers `17`, `-3`, `1_000`;
  // floats `6.0e-4`, `1e-8`, `.5`, `.inf`; booleans true/false/yes/no/on/off in any of YAML's casings. Quoted scalars
  // never convert. Each returns nullopt when the value is not of that type (an integer reads as a double too).
  std::optional<int64_t> as_int() const;
  std::optional<double> as_double() const;
  std::optional<bool> as_bool() const;

  // "null", "a string", "a number", "a boolean", "a list", "a mapping": for "expected X, got Y" messages.
  std::string type_name() const;
  // Short rendering for messages: "fast" (quoted), 0.1, [0.9, 0.95], {...}.
  std::string brief() const;
  // Plain-scalar typing as YAML/OmegaConf do it: null, booleans, integers, floats, else strings.
  nlohmann::ordered_json to_json() const;

 private:
  Kind kind_ = Kind::kNull;
  std::string text_;
  bool quoted_ = false;
  std::vector<Value> items_;
  std::vector<std::pair<std::string, Value>> entries_;
  Origin origin_;
};

// Parses a YAML file. Throws ConfigError naming the file for a missing/unreadable file, a YAML syntax error (with
// its line), a duplicate key, or a document that is not a mapping.
Value load_yaml_file(const std::string& path);
// Parses YAML text; `origin` is stamped on every value (its line is replaced by the line inside `text` when known).
Value parse_yaml(const std::string& text, const Origin& origin);

// Applies one command-line assignment `a.b.c=value` (value parsed as YAML, so `[1, 2]`, `{k: v}`, `1e-3`, `null`
// work; list elements are addressed by index, `betas.0=0.8`). Missing intermediate maps are created.
// Throws ConfigError for a malformed assignment or a path through a non-map value.
void apply_override(Value& root, std::string_view assignment);

// Resolves every `${path.to.key}` in the tree, OmegaConf-style: a string that is exactly one interpolation takes the
// referenced value (of any type, including null, a list or a map); interpolations inside a longer string are
// replaced by the referenced scalar's text. References are absolute from the root, may chain, and may not cycle;
// `\${` is a literal "${". Throws ConfigError naming the key, its origin and the unresolvable reference.
void resolve_interpolations(Value& root);

}  // namespace tessera::config
