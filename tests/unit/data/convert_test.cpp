// Record readers (JSONL plain / gzip / zstd, JSON arrays, errors naming the line) and the streaming converter: output
// independent of the number of workers, bounded by blocks, and an interrupted conversion resumed to the same bytes.
// Parquet, Arrow and CSV files written by pyarrow, and LLM Foundry's converter's bytes, are checked in
// tests/compat/test_records_pyarrow.py and tests/composer/test_convert_vs_llmfoundry.py.
#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "tessera/data/convert.h"
#include "tessera/data/records.h"
#include "tessera/data/tokenizer.h"
#include "tessera/util/file_io.h"
#include "test_util.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;
using tessera::testing::error_of;

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / "tessera_convert" / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string jsonl_of(const std::vector<std::string>& docs) {
  std::string out;
  for (size_t i = 0; i < docs.size(); ++i) out += Record{{"text", docs[i]}, {"id", i}}.dump() + "\n";
  return out;
}

void write_gzip(const fs::path& p, const std::string& data) {
  gzFile f = gzopen(p.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, data.data(), static_cast<unsigned>(data.size())), static_cast<int>(data.size()));
  gzclose(f);
}

void write_zstd(const fs::path& p, const std::string& data) {
  std::string out(ZSTD_compressBound(data.size()), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), data.data(), data.size(), 3);
  ASSERT_FALSE(ZSTD_isError(n));
  out.resize(n);
  util::write_file_atomically(p.string(), out);
}

std::vector<std::string> texts_of(const std::vector<std::string>& files) {
  RecordStream s(files, std::nullopt, {"text"});
  std::vector<Record> rows;
  while (s.read(rows, 7) > 0) {
  }
  std::vector<std::string> out;
  for (const auto& r : rows) out.push_back(r.at("text").get<std::string>());
  return out;
}

// Documents with varied lengths (a few longer than a sample and than a read buffer line).
std::vector<std::string> corpus(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<std::string> words = {"alpha", "beta", "gamma", "delta", "tokens", "shard", "ünï", "漢字", "\n"};
  std::vector<std::string> docs;
  for (int i = 0; i < n; ++i) {
    std::string d;
    const int len = static_cast<int>(rng() % 40) + (i % 97 == 0 ? 400 : 0);
    for (int k = 0; k < len; ++k) d += words[rng() % words.size()] + " ";
    docs.push_back(i % 50 == 3 ? std::string() : d);  // empty documents count too
  }
  return docs;
}

TEST(Records, JsonlPlainGzipAndZstdReadTheSameRowsAndJsonArraysToo) {
  const fs::path dir = fresh_dir("formats");
  std::vector<std::string> docs = corpus(300, 1);
  docs.push_back(std::string(3 << 20, 'x'));  // a line longer than the 1 MiB read buffer
  const std::string text = jsonl_of(docs);
  util::write_file_atomically((dir / "a.jsonl").string(), text);
  write_gzip(dir / "b.jsonl.gz", text);
  write_zstd(dir / "c.jsonl.zst", text);
  nlohmann::json array = nlohmann::json::array();
  for (const auto& d : docs) array.push_back({{"text", d}});
  util::write_file_atomically((dir / "d.json").string(), array.dump(2));
  for (const char* name : {"a.jsonl", "b.jsonl.gz", "c.jsonl.zst", "d.json"}) {
    EXPECT_EQ(texts_of({(dir / name).string()}), docs) << name;
  }
  // A folder: every readable file in sorted order, metadata skipped.
  util::write_file_atomically((dir / "dataset_info.json").string(), "{}");
  EXPECT_EQ(expand_record_inputs({dir.string()}, std::nullopt).size(), 4u);
  EXPECT_EQ(texts_of(expand_record_inputs({dir.string()}, std::nullopt)).size(), 4 * docs.size());
}

