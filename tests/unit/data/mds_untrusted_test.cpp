// MDS datasets as untrusted input (docs/security.md): a crafted index.json cannot make the reader create, replace or
// delete a file outside the dataset's folder, and a crafted compressed shard cannot make it allocate more than the
// index promised. Each test snapshots a decoy folder beside the dataset and checks it is untouched.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>

#include "tessera/data/mds.h"
#include "test_util.h"

namespace tessera::data::mds::untrusted_test {
namespace {

namespace fs = std::filesystem;
using tessera::testing::error_of;

fs::path fresh(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / "tessera_mds_untrusted" / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
void spit(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary) << s;
}

// Every file under `root` (relative name -> bytes), links as their targets.
std::map<std::string, std::string> snapshot(const fs::path& root) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    const std::string rel = fs::relative(e.path(), root).string();
    if (e.is_symlink()) {
      out[rel] = "-> " + fs::read_symlink(e.path()).string();
    } else if (e.is_regular_file()) {
      out[rel] = slurp(e.path());
    } else {
      out[rel] = "(dir)";
    }
  }
  return out;
}

// A folder with a 5-sample dataset (compressed when `compression` is set) and its index as JSON.
nlohmann::json write_dataset(const fs::path& dir, std::optional<std::string> compression = std::nullopt) {
  WriterOptions o;
  o.out = dir.string();
  o.columns = {{"tokens", "ndarray:int32"}};
  o.compression = std::move(compression);
  MDSWriter w(o);
  for (int i = 0; i < 5; ++i) w.write({{"tokens", at::arange(i, i + 10, at::kInt)}});
  w.finish();
  return nlohmann::json::parse(slurp(dir / "index.json"));
}

// The test's layout: <root>/remote (the dataset as served), <root>/run/cache (the reader's folder), and
// <root>/decoy, <root>/run/decoy holding a file each, which nothing may touch.
struct Layout {
  explicit Layout(const std::string& name) : root(fresh(name)) {
    for (const fs::path& d : {root / "decoy", root / "run" / "decoy"}) {
      fs::create_directories(d);
      spit(d / "outside.mds", "a user's file");
    }
  }
  std::map<std::string, std::string> outside() const {
    auto all = snapshot(root);
    std::erase_if(
        all, [](const auto& kv) { return kv.first.rfind("run/cache", 0) == 0 || kv.first.rfind("remote", 0) == 0; });
    return all;
  }
  fs::path root;
  fs::path remote = root / "remote";
  fs::path cache = root / "run" / "cache";
};

ReaderOptions from(const fs::path& remote) {
  ReaderOptions o;
  o.remote = "file://" + remote.string();
  return o;
}

TEST(MDSUntrusted, ShardNamesThatLeaveTheFolderAreRefusedBeforeAnyFetch) {
  const std::pair<const char*, const char*> cases[] = {
      {"raw", "../decoy/outside.mds"},
      {"raw", "../../decoy/outside.mds"},
      {"raw", "/tmp/outside.mds"},
      {"raw", "sub/../../decoy/outside.mds"},
      {"raw", ""},
      {"raw", "./shard.mds"},
      {"raw", "index.json"},
      {"raw", ".tessera-locks/x"},
      {"zip", "../decoy/outside.mds"},
  };
  for (const auto& [which, name] : cases) {
    Layout l(std::string("names_") + which);
    nlohmann::json index =
        write_dataset(l.remote, std::string(which) == "zip" ? std::optional<std::string>("zstd") : std::nullopt);
    index["shards"][0][std::string(which) == "zip" ? "zip_data" : "raw_data"]["basename"] = name;
    spit(l.remote / "index.json", index.dump());
    const auto before = l.outside();
    const std::string error = error_of([&] {
      MDSDataset ds(l.cache.string(), from(l.remote));
      ds.get(0);
    });
    EXPECT_NE(error.find((l.cache / "index.json").string() + ": shard 0: " + which), std::string::npos) << error;
    EXPECT_NE(error.find(std::string("\"") + name + "\""), std::string::npos) << error;
    EXPECT_NE(error.find("refusing to use it as a path"), std::string::npos) << error;
    EXPECT_EQ(l.outside(), before) << name;
    // Nothing but the index was fetched (beside the reader's lock folder).
    auto fetched = snapshot(l.cache);
    std::erase_if(fetched, [](const auto& kv) { return kv.first.rfind(".tessera-locks", 0) == 0; });
    EXPECT_EQ(fetched.size(), 1u) << name;
  }
}

