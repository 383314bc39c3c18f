// Durations with units.
#include <gtest/gtest.h>

#include <stdexcept>

#include "tessera/config/time.h"

namespace tessera::config {
namespace {

TEST(Time, ParsesEveryUnit) {
  EXPECT_EQ(Time::parse("100ba"), Time(100, TimeUnit::kBatch));
  EXPECT_EQ(Time::parse("2ep"), Time(2, TimeUnit::kEpoch));
  EXPECT_EQ(Time::parse("10sp"), Time(10, TimeUnit::kSample));
  EXPECT_EQ(Time::parse("3e4tok"), Time(30000, TimeUnit::kToken));
  EXPECT_EQ(Time::parse("0.5dur"), Time(0.5, TimeUnit::kDuration));
  EXPECT_EQ(Time::parse("100BA"), Time(100, TimeUnit::kBatch)) << "units are case-insensitive, as in Composer";
  EXPECT_EQ(Time::parse("4800ba").str(), "4800ba");
  EXPECT_EQ(Time::parse("0.25dur").str(), "0.25dur");
}

TEST(Time, RejectsMalformedDurations) {
  for (const char* bad : {"100", "ba", "1.5ba", "-3ba", "2dur", "abcba", "10 batches", "1h30m", "5iter", "10sec", "",
                          "1e400tok", "nanba"}) {
    EXPECT_THROW(Time::parse(bad), std::invalid_argument) << bad;
  }
  try {
    Time::parse("1.5ba");
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "a duration in `ba` must be a whole number, got 1.5");
  }
  try {
    Time::parse("100");
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("has no time unit"), std::string::npos);
  }
}

}  // namespace
}  // namespace tessera::config