TEST(Records, SkippingThenReadingEqualsReadingEverythingAcrossFiles) {
  const fs::path dir = fresh_dir("skip");
  const std::vector<std::string> docs = corpus(250, 2);
  util::write_file_atomically((dir / "a.jsonl").string(), jsonl_of({docs.begin(), docs.begin() + 100}));
  write_zstd(dir / "b.jsonl.zst", jsonl_of({docs.begin() + 100, docs.end()}));
  const std::vector<std::string> files = {(dir / "a.jsonl").string(), (dir / "b.jsonl.zst").string()};
  for (int64_t skip : {0, 1, 99, 100, 101, 249}) {
    RecordStream s(files, std::nullopt, {"text"});
    s.skip(skip);
    std::vector<Record> rows;
    while (s.read(rows, 64) > 0) {
    }
    ASSERT_EQ(rows.size(), docs.size() - static_cast<size_t>(skip)) << skip;
    EXPECT_EQ(rows.front().at("text"), docs[static_cast<size_t>(skip)]) << skip;
  }
  RecordStream s(files, std::nullopt);
  EXPECT_NE(error_of([&] { s.skip(251); }).find("fewer than the 251"), std::string::npos);
}

TEST(Records, ErrorsNameTheFileAndLine) {
  const fs::path dir = fresh_dir("errors");
  util::write_file_atomically((dir / "bad.jsonl").string(), "{\"text\": \"a\"}\n\n{\"text\": \n");
  EXPECT_NE(error_of([&] { texts_of({(dir / "bad.jsonl").string()}); }).find("bad.jsonl:3: malformed JSON line"),
            std::string::npos);
  util::write_file_atomically((dir / "nocol.jsonl").string(), "{\"text\": \"a\"}\n{\"body\": \"b\"}\n");
  EXPECT_NE(error_of([&] { texts_of({(dir / "nocol.jsonl").string()}); }).find("nocol.jsonl:2: no column 'text'"),
            std::string::npos);
  util::write_file_atomically((dir / "trunc.jsonl.zst").string(), std::string("\x28\xb5\x2f\xfd\x00\x00", 6));
  EXPECT_NE(error_of([&] { texts_of({(dir / "trunc.jsonl.zst").string()}); }).find("trunc.jsonl.zst"),
            std::string::npos);
  util::write_file_atomically((dir / "x.parquet").string(), "not parquet at all");
  EXPECT_NE(error_of([&] { texts_of({(dir / "x.parquet").string()}); }).find("x.parquet"), std::string::npos);
  EXPECT_NE(error_of([&] { texts_of({(dir / "data.bin").string()}); }).find("data.bin"), std::string::npos);
  EXPECT_NE(error_of([&] { expand_record_inputs({(dir / "missing").string()}, std::nullopt); }).find("missing"),
            std::string::npos);
}

// Every file of a folder, by relative name.
std::map<std::string, std::string> files_of(const fs::path& root) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (e.is_regular_file()) out[fs::relative(e.path(), root).string()] = util::read_file(e.path().string());
  }
  return out;
}

struct ConvertFixture {
  fs::path dir, tokenizer;
  std::vector<std::string> inputs;
};

ConvertFixture convert_fixture(const std::string& name) {
  ConvertFixture f;
  f.dir = fresh_dir(name);
  fs::create_directories(f.dir / "in");
  const std::vector<std::string> docs = corpus(3000, 3);
  train_bpe_tokenizer(docs, {.vocab_size = 400}).save(f.dir / "tokenizer.json");
  f.tokenizer = f.dir / "tokenizer.json";
  util::write_file_atomically((f.dir / "in" / "a.jsonl").string(), jsonl_of({docs.begin(), docs.begin() + 1000}));
  write_zstd(f.dir / "in" / "b.jsonl.zst", jsonl_of({docs.begin() + 1000, docs.end()}));
  f.inputs = {(f.dir / "in").string()};
  return f;
}

ConvertOptions options_for(const ConvertFixture& f, const std::string& out, int workers) {
  ConvertOptions o;
  o.inputs = f.inputs;
  o.output = (f.dir / out).string();
  o.tokenizer = f.tokenizer.string();
  o.concat_tokens = 32;
  o.eos_text = "ü";
  o.val_fraction = 0.1;
  o.size_limit = 4096;  // many shards
  o.workers = workers;
  o.block_documents = 100;
  return o;
}

