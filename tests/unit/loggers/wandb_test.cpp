// The W&B offline run's transaction log: LevelDB log framing with W&B's header, byte for byte as wandb writes it
// (the vector is the one wandb's own protobuf classes and a zlib writer produce: docs/formats/wandb.md), across
// block boundaries, and the numbers as wandb's JSON writes them. tests/compat/test_wandb.py reads whole runs back
// with the wandb package's own reader.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tessera/loggers/wandb.h"

// A named namespace: the sanitizer trees' unity batches put this file beside the other logger tests.
namespace wandb_test {
namespace {

namespace fs = std::filesystem;
namespace wandb = tessera::loggers::wandb;

std::string bytes(const std::string& hex) {
  std::string out;
  std::istringstream in(hex);
  for (std::string b; in >> b;) out.push_back(static_cast<char>(std::stoi(b, nullptr, 16)));
  return out;
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

fs::path fresh(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  fs::remove(p);
  return p;
}

TEST(Wandb, TheLogIsFramedByteForByteAsWandbFramesIt) {
  // Five records (run, two history rows, summary, exit) serialized by wandb's protobuf classes, and the whole file
  // wandb's framing makes of them (181 bytes).
  const std::vector<std::string> records = {
      bytes("08 01 8a 01 27 0a 08 61 62 63 31 32 33 34 35 1a 04 70 72 6f 6a 22 0c 0a 0a 0a 02 6c 72 82 01 03 30 2e 31 "
            "8a 01 06 08 80 f2 d6 ca 06"),
      bytes("08 02 12 1d 0a 0c 0a 04 6c 6f 73 73 82 01 03 30 2e 35 0a 0b 0a 05 5f 73 74 65 70 82 01 01 30 12 00"),
      bytes("08 03 12 20 0a 0d 0a 04 6c 6f 73 73 82 01 04 30 2e 32 35 0a 0b 0a 05 5f 73 74 65 70 82 01 01 31 12 02 "
            "08 01"),
      bytes("08 04 1a 0f 0a 0d 0a 04 6c 6f 73 73 82 01 04 30 2e 32 35"),
      bytes("08 05 92 01 02 10 02"),
  };
  const std::string want = bytes(
      "3a 57 26 42 e1 be 00 c1 b0 98 b9 2c 00 01 08 01 8a 01 27 0a 08 61 62 63 31 32 33 34 35 1a 04 70 "
      "72 6f 6a 22 0c 0a 0a 0a 02 6c 72 82 01 03 30 2e 31 8a 01 06 08 80 f2 d6 ca 06 06 17 73 fc 21 00 "
      "01 08 02 12 1d 0a 0c 0a 04 6c 6f 73 73 82 01 03 30 2e 35 0a 0b 0a 05 5f 73 74 65 70 82 01 01 30 "
      "12 00 1d 80 d6 7d 24 00 01 08 03 12 20 0a 0d 0a 04 6c 6f 73 73 82 01 04 30 2e 32 35 0a 0b 0a 05 "
      "5f 73 74 65 70 82 01 01 31 12 02 08 01 84 a4 3d e3 13 00 01 08 04 1a 0f 0a 0d 0a 04 6c 6f 73 73 "
      "82 01 04 30 2e 32 35 25 b4 98 7e 07 00 01 08 05 92 01 02 10 02");
  const fs::path path = fresh("tessera_wandb_vector");
  {
    wandb::RecordWriter w(path.string());
    for (const std::string& r : records) w.append(r);
  }
  EXPECT_EQ(read(path), want);
  EXPECT_THROW(wandb::RecordWriter{path.string()}, tessera::Error);  // never over another run's log
  fs::remove(path);
}

TEST(Wandb, RecordsSplitAcrossBlocksAsWandbSplitsThem) {
  const fs::path path = fresh("tessera_wandb_blocks");
  {
    wandb::RecordWriter w(path.string());
    w.append(std::string(32747, 'a'));               // header 7 + chunk header 7 + 32747: 7 bytes left in block 0
    w.append("hello");                               // a zero-length FIRST there, the LAST in block 1
    w.append(std::string(32768 - 12 - 7 - 3, 'b'));  // leaves 3 bytes of block 1: zeros
    w.append(std::string(70000, 'c'));               // FIRST, MIDDLE, LAST
  }
  const std::string f = read(path);
  auto chunk = [&](size_t at) {  // (crc, length, type)
    const auto u = [&](size_t i) { return static_cast<uint32_t>(static_cast<uint8_t>(f[at + i])); };
    return std::tuple<uint32_t, uint32_t, uint32_t>(u(0) | u(1) << 8 | u(2) << 16 | u(3) << 24, u(4) | u(5) << 8, u(6));
  };
  EXPECT_EQ(chunk(7), std::make_tuple(wandb::chunk_crc(1, std::string(32747, 'a')), 32747u, 1u));
  EXPECT_EQ(chunk(32761), std::make_tuple(0x3c0c8ea1u, 0u, 2u));  // crc32 of the type byte alone
  EXPECT_EQ(chunk(32768), std::make_tuple(wandb::chunk_crc(4, "hello"), 5u, 4u));
  const size_t b = 32768 + 12;
  EXPECT_EQ(std::get<1>(chunk(b)), 32768u - 12 - 7 - 3);
  EXPECT_EQ(f.substr(2 * 32768 - 3, 3), std::string(3, '\0'));
  EXPECT_EQ(chunk(2 * 32768), std::make_tuple(wandb::chunk_crc(2, std::string(32761, 'c')), 32761u, 2u));
  EXPECT_EQ(chunk(3 * 32768), std::make_tuple(wandb::chunk_crc(3, std::string(32761, 'c')), 32761u, 3u));
  EXPECT_EQ(chunk(4 * 32768), std::make_tuple(wandb::chunk_crc(4, std::string(70000 - 2 * 32761, 'c')),
                                              static_cast<uint32_t>(70000 - 2 * 32761), 4u));
  EXPECT_EQ(f.size(), 4 * 32768 + 7 + (70000 - 2 * 32761));
  fs::remove(path);
}

TEST(Wandb, NumbersAreWrittenAsWandbsJson) {
  EXPECT_EQ(wandb::number_json(1.0), "1");
  EXPECT_EQ(wandb::number_json(0.25), "0.25");
  EXPECT_EQ(wandb::number_json(-3.0), "-3");
  EXPECT_EQ(wandb::number_json(std::nan("")), "NaN");
  EXPECT_EQ(wandb::number_json(-INFINITY), "-Infinity");
  EXPECT_EQ(std::stod(wandb::number_json(0.1 + 0.2)), 0.1 + 0.2);  // the shortest form that reads back the same
}

}  // namespace
}  // namespace wandb_test
