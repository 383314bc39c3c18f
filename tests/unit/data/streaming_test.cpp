// Streaming's shuffles, partitions and sampling against the golden vectors of ../shared/specs/streaming-mds.md
// (computed with mosaicml-streaming); tests/compat/test_streaming_order.py compares more cases with the library.
#include <gtest/gtest.h>

#include <set>

#include "tessera/data/streaming.h"

namespace tessera::data::streaming {
namespace {

using V = std::vector<int64_t>;
const V kShards = {5, 3, 7, 4, 6, 2, 8, 5};

TEST(Shuffle, GoldenVectors) {
  EXPECT_EQ(get_shuffle("naive", kShards, 2, 9176, 0, 8),
            (V{7,  2,  6,  16, 21, 15, 22, 27, 3,  18, 33, 32, 23, 26, 0,  30, 10, 24, 8,  5,
               25, 38, 37, 36, 1,  11, 9,  20, 19, 34, 13, 29, 17, 14, 39, 12, 28, 35, 31, 4}));
  EXPECT_EQ(get_shuffle("py1s", kShards, 2, 9176, 0, 8),
            (V{26, 25, 5, 6, 7, 33, 29, 28, 27, 30, 31, 34, 32, 10, 14, 13, 8,  11, 12, 9,
               3,  2,  4, 1, 0, 17, 18, 15, 16, 21, 22, 23, 19, 20, 24, 35, 37, 39, 36, 38}));
  EXPECT_EQ(get_shuffle("py1br", kShards, 2, 9176, 0, 8),
            (V{7,  5, 25, 6, 32, 30, 29, 31, 27, 28, 26, 9,  10, 8,  13, 34, 33, 12, 11, 14,
               16, 3, 4,  0, 17, 2,  15, 1,  20, 19, 35, 21, 23, 22, 24, 36, 18, 37, 38, 39}));
  EXPECT_EQ(get_shuffle("py1e", kShards, 2, 9176, 0, 8),
            (V{26, 25, 5, 6, 7, 33, 29, 28, 27, 30, 31, 34, 32, 10, 14, 13, 8,  11, 12, 9,
               0,  4,  1, 3, 2, 15, 17, 22, 16, 18, 24, 21, 20, 23, 35, 19, 38, 36, 39, 37}));
  EXPECT_EQ(get_shuffle("py1e", kShards, 2, 9176, 1, 8),
            (V{6,  26, 5,  7,  25, 31, 34, 30, 32, 33, 27, 29, 28, 14, 13, 12, 10, 9, 8, 11,
               38, 37, 35, 36, 39, 19, 21, 20, 22, 24, 17, 23, 15, 18, 4,  16, 1,  0, 2, 3}));
  EXPECT_EQ(get_shuffle("py1e", kShards, 2, 9176, 0, 16),
            (V{25, 26, 29, 28, 33, 7, 6,  5,  14, 30, 31, 27, 10, 11, 32, 8,  13, 12, 34, 9,
               0,  4,  3,  22, 1,  2, 15, 35, 17, 21, 16, 36, 23, 20, 18, 24, 38, 37, 39, 19}));
  EXPECT_EQ(get_shuffle("py1br", kShards, 2, 9176, 0, 16),
            (V{5,  25, 30, 28, 27, 31, 32, 34, 10, 13, 6, 9,  11, 14, 29, 12, 26, 8,  33, 7,
               18, 4,  15, 3,  16, 19, 20, 2,  1,  21, 0, 17, 22, 23, 24, 35, 36, 37, 38, 39}));
}

TEST(Partition, GoldenVectors) {
  EXPECT_EQ(get_partitions("orig", 10, 2, 1, 2, 2, 2).ids, (V{0, 1, 4, -1, 2, 3, -1, -1, 5, 6, 9, -1, 7, 8, -1, -1}));
  EXPECT_EQ(get_partitions("orig", 10, 2, 2, 1, 1, 2, 4).ids, (V{2, 3, 4, -1, 7, 8, 9, -1}));
  const Partition relaxed = get_partitions("relaxed", 12, 2, 3, 1, 1, 2, 0, 2);
  EXPECT_EQ(relaxed.ids, (V{0, 1, 3, 4, 2, 6, 5, 9, 7, 8, 10, 11}));
  EXPECT_EQ(relaxed.traversal(), (V{0, 1, 2, 6, 7, 8, 3, 4, 5, 9, 10, 11}));
  EXPECT_EQ(relaxed.traversal(), get_partitions("orig", 12, 2, 2, 1, 1, 3).traversal());
  EXPECT_EQ(get_partitions("orig", 30, 4, 2, 2, 2, 2).traversal(),
            (V{0, 1, 15, 16, 7,  8,  22, 23, 2, 3, 17, 18, 9,  10, 24, 25,
               4, 5, 19, 20, 11, 12, 26, 27, 6, 6, 21, 21, 13, 14, 28, 29}));
}

TEST(Partition, ElasticDeterminismKeepsGlobalBatches) {
  // N=32, NCN=4, global batch 8: every world shape sees the same set of samples in each global batch.
  const std::array<std::array<int64_t, 4>, 6> worlds = {
      {{1, 1, 1, 8}, {1, 2, 2, 4}, {2, 2, 1, 2}, {4, 2, 3, 1}, {2, 4, 1, 1}, {4, 1, 2, 2}}};
  for (const auto& [p, r, w, b] : worlds) {
    const V order = get_partitions("orig", 32, 4, p, r, w, b).traversal();
    V real;
    for (int64_t v : order)
      if (v >= 0) real.push_back(v);
    ASSERT_GE(real.size(), 8u);
    EXPECT_EQ(std::set<int64_t>(real.begin(), real.begin() + 8), (std::set<int64_t>{0, 1, 8, 9, 16, 17, 24, 25}))
        << p << r << w << b;
  }
}

TEST(Sampling, GoldenVectors) {
  EXPECT_EQ(get_sampling({4, 4, 4}, 5, 1, 9176, 0, true), (V{1, 1, 3}));
  EXPECT_EQ(get_sampling({4, 4, 4}, 30, 1, 9176, 0, true), (V{10, 9, 11}));
  EXPECT_EQ(get_sampling({4, 4, 4}, 24, 1, 9176, 0, true), (V{8, 8, 8}));
}

}  // namespace
}  // namespace tessera::data::streaming
