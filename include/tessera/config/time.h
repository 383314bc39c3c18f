// Durations with units, as Composer writes them: "100ba", "1ep", "2048tok", "10sp", "0.5dur".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::config {

enum class TimeUnit {
  kEpoch,     // "ep": passes over the training data
  kBatch,     // "ba": optimizer steps
  kSample,    // "sp": training samples (sequences), global across ranks
  kToken,     // "tok": training tokens, global across ranks
  kDuration,  // "dur": a fraction of max_duration, in [0, 1]
};

// Unit suffix as written in recipes ("ep", "ba", ...).
std::string_view unit_suffix(TimeUnit unit);

// An amount of training time. Every unit except kDuration holds a whole number.
class Time {
 public:
  Time() = default;
  Time(double value, TimeUnit unit);
  static Time epochs(int64_t n) { return {static_cast<double>(n), TimeUnit::kEpoch}; }
  static Time batches(int64_t n) { return {static_cast<double>(n), TimeUnit::kBatch}; }

  // Parses "<number><unit>" (case-insensitive unit, number may use exponent notation: "3e4tok"). Throws
  // std::invalid_argument with a human-readable reason for anything else: a missing or unknown unit, a negative
  // value, a fractional count in an integral unit, or a `dur` outside [0, 1]. Composer's `iter` and `sec` units and
  // wall-clock strings ("1h30m") are rejected as not supported.
  static Time parse(std::string_view text);

  double value() const { return value_; }
  int64_t count() const { return static_cast<int64_t>(value_); }  // for integral units
  TimeUnit unit() const { return unit_; }
  bool is_zero() const { return value_ == 0; }
  std::string str() const;  // canonical form: "100ba", "0.5dur"

  bool operator==(const Time& o) const { return unit_ == o.unit_ && value_ == o.value_; }

 private:
  double value_ = 0;
  TimeUnit unit_ = TimeUnit::kBatch;
};

// Where training stands, as Composer's Timestamp counts it. Samples and tokens are global (summed over ranks); wall
// clock times are seconds of training (evaluation excluded).
struct Timestamp {
  int64_t epoch = 0;
  int64_t batch = 0;  // optimizer steps
  int64_t sample = 0;
  int64_t token = 0;
  int64_t batch_in_epoch = 0;
  int64_t sample_in_epoch = 0;
  int64_t token_in_epoch = 0;
  double total_wct = 0;
  double epoch_wct = 0;
  double batch_wct = 0;

  // The counter of an integral unit (ep, ba, sp, tok); kDuration throws std::invalid_argument.
  int64_t get(TimeUnit unit) const;
  // Composer's comparison `timestamp < time`: the counter in time's unit against its value.
  bool before(const Time& t) const { return static_cast<double>(get(t.unit())) < t.value(); }
  void to_next_batch(int64_t samples, int64_t tokens, double seconds);
  void to_next_epoch();
};

}  // namespace tessera::config
