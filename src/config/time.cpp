// Parsing and printing of unit-carrying durations.
#include "tessera/config/time.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <stdexcept>
#include <utility>

namespace tessera::config {
namespace {

constexpr std::array<std::pair<std::string_view, TimeUnit>, 5> kUnits = {{
    {"tok", TimeUnit::kToken},
    {"dur", TimeUnit::kDuration},
    {"ep", TimeUnit::kEpoch},
    {"ba", TimeUnit::kBatch},
    {"sp", TimeUnit::kSample},
}};

void validate(double value, TimeUnit unit) {
  if (!std::isfinite(value) || value < 0) {
    throw std::invalid_argument(fmt::format("a duration must be a non-negative number, got {}", value));
  }
  if (unit == TimeUnit::kDuration) {
    if (value > 1) throw std::invalid_argument(fmt::format("a `dur` fraction must lie in [0, 1], got {}", value));
  } else if (value != std::floor(value) || value > 9.2e18) {
    throw std::invalid_argument(
        fmt::format("a duration in `{}` must be a whole number, got {}", unit_suffix(unit), value));
  }
}

}  // namespace

std::string_view unit_suffix(TimeUnit unit) {
  for (const auto& [suffix, u] : kUnits) {
    if (u == unit) return suffix;
  }
  return "?";
}

Time::Time(double value, TimeUnit unit) : value_(value), unit_(unit) {
  validate(value, unit);
}

Time Time::parse(std::string_view text) {
  std::string s(text);
  s.erase(std::remove_if(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); }), s.end());
  std::string lower = s;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (std::string_view unsupported : {"iter", "sec"}) {
    if (lower.size() > unsupported.size() && lower.ends_with(unsupported)) {
      throw std::invalid_argument(
          fmt::format("the time unit `{}` is not supported yet (use ep, ba, sp, tok or dur)", unsupported));
    }
  }
  for (const auto& [suffix, unit] : kUnits) {
    if (lower.size() <= suffix.size() || !lower.ends_with(suffix)) continue;
    const std::string number = s.substr(0, s.size() - suffix.size());
    size_t used = 0;
    double value = 0;
    try {
      value = std::stod(number, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != number.size()) {
      throw std::invalid_argument(fmt::format("\"{}\" is not a number followed by a unit", std::string(text)));
    }
    return Time(value, unit);
  }
  throw std::invalid_argument(fmt::format(
      "\"{}\" has no time unit; write a number followed by ep, ba, sp, tok or dur (e.g. 100ba)", std::string(text)));
}

std::string Time::str() const {
  if (unit_ == TimeUnit::kDuration) return fmt::format("{}dur", value_);
  return fmt::format("{}{}", count(), unit_suffix(unit_));
}

int64_t Timestamp::get(TimeUnit unit) const {
  switch (unit) {
    case TimeUnit::kEpoch:
      return epoch;
    case TimeUnit::kBatch:
      return batch;
    case TimeUnit::kSample:
      return sample;
    case TimeUnit::kToken:
      return token;
    case TimeUnit::kDuration:
      break;
  }
  throw std::invalid_argument("a timestamp has no counter in `dur`; convert the duration to a unit first");
}

void Timestamp::to_next_batch(int64_t samples, int64_t tokens, double seconds) {
  batch += 1;
  batch_in_epoch += 1;
  sample += samples;
  sample_in_epoch += samples;
  token += tokens;
  token_in_epoch += tokens;
  total_wct += seconds;
  epoch_wct += seconds;
  batch_wct = seconds;
}

void Timestamp::to_next_epoch() {
  epoch += 1;
  batch_in_epoch = 0;
  sample_in_epoch = 0;
  token_in_epoch = 0;
  epoch_wct = 0;
  batch_wct = 0;
}

}  // namespace tessera::config
