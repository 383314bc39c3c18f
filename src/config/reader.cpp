// Typed section reads with key tracking and precise error messages.
#include "tessera/config/reader.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <stdexcept>

#include "tessera/util/error.h"

namespace tessera::config {
namespace {

constexpr const char* kReaderComponent = "recipe";

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

void ParseContext::throw_if_unsupported() const {
  if (unsupported_.empty()) return;
  throw ConfigError(kReaderComponent, fmt::format("{}: not supported yet: {}", file_, fmt::join(unsupported_, ", ")));
}

Section::Section(const Value* value, std::string path, ParseContext& ctx)
    : value_(value), path_(std::move(path)), ctx_(&ctx) {
  if (value_ != nullptr && value_->is_null()) value_ = nullptr;
  if (value_ != nullptr && !value_->is_map()) {
    std::string where = value_->origin().describe();
    throw ConfigError(kReaderComponent,
                      fmt::format("{}{}: expected a mapping of keys, got {} {}", where.empty() ? "" : where + ": ",
                                  path_.empty() ? "(root)" : path_, value_->type_name(), value_->brief()));
  }
}

std::string Section::key_path(std::string_view key) const {
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

bool Section::has(std::string_view key) const {
  if (value_ == nullptr) return false;
  const Value* v = value_->find(key);
  return v != nullptr && !v->is_null();
}

std::vector<std::string> Section::keys() const {
  std::vector<std::string> out;
  if (value_ != nullptr) {
    for (const auto& [k, v] : value_->entries()) out.push_back(k);
  }
  return out;
}

const Value* Section::lookup(std::string_view key) {
  queried_.insert(std::string(key));
  if (value_ == nullptr) return nullptr;
  const Value* v = value_->find(key);
  return (v == nullptr || v->is_null()) ? nullptr : v;
}

const Value* Section::raw(std::string_view key) {
  return lookup(key);
}

Origin Section::origin_of(std::string_view key) const {
  if (value_ == nullptr) return {};
  if (const Value* v = value_->find(key)) return v->origin();
  Origin at = value_->origin();
  if (path_.empty()) at.line = 0;  // a top-level key is missing from the file, not from its first line
  return at;
}

void Section::fail(std::string_view key, const std::string& message) const {
  std::string where = origin_of(key).describe();
  if (where.empty()) where = ctx_->file();
  throw ConfigError(kReaderComponent, fmt::format("{}: {}: {}", where, key_path(key), message));
}

void Section::type_error(std::string_view key, const Value& v, const std::string& expected) const {
  fail(key, fmt::format("expected {}, got {} {}", expected, v.type_name(), v.brief()));
}

template <class T>
std::optional<T> Section::read(std::string_view key, std::optional<T> (Value::*convert)() const, const char* expected) {
  const Value* v = lookup(key);
  if (v == nullptr) return std::nullopt;
  if (auto x = (v->*convert)()) return x;
  type_error(key, *v, expected);
}

template <class T>
T Section::required(std::string_view key, std::optional<T> value) const {
  if (!value) fail(key, "missing required key");
  return *value;
}

int64_t Section::require_int(std::string_view key) {
  return required(key, get_optional_int(key));
}
int64_t Section::get_int(std::string_view key, int64_t fallback) {
  return get_optional_int(key).value_or(fallback);
}
std::optional<int64_t> Section::get_optional_int(std::string_view key) {
  return read(key, &Value::as_int, "an integer");
}

std::optional<int64_t> Section::get_nullable_int(std::string_view key, std::optional<int64_t> fallback) {
  if (value_ == nullptr || value_->find(key) == nullptr) return fallback;
  return get_optional_int(key);
}

std::optional<double> Section::get_nullable_double(std::string_view key, std::optional<double> fallback) {
  if (value_ == nullptr || value_->find(key) == nullptr) return fallback;
  return get_optional_double(key);
}

double Section::require_double(std::string_view key) {
  return required(key, get_optional_double(key));
}
double Section::get_double(std::string_view key, double fallback) {
  return get_optional_double(key).value_or(fallback);
}
std::optional<double> Section::get_optional_double(std::string_view key) {
  return read(key, &Value::as_double, "a number");
}

bool Section::get_bool(std::string_view key, bool fallback) {
  return read(key, &Value::as_bool, "true or false").value_or(fallback);
}

std::string Section::require_string(std::string_view key) {
  return required(key, get_optional_string(key));
}

std::string Section::get_string(std::string_view key, std::string fallback) {
  return get_optional_string(key).value_or(std::move(fallback));
}

std::optional<std::string> Section::get_optional_string(std::string_view key) {
  const Value* v = lookup(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_scalar()) type_error(key, *v, "a string");
  return v->text();
}

std::string Section::get_choice(std::string_view key, std::string fallback,
                                std::initializer_list<std::string_view> choices) {
  std::string s = get_string(key, std::move(fallback));
  if (std::find(choices.begin(), choices.end(), s) == choices.end()) {
    fail(key, fmt::format("\"{}\" is not one of: {}", s, fmt::join(choices, ", ")));
  }
  return s;
}

std::vector<double> Section::get_doubles(std::string_view key, std::vector<double> fallback, size_t exact_size) {
  const Value* v = lookup(key);
  if (v == nullptr) return fallback;
  const std::string expected = exact_size ? fmt::format("a list of {} numbers", exact_size) : "a list of numbers";
  if (!v->is_sequence()) type_error(key, *v, expected);
  std::vector<double> out;
  for (const Value& item : v->items()) {
    auto d = item.as_double();
    if (!d) type_error(key, *v, expected);
    out.push_back(*d);
  }
  if (exact_size && out.size() != exact_size) type_error(key, *v, expected);
  return out;
}

std::vector<std::string> Section::get_strings(std::string_view key, std::vector<std::string> fallback) {
  const Value* v = lookup(key);
  if (v == nullptr) return fallback;
  if (v->is_scalar()) return {v->text()};
  if (!v->is_sequence()) type_error(key, *v, "a list of strings");
  std::vector<std::string> out;
  for (const Value& item : v->items()) {
    if (!item.is_scalar()) type_error(key, *v, "a list of strings");
    out.push_back(item.text());
  }
  return out;
}

Time Section::require_time(std::string_view key, TimeUnit bare_int_unit) {
  if (!has(key)) {
    lookup(key);
    fail(key, "missing required key");
  }
  return get_time(key, Time(), bare_int_unit);
}

Time Section::get_time(std::string_view key, Time fallback, TimeUnit bare_int_unit) {
  const Value* v = lookup(key);
  if (v == nullptr) return fallback;
  try {
    if (auto i = v->as_int()) return Time(static_cast<double>(*i), bare_int_unit);
    if (!v->is_scalar() || v->as_double() || v->as_bool()) {
      type_error(key, *v, "a duration such as \"100ba\"");
    }
    return Time::parse(v->text());
  } catch (const std::invalid_argument& e) {
    fail(key, e.what());
  }
}

Section Section::section(std::string_view key) {
  return Section(lookup(key), key_path(key), *ctx_);
}

void Section::not_supported(std::string_view key, const std::string& detail) {
  ctx_->not_supported(detail.empty() ? key_path(key) : fmt::format("{} ({})", key_path(key), detail));
}

void Section::python_only(std::string_view key, std::string_view why) {
  if (lookup(key) == nullptr) return;
  spdlog::warn("{}: {}; Tessera does not use it", key_path(key), why);
}

void Section::finish(const std::vector<std::string_view>& foundry_keys) {
  if (value_ == nullptr) return;
  for (const auto& [key, v] : value_->entries()) {
    if (queried_.count(key)) continue;
    if (std::find(foundry_keys.begin(), foundry_keys.end(), key) != foundry_keys.end()) {
      // An explicit null (`key:` with nothing after it) asks for nothing, so it is not worth reporting.
      if (!v.is_null()) not_supported(key);
      continue;
    }
    fail_unknown(key, std::vector<std::string_view>(queried_.begin(), queried_.end()));
  }
}

void Section::fail_unknown(std::string_view key, const std::vector<std::string_view>& known) const {
  std::string_view best;
  size_t best_distance = 3;
  for (std::string_view candidate : known) {
    const size_t d = edit_distance(key, candidate);
    if (d < best_distance) best_distance = d, best = candidate;
  }
  fail(key, best.empty() ? "unknown key" : fmt::format("unknown key (did you mean '{}'?)", best));
}

void Section::reject_unknown(const std::vector<std::string_view>& known) const {
  for (const std::string& key : keys()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) fail_unknown(key, known);
  }
}

}  // namespace tessera::config
