// Token batch loading: order, collation, legacy token columns, resumption, and errors from worker threads.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tessera/data/loader.h"
#include "test_util.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;

// 103 samples; sample i holds tokens [1000 i, 1000 i + len) with len varying in 5..44.
fs::path make_dataset(const std::string& name, bool legacy_bytes) {
  const fs::path dir = fs::temp_directory_path() / "tessera_loader" / name;
  fs::remove_all(dir);
  mds::WriterOptions o;
  o.out = dir.string();
  o.columns = {{"tokens", legacy_bytes ? "bytes" : "ndarray:int32"}};
  o.hashes = {"xxh64"};
  o.size_limit = 2000;
  mds::MDSWriter w(o);
  for (int64_t i = 0; i < 103; ++i) {
    const at::Tensor t = at::arange(1000 * i, 1000 * i + 5 + (i * 7) % 40, legacy_bytes ? at::kLong : at::kInt);
    if (legacy_bytes) {
      w.write({{"tokens", std::string(static_cast<const char*>(t.data_ptr()), t.numel() * 8)}});
    } else {
      w.write({{"tokens", t}});
    }
  }
  w.finish();
  return dir;
}

StreamingOptions options(const fs::path& dir, int64_t batch) {
  StreamingOptions o;
  o.streams.emplace_back();
  o.streams.back().local = dir.string();
  o.batch_size = batch;
  o.shuffle = true;
  o.shuffle_seed = 5;
  o.shuffle_block_size = 32;
  return o;
}

std::vector<int64_t> first_tokens(const TokenBatch& b) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < b.samples; ++i) out.push_back(b.input_ids[i][0].item<int64_t>() / 1000);
  return out;
}

TEST(TokenLoader, BatchesFollowTheEpochArrangementRoundRobin) {
  const fs::path dir = make_dataset("order", false);
  StreamingDataset ds(options(dir, 4), {1, 1, 3});
  TokenLoaderOptions lo;
  lo.max_seq_len = 16;
  lo.drop_last = false;
  TokenBatchLoader loader(ds, 3, 0, 0, 0, 0, lo);
  const streaming::Partition p = ds.epoch_ids(0, 0);
  std::vector<std::vector<int64_t>> expected;
  for (int64_t b = 0; b < p.shape[3]; ++b) {
    for (int64_t w = 0; w < 3; ++w) {
      std::vector<int64_t> ids;
      for (int64_t e = 0; e < 4; ++e) {
        if (p.at(0, 0, w, b, e) >= 0) ids.push_back(p.at(0, 0, w, b, e));
      }
      if (!ids.empty()) expected.push_back(ids);
    }
  }
  size_t k = 0;
  int64_t total = 0;
  while (auto batch = loader.next()) {
    ASSERT_LT(k, expected.size());
    EXPECT_EQ(first_tokens(*batch), expected[k]) << "batch " << k;
    EXPECT_LE(batch->input_ids.size(1), 16) << "truncated to max_seq_len";
    for (int64_t i = 0; i < batch->samples; ++i) {
      const int64_t id = expected[k][static_cast<size_t>(i)], len = std::min<int64_t>(5 + (id * 7) % 40, 16);
      EXPECT_TRUE(at::equal(batch->input_ids[i].narrow(0, 0, len), at::arange(1000 * id, 1000 * id + len, at::kLong)));
      EXPECT_TRUE(at::all(batch->labels[i].narrow(0, len, batch->labels.size(1) - len) == -100).item<bool>());
    }
    total += batch->samples;
    ++k;
  }
  EXPECT_EQ(k, expected.size());
  EXPECT_EQ(total, 103) << "every sample once (no padding samples at world size 1)";
  EXPECT_EQ(loader.samples_consumed(), 103);
}

TEST(TokenLoader, ResumingContinuesWhereTheUninterruptedRunWould) {
  const fs::path dir = make_dataset("resume", true);
  TokenLoaderOptions lo;
  lo.max_seq_len = 8;
  std::vector<std::vector<int64_t>> all;
  {
    StreamingDataset ds(options(dir, 5), {1, 1, 1});
    TokenBatchLoader loader(ds, 1, 1, 0, 0, 0, lo);
    while (auto b = loader.next()) all.push_back(first_tokens(*b));
  }
  EXPECT_EQ(all.size(), 20u) << "103 samples in batches of 5, the short last one dropped";
  StreamingDataset ds(options(dir, 5), {1, 1, 1});
  const ResumeState state = ds.state(1, 35);  // 7 batches consumed
  StreamingDataset resumed(options(dir, 5), {1, 1, 1});
  const auto [epoch, sample] = resumed.load_state(ResumeState::from_json(state.to_json()));
  TokenBatchLoader loader(resumed, 1, epoch, sample, 0, 0, lo);
  std::vector<std::vector<int64_t>> rest;
  while (auto b = loader.next()) rest.push_back(first_tokens(*b));
  EXPECT_EQ(rest, std::vector<std::vector<int64_t>>(all.begin() + 7, all.end()));
}

TEST(TokenLoader, WorkerErrorsReachTheConsumer) {
  const fs::path dir = make_dataset("corrupt", false);
  std::fstream f(dir / "shard.00003.mds", std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(-3, std::ios::end);
  f.put('\x7f');
  f.close();
  StreamingDataset ds(options(dir, 4), {1, 1, 2});
  TokenBatchLoader loader(ds, 2, 0, 0, 0, 0, {});
  const std::string err = tessera::testing::error_of([&] {
    while (loader.next()) {
    }
  });
  EXPECT_NE(err.find("shard.00003.mds: xxh64 mismatch"), std::string::npos) << err;
  EXPECT_THROW(TokenBatchLoader(ds, 3, 0, 0, 0, 0, {}), Error) << "partitioned for 2 workers";
}

}  // namespace
}  // namespace tessera::data

namespace tessera::data {
namespace {

TEST(ResumeState, UsesStreamingsKeysAndNamesWhatIsMissing) {
  // Streaming's state_dict keys (streaming/base/dataset.py), e.g. issue #880's checkpoint.
  const nlohmann::json saved = {{"epoch", 0},
                                {"initial_physical_nodes", 1},
                                {"num_canonical_nodes", 1},
                                {"sample_in_epoch", 100},
                                {"shuffle_seed", 9176}};
  const ResumeState s = ResumeState::from_json(saved);
  EXPECT_EQ(s.sample_in_epoch, 100);
  EXPECT_EQ(s.initial_physical_nodes, 1);
  EXPECT_EQ(s.to_json(), saved) << "round trip, same keys and values";
  nlohmann::json missing = saved;
  missing.erase("sample_in_epoch");
  EXPECT_NE(tessera::testing::error_of([&] { ResumeState::from_json(missing); }).find("sample_in_epoch"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera::data
