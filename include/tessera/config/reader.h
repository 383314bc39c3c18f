// Typed, validating reads of a recipe section into a component's Options struct.
//
//   void parse(config::Section& s, OptimizerOptions& o) {
//     o.lr = s.require_double("lr");
//     o.eps = s.get_double("eps", 1e-8);
//     s.finish();   // every key not read is an error (or, for LLM Foundry keys we lack, "not supported yet")
//   }
//
// Every error is a ConfigError "[recipe] <file>:<line>: <key.path>: <what is wrong>", so the tools exit with 2.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/config/time.h"
#include "tessera/config/value.h"

namespace tessera::config {

// State shared by all sections of one recipe load. Keys that belong to LLM Foundry's schema but that Tessera does not
// implement yet are collected here, so the user sees them all in one message instead of one per run.
class ParseContext {
 public:
  explicit ParseContext(std::string file) : file_(std::move(file)) {}
  const std::string& file() const { return file_; }
  void not_supported(std::string what) { unsupported_.push_back(std::move(what)); }
  const std::vector<std::string>& unsupported() const { return unsupported_; }
  // Throws ConfigError "<file>: not supported yet: a, b, c" when anything was collected.
  void throw_if_unsupported() const;

 private:
  std::string file_;
  std::vector<std::string> unsupported_;
};

// A read-only view of one mapping in the recipe (`optimizer`, `model.attn_config`, ...). Not thread-safe.
class Section {
 public:
  // `value` may be null (section absent: every key takes its default) or a map; anything else is an error.
  Section(const Value* value, std::string path, ParseContext& ctx);

  const std::string& path() const { return path_; }
  ParseContext& context() const { return *ctx_; }
  bool present() const { return value_ != nullptr && value_->is_map(); }
  // True when `key` is set to something other than null.
  bool has(std::string_view key) const;
  // Keys present in the mapping, in file order.
  std::vector<std::string> keys() const;
  // The raw value of `key` (marks it read); nullptr when absent or null.
  const Value* raw(std::string_view key);

  int64_t require_int(std::string_view key);
  int64_t get_int(std::string_view key, int64_t fallback);
  std::optional<int64_t> get_optional_int(std::string_view key);
  // `fallback` when the key is absent, nullopt when it is null (HF configs' "pad_token_id": null), else the integer.
  std::optional<int64_t> get_nullable_int(std::string_view key, std::optional<int64_t> fallback);
  std::optional<double> get_nullable_double(std::string_view key, std::optional<double> fallback);
  double require_double(std::string_view key);
  double get_double(std::string_view key, double fallback);
  std::optional<double> get_optional_double(std::string_view key);
  bool get_bool(std::string_view key, bool fallback);
  std::string require_string(std::string_view key);
  std::string get_string(std::string_view key, std::string fallback);
  std::optional<std::string> get_optional_string(std::string_view key);
  // A string that must be one of `choices`.
  std::string get_choice(std::string_view key, std::string fallback, std::initializer_list<std::string_view> choices);
  // A list of numbers; `exact_size` > 0 requires that many elements.
  std::vector<double> get_doubles(std::string_view key, std::vector<double> fallback, size_t exact_size = 0);
  std::vector<std::string> get_strings(std::string_view key, std::vector<std::string> fallback);
  // A duration string ("100ba"); a bare integer means `bare_int_unit` (Composer reads plain ints as epochs).
  Time require_time(std::string_view key, TimeUnit bare_int_unit = TimeUnit::kEpoch);
  Time get_time(std::string_view key, Time fallback, TimeUnit bare_int_unit = TimeUnit::kEpoch);

  // A nested mapping; an absent or null key gives an empty section.
  Section section(std::string_view key);

  // Throws the standard error for `key` (at the key's line if present, else at this section's line).
  [[noreturn]] void fail(std::string_view key, const std::string& message) const;
  void check(bool ok, std::string_view key, const std::string& message) const {
    if (!ok) fail(key, message);
  }
  // Records "path.key: detail" as not supported yet (reported with the others once the whole recipe is read).
  void not_supported(std::string_view key, const std::string& detail = "");
  // A key that only tunes LLM Foundry's or Composer's Python side (a garbage collector schedule, PyTorch's choice of
  // optimizer kernels): when present it is read, not used, and a warning says so with `why`.
  void python_only(std::string_view key, std::string_view why);

  // Ends the section. Each key that was not read is either one of `foundry_keys` (LLM Foundry's schema has it and
  // Tessera does not implement it yet: recorded in the context) or unknown: a ConfigError naming the key, with a
  // suggestion when a known key is close.
  void finish(const std::vector<std::string_view>& foundry_keys = {});

  // Throws the unknown-key error for the first key not in `known` (nothing is marked read). Use it before reading
  // required keys, so that a misspelt key is reported as such rather than as the required key it was meant to be.
  void reject_unknown(const std::vector<std::string_view>& known) const;

  // "optimizer.lr" for key "lr" of section "optimizer".
  std::string key_path(std::string_view key) const;

 private:
  const Value* lookup(std::string_view key);
  // Reads `key` through `convert`; nullopt when absent or null, a type error when it does not convert.
  template <class T>
  std::optional<T> read(std::string_view key, std::optional<T> (Value::*convert)() const, const char* expected);
  template <class T>
  T required(std::string_view key, std::optional<T> value) const;
  Origin origin_of(std::string_view key) const;
  [[noreturn]] void fail_unknown(std::string_view key, const std::vector<std::string_view>& known) const;
  [[noreturn]] void type_error(std::string_view key, const Value& v, const std::string& expected) const;

  const Value* value_;
  std::string path_;
  ParseContext* ctx_;
  std::set<std::string, std::less<>> queried_;
};

}  // namespace tessera::config
