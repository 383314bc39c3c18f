// MDS datasets: round trips and clear errors for damaged shards and indexes (byte compatibility with Streaming is
// checked in tests/compat/test_mds_streaming.py).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tessera/data/mds.h"
#include "test_util.h"

namespace tessera::data::mds {
namespace {

namespace fs = std::filesystem;
using tessera::testing::error_of;

ReaderOptions no_hash_check() {
  ReaderOptions o;
  o.verify_hashes = false;
  return o;
}

fs::path fresh(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / "tessera_mds" / name;
  fs::remove_all(d);
  return d;
}

void write_tokens(const fs::path& dir, int n, std::optional<std::string> compression = std::nullopt,
                  uint64_t size_limit = 1 << 26) {
  WriterOptions o;
  o.out = dir.string();
  o.columns = {{"tokens", "ndarray:int32"}, {"id", "int"}};
  o.compression = compression;
  o.hashes = {"sha1", "xxh64"};
  o.size_limit = size_limit;
  MDSWriter w(o);
  for (int i = 0; i < n; ++i) w.write({{"tokens", at::arange(i, i + 10, at::kInt)}, {"id", int64_t{i}}});
  w.finish();
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
void spit(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary) << s;
}

TEST(MDS, RoundTripAcrossShardsAndCompression) {
  for (auto compression :
       {std::optional<std::string>(), std::optional<std::string>("zstd"), std::optional<std::string>("gz")}) {
    const fs::path dir = fresh("roundtrip");
    write_tokens(dir, 50, compression, 400);
    MDSDataset ds(dir.string());
    EXPECT_EQ(ds.size(), 50);
    EXPECT_GT(ds.shards().size(), 3u);
    for (int64_t i : {0, 7, 31, 49}) {
      Sample s = ds.get(i);
      EXPECT_TRUE(at::equal(std::get<at::Tensor>(s["tokens"]), at::arange(i, i + 10, at::kInt))) << i;
      EXPECT_EQ(std::get<int64_t>(s["id"]), i);
    }
    EXPECT_EQ(ds.column(3, "id").size(), 8u);
  }
}

TEST(MDS, DamagedShardsAreDetected) {
  const fs::path dir = fresh("damaged");
  write_tokens(dir, 20);
  const fs::path shard = dir / "shard.00000.mds";
  const std::string good = slurp(shard);

  std::string flipped = good;
  flipped[good.size() - 5] ^= 0x10;  // one bit in the last sample
  spit(shard, flipped);
  EXPECT_NE(error_of([&] { MDSDataset(dir.string()).get(0); }).find(shard.string() + ": sha1 mismatch"),
            std::string::npos)
      << error_of([&] { MDSDataset(dir.string()).get(0); });

  spit(shard, good.substr(0, good.size() - 30));  // truncated
  EXPECT_NE(error_of([&] { MDSDataset(dir.string()).get(0); }).find("truncated or replaced"), std::string::npos);

  // Without hash verification, corrupt structure is still caught by the header checks.
  std::string bad_offsets = good;
  bad_offsets[8] = '\x01', bad_offsets[9] = '\x00', bad_offsets[10] = '\x00', bad_offsets[11] = '\x00';
  spit(shard, bad_offsets);
  EXPECT_NE(error_of([&] { MDSDataset(dir.string(), no_hash_check()).get(0); }).find("corrupt offsets"),
            std::string::npos);
  fs::remove(shard);
  EXPECT_NE(error_of([&] { MDSDataset(dir.string()).get(0); }).find("shard 0 is missing"), std::string::npos);
}

TEST(MDS, CorruptCompressedShardIsNotDecompressed) {
  const fs::path dir = fresh("zip");
  write_tokens(dir, 5, "zstd");
  const fs::path zip = dir / "shard.00000.mds.zstd";
  std::string z = slurp(zip);
  z[z.size() / 2] ^= 0x01;
  spit(zip, z);
  EXPECT_NE(error_of([&] { MDSDataset(dir.string()).get(0); }).find(zip.string() + ": sha1 mismatch"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir / "shard.00000.mds")) << "no raw shard is produced from a corrupt zip";
}

TEST(MDS, BadIndexesAndRanges) {
  const fs::path dir = fresh("index");
  write_tokens(dir, 3);
  const std::string index = slurp(dir / "index.json");
  std::string v3 = index;
  v3.replace(v3.rfind("\"version\": 2"), 12, "\"version\": 3");
  spit(dir / "index.json", v3);
  EXPECT_NE(error_of([&] { MDSDataset ds(dir.string()); }).find("unsupported index version 3"), std::string::npos);
  std::string no_samples = index;
  no_samples.replace(no_samples.find("\"samples\": 3, "), 14, "");
  spit(dir / "index.json", no_samples);
  EXPECT_NE(error_of([&] { MDSDataset ds(dir.string()); }).find("shard 0: missing or malformed key"),
            std::string::npos);
  spit(dir / "index.json", "{\"shards\": [");
  EXPECT_NE(error_of([&] { MDSDataset ds(dir.string()); }).find("not valid JSON"), std::string::npos);
  spit(dir / "index.json", index);
  MDSDataset ds(dir.string());
  EXPECT_NE(error_of([&] { ds.get(3); }).find("sample 3 is out of range (the dataset has 3 samples)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ds.column(0, "text"); }).find("no column \"text\""), std::string::npos);
  EXPECT_NE(error_of([&] { MDSDataset d((dir / "nope").string()); }).find("no index.json"), std::string::npos);
}

TEST(MDS, WriterRejectsWhatStreamingRejects) {
  WriterOptions o;
  o.out = fresh("reject").string();
  o.columns = {{"x", "int"}};
  o.size_limit = uint64_t{1} << 32;
  EXPECT_NE(error_of([&] { MDSWriter w(o); }).find("below 4 GiB"), std::string::npos);
  o.size_limit = 1 << 20;
  o.hashes = {"xxh64", "sha1"};
  EXPECT_NE(error_of([&] { MDSWriter w(o); }).find("sorted order"), std::string::npos);
  o.hashes = {};
  o.columns = {{"x", "pkl"}};
  EXPECT_NE(error_of([&] { MDSWriter w(o); }).find("unpickling could run code"), std::string::npos);
  o.columns = {{"x", "ndarray:int32:4"}};
  MDSWriter w(o);
  EXPECT_NE(error_of([&] { w.write({{"x", at::zeros({3}, at::kInt)}}); }).find("got shape [3]"), std::string::npos);
  EXPECT_NE(error_of([&] {
              w.write({{"y", at::zeros({4}, at::kInt)}});
            }).find("missing column \"x\""),
            std::string::npos);
  EXPECT_NE(error_of([&] { w.write({{"x", at::zeros({0}, at::kInt)}}); }).find("0 elements"), std::string::npos);
}

TEST(MDS, EncodingGoldenBytes) {
  // ../shared/specs/streaming-mds.md §3.
  auto hex = [](const std::string& s) {
    std::string out;
    for (unsigned char c : s) out += fmt::format("{:02x}", c);
    return out;
  };
  EXPECT_EQ(hex(encode("int", int64_t{7})), "0700000000000000");
  EXPECT_EQ(hex(encode("int8", int64_t{-2})), "fe");
  EXPECT_EQ(hex(encode("uint16", int64_t{513})), "0102");
  EXPECT_EQ(hex(encode("float16", 1.5)), "003e");
  EXPECT_EQ(hex(encode("float32", 1.5)), "0000c03f");
  EXPECT_EQ(hex(encode("float64", 1.5)), "000000000000f83f");
  EXPECT_EQ(hex(encode("str_int", int64_t{42})), "3432");
  EXPECT_EQ(hex(encode("str_float", 1.5)), "312e35");
  EXPECT_EQ(hex(encode("ndarray:int32", at::tensor({1, 2, 3}, at::kInt))),
            "04030100000002000000030000"
            "00");
}

TEST(MDS, CacheLimitStringsAreStreamings) {
  EXPECT_EQ(parse_cache_limit("10gb"), 10737418240ULL);
  EXPECT_EQ(parse_cache_limit(" 2Kb "), 2048u);
  EXPECT_EQ(parse_cache_limit("1.5kb"), 1536u);
  EXPECT_EQ(parse_cache_limit("100b"), 100u);
  EXPECT_EQ(parse_cache_limit("100"), 100u);
  for (const char* bad : {"1k", "1.5b", "1e3", "gb", "-1kb", "lots"}) {
    EXPECT_NE(error_of([&] { parse_cache_limit(bad); }).find("unsupported value/suffix"), std::string::npos) << bad;
  }
}

// A remote that is another folder: shards are fetched on first use, compressed copies dropped, a damaged fetched
// shard deleted (so the next read fetches it again), and a cache limit keeps the folder small.
TEST(MDS, RemoteFolderIsFetchedOnDemandAndEvicted) {
  const fs::path remote = fresh("remote_src"), local = fresh("remote_cache");
  write_tokens(remote, 400, "zstd", 1 << 10);
  ReaderOptions o;
  o.remote = "file://" + remote.string();
  MDSDataset ds(local.string(), o);
  EXPECT_TRUE(fs::exists(local / "index.json"));
  EXPECT_FALSE(fs::exists(local / ds.shards()[0].raw_basename));
  EXPECT_EQ(std::get<int64_t>(ds.get(250).at("id")), 250);
  const auto shard = ds.locate(250).first;
  EXPECT_TRUE(fs::exists(local / ds.shards()[shard].raw_basename));
  EXPECT_FALSE(fs::exists(local / *ds.shards()[shard].zip_basename));
  ds.prefetch(0);
  EXPECT_TRUE(fs::exists(local / ds.shards()[0].raw_basename));

  // Damage a not-yet-fetched shard at the source: the read fails naming the file, and leaves nothing behind.
  const size_t last = ds.shards().size() - 1;
  {
    std::fstream f(remote / *ds.shards()[last].zip_basename, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.put('\x7f');
  }
  EXPECT_NE(error_of([&] { ds.get(399); }).find("mismatch"), std::string::npos);
  EXPECT_FALSE(fs::exists(local / *ds.shards()[last].zip_basename));

  uint64_t largest = 0;
  for (const auto& s : ds.shards()) largest = std::max(largest, s.raw_bytes + s.zip_bytes);
  const uint64_t index_bytes = fs::file_size(local / "index.json");
  const fs::path small = fresh("remote_small");
  ReaderOptions limited = o;
  limited.cache_limit = index_bytes + 4 * largest;
  MDSDataset lds(small.string(), limited);
  for (int64_t i = 0; i < 390; ++i) {
    ASSERT_EQ(std::get<int64_t>(lds.get(i).at("id")), i);
    ASSERT_LE(lds.cache_usage(), *limited.cache_limit) << i;
  }
  limited.cache_limit = 3 * largest;
  EXPECT_NE(error_of([&] { MDSDataset(fresh("remote_tiny").string(), limited); }).find("cache_limit"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera::data::mds
