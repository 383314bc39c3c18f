// Hash digests and Python-compatible JSON, against values computed by Python's hashlib, xxhash and json.
#include <gtest/gtest.h>

#include "tessera/util/error.h"
#include "tessera/util/hashing.h"
#include "tessera/util/python_json.h"

namespace tessera::util {
namespace {

TEST(Hashing, GoldenDigestsOfAbc) {
  EXPECT_EQ(hex_digest("sha1", "abc"), "a9993e364706816aba3e25717850c26c9cd0d89d");
  EXPECT_EQ(hex_digest("xxh64", "abc"), "44bc2cf5ad770999");
  EXPECT_EQ(hex_digest("xxh3_64", "abc"), "78af5f94892f3950");
  EXPECT_EQ(hex_digest("sha1", ""), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
  EXPECT_EQ(hex_digest("sha1", std::string(1000000, 'a')), "34aa973cd4c4daa4f61eeb2bdbad27316534016f");
  EXPECT_THROW(hex_digest("md5", "abc"), tessera::Error);
}

TEST(PythonJson, FloatReprMatchesPython) {
  // repr() of each value in CPython.
  const std::pair<double, const char*> cases[] = {{1.5, "1.5"},
                                                  {100.0, "100.0"},
                                                  {1e16, "1e+16"},
                                                  {1.5e-5, "1.5e-05"},
                                                  {0.0001, "0.0001"},
                                                  {1e15, "1000000000000000.0"},
                                                  {123456789012345678.0, "1.2345678901234568e+17"},
                                                  {0.1, "0.1"},
                                                  {6e-4, "0.0006"},
                                                  {1e-8, "1e-08"},
                                                  {-2.0, "-2.0"},
                                                  {1e22, "1e+22"},
                                                  {5e-324, "5e-324"},
                                                  {0.0, "0.0"},
                                                  {1.0 / 3, "0.3333333333333333"},
                                                  {2.5e-4, "0.00025"}};
  for (const auto& [v, repr] : cases) EXPECT_EQ(python_float_repr(v), repr) << repr;
}

TEST(PythonJson, DumpsLikePython) {
  // json.dumps({"b": [1, 2.0, None, True], "a": "é\"\n😀", "c": {}}, sort_keys=True)
  const nlohmann::ordered_json v = {
      {"b", {1, 2.0, nullptr, true}}, {"a", "\u00e9\"\n\U0001F600"}, {"c", nlohmann::ordered_json::object()}};
  EXPECT_EQ(python_json_dumps(v, true), R"({"a": "\u00e9\"\n\ud83d\ude00", "b": [1, 2.0, null, true], "c": {}})");
  EXPECT_EQ(python_json_dumps(v, false).substr(0, 6), R"({"b": )");
}

}  // namespace
}  // namespace tessera::util