TEST(Convert, OutputIsTheSameWithAnyNumberOfWorkers) {
  const ConvertFixture f = convert_fixture("workers");
  const ConvertResult one = convert_to_mds(options_for(f, "one", 1));
  const ConvertResult three = convert_to_mds(options_for(f, "three", 3));
  EXPECT_EQ(files_of(f.dir / "one"), files_of(f.dir / "three"));
  ASSERT_EQ(one.splits.size(), 2u);
  EXPECT_EQ(one.splits[0].documents + one.splits[1].documents, 3000);
  EXPECT_GT(one.splits[1].documents, 200);
  EXPECT_LT(one.splits[1].documents, 400);
  EXPECT_GT(one.splits[0].samples, 1000);
  EXPECT_FALSE(fs::exists(f.dir / "one" / ".tessera-convert.json"));
  EXPECT_EQ(three.progress.documents, 3000);
  EXPECT_TRUE(three.progress.done);
  EXPECT_EQ(three.progress.bytes_read, three.progress.total_bytes);
}

TEST(Convert, AnInterruptedConversionResumesToTheSameBytes) {
  const ConvertFixture f = convert_fixture("resume");
  convert_to_mds(options_for(f, "whole", 2));
  for (const bool no_wrap : {false, true}) {
    for (const int64_t stop_after : {1, 150, 600}) {
      SCOPED_TRACE(::testing::Message() << "no_wrap " << no_wrap << " stop after " << stop_after);
      ConvertOptions o = options_for(f, "resumed", 2);
      o.no_wrap = no_wrap;
      o.overwrite = true;
      o.progress_interval = 0;  // a report after every block
      o.progress = [&](const ConvertProgress& p) {
        if (!p.done && p.samples >= stop_after) throw Error("test", "interrupted");
      };
      EXPECT_NE(error_of([&] { convert_to_mds(o); }).find("interrupted"), std::string::npos);
      ASSERT_TRUE(fs::exists(f.dir / "resumed" / ".tessera-convert.json"));
      // What a kill in the middle of an atomic write leaves: temporary files, which the rerun removes.
      util::write_file_atomically((f.dir / "resumed" / ".tessera-convert.json.tmp.1.2").string(), "{\"half");
      util::write_file_atomically((f.dir / "resumed" / "train" / "shard.00999.mds.zstd.tmp.3.4").string(), "x");
      o.overwrite = false;
      o.progress = nullptr;
      const ConvertResult r = convert_to_mds(o);
      EXPECT_TRUE(r.resumed);
      ConvertOptions w = options_for(f, "whole", 2);
      w.no_wrap = no_wrap;
      w.overwrite = true;
      const ConvertResult whole = convert_to_mds(w);
      EXPECT_EQ(files_of(f.dir / "resumed"), files_of(f.dir / "whole"));
      for (size_t k = 0; k < 2; ++k) {
        EXPECT_EQ(r.splits[k].documents, whole.splits[k].documents);
        EXPECT_EQ(r.splits[k].samples, whole.splits[k].samples);
      }
    }
  }
  // Other options than the interrupted run's are refused, naming the progress file.
  ConvertOptions o = options_for(f, "other", 2);
  o.progress_interval = 0;
  o.progress = [](const ConvertProgress& p) {
    if (!p.done && p.samples > 100) throw Error("test", "interrupted");
  };
  EXPECT_NE(error_of([&] { convert_to_mds(o); }).find("interrupted"), std::string::npos);
  o.progress = nullptr;
  o.concat_tokens = 16;
  EXPECT_NE(error_of([&] { convert_to_mds(o); }).find(".tessera-convert.json: holds an interrupted conversion"),
            std::string::npos);
}

TEST(Convert, RawTextSamplesKeepEveryDocumentAndRefuseANonStringColumn) {
  const ConvertFixture f = convert_fixture("raw");
  ConvertOptions o;
  o.inputs = f.inputs;
  o.output = (f.dir / "raw").string();
  const ConvertResult r = convert_to_mds(o);
  EXPECT_EQ(r.splits.at(0).samples, 3000);
  fs::create_directories(f.dir / "num");
  util::write_file_atomically((f.dir / "num" / "n.jsonl").string(), "{\"text\": \"a\"}\n{\"text\": 5}\n");
  o.inputs = {(f.dir / "num").string()};
  o.output = (f.dir / "num_out").string();
  EXPECT_NE(error_of([&] { convert_to_mds(o); }).find("n.jsonl:2: column 'text' is number, not a string"),
            std::string::npos);
  o.output = (f.dir / "raw").string();
  EXPECT_NE(error_of([&] { convert_to_mds(o); }).find("not empty"), std::string::npos);
}

}  // namespace
}  // namespace tessera::data