TEST(MDSUntrusted, ALinkInTheCacheDoesNotLeadAFetchOutOfIt) {
  Layout l("link");
  nlohmann::json index = write_dataset(l.remote);
  // Streaming's merged indexes name shards under subfolders; here the subfolder in the cache is a link out of it.
  fs::create_directories(l.remote / "sub");
  fs::rename(l.remote / "shard.00000.mds", l.remote / "sub" / "outside.mds");
  index["shards"][0]["raw_data"]["basename"] = "sub/outside.mds";
  spit(l.remote / "index.json", index.dump());
  fs::create_directories(l.cache);
  fs::create_directory_symlink(l.root / "decoy", l.cache / "sub");
  const auto before = l.outside();
  const std::string error = error_of([&] { MDSDataset(l.cache.string(), from(l.remote)).get(0); });
  EXPECT_NE(error.find("\"sub/outside.mds\""), std::string::npos) << error;
  EXPECT_NE(error.find("through a symbolic link"), std::string::npos) << error;
  EXPECT_EQ(l.outside(), before);
  EXPECT_EQ(slurp(l.root / "decoy" / "outside.mds"), "a user's file");

  // The same name without the link is a shard like any other.
  fs::remove(l.cache / "sub");
  EXPECT_EQ(MDSDataset(l.cache.string(), from(l.remote)).get(4).count("tokens"), 1u);
  EXPECT_TRUE(fs::is_regular_file(l.cache / "sub" / "outside.mds"));
}

// A zstd frame of 17 bytes that declares `declared` bytes of content (one RLE block of 1 byte follows).
std::string zstd_frame_declaring(uint64_t declared) {
  std::string f = "\x28\xb5\x2f\xfd";
  f += '\xe0';  // frame header: 8-byte content size, single segment
  for (int i = 0; i < 8; ++i) f += static_cast<char>((declared >> (8 * i)) & 0xff);
  const uint32_t block = (1u << 3) | (1u << 1) | 1u;  // last block, RLE, size 1
  f += static_cast<char>(block & 0xff);
  f += static_cast<char>((block >> 8) & 0xff);
  f += static_cast<char>((block >> 16) & 0xff);
  f += 'x';
  return f;
}

// A zstd frame without a content size whose `blocks` RLE blocks of 128 KiB each decompress to blocks * 128 KiB.
std::string zstd_stream_frame(int blocks) {
  std::string f = "\x28\xb5\x2f\xfd";
  f += '\x00';  // frame header: no content size, a window descriptor follows
  f += '\x38';  // window 2^(10 + 7) = 128 KiB
  for (int b = 0; b < blocks; ++b) {
    const uint32_t block = ((128u << 10) << 3) | (1u << 1) | (b + 1 == blocks ? 1u : 0u);
    f += static_cast<char>(block & 0xff);
    f += static_cast<char>((block >> 8) & 0xff);
    f += static_cast<char>((block >> 16) & 0xff);
    f += 'x';
  }
  return f;
}

TEST(MDSUntrusted, ACompressedShardCannotDecompressToMoreThanTheIndexSays) {
  struct Case {
    const char* name;
    std::string zip;
    const char* expected;
  };
  const Case cases[] = {
      {"declares 8 GiB", zstd_frame_declaring(uint64_t{8} << 30), "decompresses to more than the"},
      {"declares 2^63", zstd_frame_declaring(uint64_t{1} << 63), "decompresses to more than the"},
      {"streams 64 MiB", zstd_stream_frame(512), "decompresses to more than the"},
      {"declares 1 byte", zstd_frame_declaring(1), "decompresses to 1 bytes, index.json says"},
  };
  for (const Case& c : cases) {
    Layout l("bomb");
    nlohmann::json index = write_dataset(l.remote, "zstd");
    auto& shard = index["shards"][0];
    spit(l.remote / shard["zip_data"]["basename"].get<std::string>(), c.zip);
    shard["zip_data"]["bytes"] = c.zip.size();
    shard["zip_data"].erase("hashes");
    spit(l.remote / "index.json", index.dump());
    const std::string error = error_of([&] { MDSDataset(l.cache.string(), from(l.remote)).get(0); });
    EXPECT_NE(error.find("shard.00000.mds.zstd: " + std::string(c.expected)), std::string::npos)
        << c.name << ": " << error;
    EXPECT_FALSE(fs::exists(l.cache / "shard.00000.mds")) << c.name;
  }
  // raw_data.bytes itself is bounded by what 32-bit offsets can address.
  Layout l("huge_raw");
  nlohmann::json index = write_dataset(l.remote);
  index["shards"][0]["raw_data"]["bytes"] = uint64_t{1} << 40;
  spit(l.remote / "index.json", index.dump());
  EXPECT_NE(error_of([&] { MDSDataset(l.cache.string(), from(l.remote)); }).find("raw_data.bytes 1099511627776"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera::data::mds::untrusted_test
