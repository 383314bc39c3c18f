// TensorBoard event files: CRC-32C against published vectors, TFRecord framing and Event encoding against bytes that
// the tensorboard package's protobuf classes and RecordWriter produce, and a written file read back record by record.
// (tests/compat/test_tensorboard.py reads a training run's file with TensorBoard's own EventAccumulator.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tessera/config/component.h"
#include "tessera/config/reader.h"
#include "tessera/config/value.h"
#include "tessera/loggers/options.h"
#include "tessera/loggers/tensorboard.h"
#include "test_util.h"

namespace tessera::loggers {
namespace {

namespace fs = std::filesystem;
namespace tb = tensorboard;

std::string from_hex(std::string_view hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  return out;
}

uint64_t read_le(std::string_view bytes, size_t at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[at + i])) << (8 * i);
  return v;
}

TEST(TensorBoard, Crc32cKnownVectors) {
  // RFC 3720 (iSCSI) B.4 and the common check value.
  EXPECT_EQ(tb::crc32c(""), 0x00000000U);
  EXPECT_EQ(tb::crc32c("123456789"), 0xE3069283U);
  EXPECT_EQ(tb::crc32c(std::string(32, '\0')), 0x8A9136AAU);
  EXPECT_EQ(tb::crc32c(std::string(32, '\xff')), 0x62A8AB43U);
  std::string up, down;
  for (int i = 0; i < 32; ++i) {
    up.push_back(static_cast<char>(i));
    down.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(tb::crc32c(up), 0x46DD794EU);
  EXPECT_EQ(tb::crc32c(down), 0x113FDB5CU);
  // tensorboard.compat.tensorflow_stub.pywrap_tensorflow.masked_crc32c(b"abc")
  EXPECT_EQ(tb::masked_crc32c("abc"), 0x21F1576EU);
}

TEST(TensorBoard, RecordFramingMatchesTensorBoardsRecordWriter) {
  // tensorboard.summary.writer.record_writer.RecordWriter(buf).write(b"abc")
  EXPECT_EQ(tb::frame_record("abc"), from_hex("0300000000000000b099490e6162636e57f121"));
  const std::string data(1000, 'x');
  const std::string r = tb::frame_record(data);
  ASSERT_EQ(r.size(), data.size() + 16);
  EXPECT_EQ(read_le(r, 0, 8), data.size());
  EXPECT_EQ(read_le(r, 8, 4), tb::masked_crc32c(r.substr(0, 8)));
  EXPECT_EQ(r.substr(12, data.size()), data);
  EXPECT_EQ(read_le(r, 12 + data.size(), 4), tb::masked_crc32c(data));
}

TEST(TensorBoard, EventsEncodeAsProtobufDoes) {
  // event_pb2.Event(wall_time=..., step=42) with two summary values, .SerializeToString()
  EXPECT_EQ(tb::scalars_event(1700000000.25, 42, {{"a/b", 1.5}, {"loss/train/total", -3.25}}),
            from_hex("0900001040fc54d941102a2a250a0a0a03612f62150000c03f0a170a106c6f73732f747261696e2f746f74616c15000"
                     "050c0"));
  EXPECT_EQ(tb::file_version_event(1700000000.5), from_hex("0900002040fc54d9411a0d627261696e2e4576656e743a32"));
  // A text-plugin summary: DT_STRING scalar tensor, metadata.plugin_data.plugin_name = "text".
  EXPECT_EQ(tb::text_event(2.0, 0, "hyperparameters", "    {}\n"),
            from_hex("0900000000000000402a2c0a2a0a0f6879706572706172616d6574657273420d080712004207202020207b7d0a4a08"
                     "0a060a0474657874"));
}

// The records of a TFRecord file, each checked against its CRCs.
std::vector<std::string> read_records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> out;
  size_t at = 0;
  while (at < bytes.size()) {
    EXPECT_LE(at + 12, bytes.size());
    const uint64_t n = read_le(bytes, at, 8);
    EXPECT_EQ(read_le(bytes, at + 8, 4), tb::masked_crc32c(bytes.substr(at, 8)));
    const std::string data = bytes.substr(at + 12, n);
    EXPECT_EQ(read_le(bytes, at + 12 + n, 4), tb::masked_crc32c(data));
    out.push_back(data);
    at += 16 + n;
  }
  return out;
}

TEST(TensorBoard, WriterBuffersWholeRecordsUntilFlush) {
  const fs::path dir = fs::temp_directory_path() / "tessera_tensorboard_test";
  fs::remove_all(dir);
  std::string path;
  {
    EventFileWriter w((dir / "nested").string());
    path = w.path();
    EXPECT_EQ(fs::path(path).parent_path(), dir / "nested");
    EXPECT_EQ(fs::path(path).filename().string().rfind("events.out.tfevents.", 0), 0U);
    ASSERT_EQ(read_records(path).size(), 1U);  // the file_version record is flushed at once
    w.add_scalars({{"x", 1.0}}, 1);
    w.add_scalars({{"x", 2.0}, {"y", 3.0}}, 2);
    EXPECT_EQ(read_records(path).size(), 1U);
    w.flush();
    const auto records = read_records(path);
    ASSERT_EQ(records.size(), 3U);
    EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);
    EXPECT_EQ(records[2].substr(9), tb::scalars_event(0, 2, {{"x", 2.0}, {"y", 3.0}}).substr(9));  // after wall_time
    w.add_text("notes", "hello", 0);
  }
  EXPECT_EQ(read_records(path).size(), 4U);  // the destructor flushes
}

TEST(TensorBoard, LoggerOptionsAreChecked) {
  config::ParseContext ctx("r.yaml");
  auto error = [&](const std::string& yaml) {
    config::Value v = config::parse_yaml(yaml, config::Origin{"r.yaml", 1, ""});
    config::Section root(&v, "", ctx);
    return testing::error_of([&] { config::parse_components(root, "loggers", logger_registry()); });
  };
  EXPECT_NE(error("loggers: {tensorboard: {flush_interval: 0}}").find("loggers.tensorboard.flush_interval"),
            std::string::npos);
  EXPECT_NE(error("loggers: {tensorboard: {logdir: x}}").find("loggers.tensorboard.logdir"), std::string::npos);
  EXPECT_NE(error("loggers: {tensorboard: {rank_zero_only: maybe}}").find("loggers.tensorboard.rank_zero_only"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera::loggers
