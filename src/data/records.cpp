// Row readers for JSON lines / JSON arrays, Parquet, Arrow IPC, CSV, text and fortune files (records.h).
#include "tessera/data/records.h"

#include <arrow/api.h>
#include <arrow/csv/api.h>
#include <arrow/io/api.h>
#include <arrow/io/compressed.h>
#include <arrow/ipc/api.h>
#include <arrow/util/compression.h>
#include <fmt/format.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/exception.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>

#include "tessera/storage/storage.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;
constexpr const char* kRecordsComponent = "records";

[[noreturn]] void fail_records(const std::string& where, const std::string& what) {
  throw Error(kRecordsComponent, fmt::format("{}: {}", where, what));
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string strip_compression_suffix(const std::string& name) {
  for (const char* s : {".gz", ".zst", ".zstd"}) {
    if (ends_with(name, s)) return name.substr(0, name.size() - std::strlen(s));
  }
  return name;
}

// ---------------------------------------------------------------------------------------------------------------
// Bytes of a file, decompressed when it starts with a gzip or zstd magic number.

class ByteSource {
 public:
  explicit ByteSource(const std::string& path) : path_(path) {
    file_ = std::fopen(path.c_str(), "rb");
    if (file_ == nullptr) fail_records(path, fmt::format("cannot open: {}", std::strerror(errno)));
    std::array<unsigned char, 4> magic{};
    const size_t got = std::fread(magic.data(), 1, magic.size(), file_);
    std::rewind(file_);
    if (got >= 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
      std::fclose(file_);
      file_ = nullptr;
      gz_ = gzopen(path.c_str(), "rb");
      if (gz_ == nullptr) fail_records(path, "cannot open as gzip");
      gzbuffer(gz_, 1 << 20);
    } else if (got == 4 && magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f && magic[3] == 0xfd) {
      zstd_ = ZSTD_createDStream();
      in_.resize(ZSTD_DStreamInSize());
    }
  }
  ~ByteSource() {
    if (file_ != nullptr) std::fclose(file_);
    if (gz_ != nullptr) gzclose(gz_);
    if (zstd_ != nullptr) ZSTD_freeDStream(zstd_);
  }
  ByteSource(const ByteSource&) = delete;
  ByteSource& operator=(const ByteSource&) = delete;

  // Reads up to n bytes; 0 at the end.
  size_t read(char* out, size_t n) {
    if (gz_ != nullptr) {
      const int got = gzread(gz_, out, static_cast<unsigned>(std::min<size_t>(n, 1 << 30)));
      if (got < 0) {
        int code = 0;
        fail_records(path_, fmt::format("corrupt gzip data: {}", gzerror(gz_, &code)));
      }
      return static_cast<size_t>(got);
    }
    if (zstd_ == nullptr) {
      const size_t got = std::fread(out, 1, n, file_);
      consumed_ += got;
      if (got < n && std::ferror(file_)) fail_records(path_, "read error");
      return got;
    }
    ZSTD_outBuffer ob{out, n, 0};
    while (ob.pos == 0) {
      if (ib_.pos == ib_.size) {
        const size_t got = std::fread(in_.data(), 1, in_.size(), file_);
        consumed_ += got;
        if (got == 0) {
          if (frame_open_) fail_records(path_, "truncated zstd data");
          return 0;
        }
        ib_ = ZSTD_inBuffer{in_.data(), got, 0};
      }
      const size_t r = ZSTD_decompressStream(zstd_, &ob, &ib_);
      if (ZSTD_isError(r)) fail_records(path_, fmt::format("corrupt zstd data: {}", ZSTD_getErrorName(r)));
      frame_open_ = r != 0;
    }
    return ob.pos;
  }
  uint64_t consumed() const {
    if (gz_ != nullptr) return static_cast<uint64_t>(std::max<z_off_t>(0, gzoffset(gz_)));
    return consumed_;
  }

 private:
  std::string path_;
  FILE* file_ = nullptr;
  gzFile gz_ = nullptr;
  ZSTD_DStream* zstd_ = nullptr;
  std::vector<char> in_;
  ZSTD_inBuffer ib_{nullptr, 0, 0};
  bool frame_open_ = false;
  uint64_t consumed_ = 0;
};

// Lines of a ByteSource ('\n'-terminated; a final line without one counts).
class LineSource {
 public:
  explicit LineSource(const std::string& path) : src_(path), buf_(1 << 20) {}
  // The next line without its '\n' (valid until the next call); false at the end.
  bool next(std::string_view& line) {
    for (;;) {
      const char* nl = static_cast<const char*>(std::memchr(buf_.data() + begin_, '\n', end_ - begin_));
      if (nl != nullptr) {
        line = std::string_view(buf_.data() + begin_, nl - (buf_.data() + begin_));
        begin_ = static_cast<size_t>(nl - buf_.data()) + 1;
        return true;
      }
      if (eof_) {
        if (begin_ == end_) return false;
        line = std::string_view(buf_.data() + begin_, end_ - begin_);
        begin_ = end_;
        return true;
      }
      if (begin_ > 0) {  // keep the partial line, then fill
        std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
        end_ -= begin_;
        begin_ = 0;
      }
      if (end_ == buf_.size()) buf_.resize(buf_.size() * 2);  // a line longer than the buffer
      const size_t got = src_.read(buf_.data() + end_, buf_.size() - end_);
      if (got == 0) eof_ = true;
      end_ += got;
    }
  }
  uint64_t consumed() const { return src_.consumed(); }

 private:
  ByteSource src_;
  std::vector<char> buf_;
  size_t begin_ = 0, end_ = 0;
  bool eof_ = false;
};

std::string read_whole(const std::string& path) {
  ByteSource src(path);
  std::string out;
  std::vector<char> buf(1 << 20);
  for (size_t got; (got = src.read(buf.data(), buf.size())) > 0;) out.append(buf.data(), got);
  return out;
}

void check_columns(const Record& row, const std::vector<std::string>& columns, const std::string& where) {
  for (const std::string& c : columns) {
    if (!row.contains(c)) fail_records(where, fmt::format("no column '{}'", c));
  }
}

// ---------------------------------------------------------------------------------------------------------------
// JSON lines (or one JSON array).

class JsonlFile : public RecordFile {
 public:
  JsonlFile(const std::string& path, std::vector<std::string> columns) : lines_(path), columns_(std::move(columns)) {
    path_ = path;
  }
  size_t read(std::vector<Record>& out, size_t max) override {
    size_t n = 0;
    if (array_) return read_array(out, max);
    rows_before_ += static_cast<int64_t>(line_of_.size());  // line numbers are kept for the last read's rows
    line_of_.clear();
    std::string_view line;
    while (n < max && lines_.next(line)) {
      ++line_no_;
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      if (first_) {
        first_ = false;
        if (line[line.find_first_not_of(" \t\r")] == '[') return start_array(line, out, max);
      }
      Record row;
      try {
        row = Record::parse(line);
      } catch (const Record::exception& e) {
        fail_records(fmt::format("{}:{}", path_, line_no_), fmt::format("malformed JSON line: {}", e.what()));
      }
      if (!row.is_object()) {
        fail_records(fmt::format("{}:{}", path_, line_no_),
                     fmt::format("expected a JSON object, not {}", row.type_name()));
      }
      check_columns(row, columns_, fmt::format("{}:{}", path_, line_no_));
      out.push_back(std::move(row));
      line_of_.push_back(line_no_);
      ++n;
    }
    return n;
  }
  std::string where(int64_t row) const override {
    if (array_) return fmt::format("{}[{}]", path_, row);
    const int64_t first = rows_before_;
    if (row >= first && row - first < static_cast<int64_t>(line_of_.size())) {
      return fmt::format("{}:{}", path_, line_of_[static_cast<size_t>(row - first)]);
    }
    return fmt::format("{}, row {}", path_, row);
  }
  uint64_t bytes_read() const override { return lines_.consumed(); }
  int64_t skip(int64_t n) override {
    int64_t done = 0;
    if (first_ && n > 0) {  // the first row says whether this is a JSON array
      std::vector<Record> one;
      done = static_cast<int64_t>(read(one, 1));
      if (done == 0) return 0;
    }
    if (array_) return done + RecordFile::skip(n - done);
    std::string_view line;
    const int64_t scanned_from = done;
    while (done < n && lines_.next(line)) {
      ++line_no_;
      if (line.find_first_not_of(" \t\r") != std::string_view::npos) ++done;
    }
    rows_before_ += done - scanned_from;
    return done;
  }

 private:
  size_t start_array(std::string_view first_line, std::vector<Record>& out, size_t max) {
    std::string text(first_line);
    text += '\n';
    std::string_view line;
    while (lines_.next(line)) {
      text.append(line);
      text += '\n';
    }
    try {
      doc_ = Record::parse(text);
    } catch (const Record::exception& e) {
      fail_records(path_, fmt::format("malformed JSON: {}", e.what()));
    }
    array_ = true;
    return read_array(out, max);
  }
  size_t read_array(std::vector<Record>& out, size_t max) {
    size_t n = 0;
    for (; n < max && at_ < doc_.size(); ++at_, ++n) {
      const std::string where = fmt::format("{}[{}]", path_, at_);
      if (!doc_[at_].is_object()) fail_records(where, fmt::format("expected an object, not {}", doc_[at_].type_name()));
      check_columns(doc_[at_], columns_, where);
      out.push_back(std::move(doc_[at_]));
    }
    return n;
  }
  LineSource lines_;
  std::vector<std::string> columns_;
  int64_t line_no_ = 0, rows_before_ = 0;
  std::vector<int64_t> line_of_;
  bool first_ = true, array_ = false;
  Record doc_;
  size_t at_ = 0;
};

// ---------------------------------------------------------------------------------------------------------------
// Text and fortunes.

class TextFile : public RecordFile {
 public:
  TextFile(const std::string& path, bool fortunes) : fortunes_(fortunes) {
    path_ = path;
    const std::string text = read_whole(path);
    consumed_ = file_bytes_ = fs::file_size(path);
    if (!fortunes) {
      if (!text.empty()) docs_.push_back(text);  // an empty file holds no document
      return;
    }
    std::string doc;
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t eol = text.find('\n', pos);
      const size_t next = eol == std::string::npos ? text.size() : eol + 1;
      std::string_view line(text.data() + pos, (eol == std::string::npos ? text.size() : eol) - pos);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line == "%") {
        if (!doc.empty()) docs_.push_back(std::move(doc));
        doc.clear();
      } else {
        doc.append(text, pos, next - pos);
      }
      pos = next;
    }
    if (!doc.empty()) docs_.push_back(std::move(doc));
  }
  size_t read(std::vector<Record>& out, size_t max) override {
    size_t n = 0;
    for (; n < max && at_ < docs_.size(); ++at_, ++n) out.push_back(Record{{"text", std::move(docs_[at_])}});
    return n;
  }
  std::string where(int64_t row) const override {
    return fortunes_ ? fmt::format("{}, document {}", path_, row + 1) : path_;
  }
  uint64_t bytes_read() const override { return at_ == docs_.size() ? consumed_ : 0; }

 private:
  bool fortunes_;
  std::vector<std::string> docs_;
  size_t at_ = 0;
  uint64_t consumed_ = 0;
};

// ---------------------------------------------------------------------------------------------------------------
// Arrow-backed formats: rows converted from record batches.

// Names a row in errors without formatting it for every row read.
struct RowPlace {
  const std::string& path;
  int64_t row;
  std::string str() const { return fmt::format("{}[{}]", path, row); }
};

Record arrow_value(const arrow::Array& a, int64_t i, const RowPlace& where);

Record arrow_list(const arrow::Array& values, int64_t begin, int64_t end, const RowPlace& where) {
  Record list = Record::array();
  for (int64_t k = begin; k < end; ++k) list.push_back(arrow_value(values, k, where));
  return list;
}

Record arrow_value(const arrow::Array& a, int64_t i, const RowPlace& where) {
  if (a.IsNull(i)) return nullptr;
  switch (a.type_id()) {
    case arrow::Type::NA:
      return nullptr;
    case arrow::Type::BOOL:
      return static_cast<const arrow::BooleanArray&>(a).Value(i);
    case arrow::Type::INT8:
      return static_cast<const arrow::Int8Array&>(a).Value(i);
    case arrow::Type::INT16:
      return static_cast<const arrow::Int16Array&>(a).Value(i);
    case arrow::Type::INT32:
      return static_cast<const arrow::Int32Array&>(a).Value(i);
    case arrow::Type::INT64:
      return static_cast<const arrow::Int64Array&>(a).Value(i);
    case arrow::Type::UINT8:
      return static_cast<const arrow::UInt8Array&>(a).Value(i);
    case arrow::Type::UINT16:
      return static_cast<const arrow::UInt16Array&>(a).Value(i);
    case arrow::Type::UINT32:
      return static_cast<const arrow::UInt32Array&>(a).Value(i);
    case arrow::Type::UINT64:
      return static_cast<const arrow::UInt64Array&>(a).Value(i);
    case arrow::Type::FLOAT:
      return static_cast<double>(static_cast<const arrow::FloatArray&>(a).Value(i));
    case arrow::Type::DOUBLE:
      return static_cast<const arrow::DoubleArray&>(a).Value(i);
    case arrow::Type::STRING:
    case arrow::Type::BINARY:
      return std::string(static_cast<const arrow::BinaryArray&>(a).GetView(i));
    case arrow::Type::LARGE_STRING:
    case arrow::Type::LARGE_BINARY:
      return std::string(static_cast<const arrow::LargeBinaryArray&>(a).GetView(i));
    case arrow::Type::STRING_VIEW:
    case arrow::Type::BINARY_VIEW:
      return std::string(static_cast<const arrow::BinaryViewArray&>(a).GetView(i));
    case arrow::Type::LIST: {
      const auto& l = static_cast<const arrow::ListArray&>(a);
      return arrow_list(*l.values(), l.value_offset(i), l.value_offset(i) + l.value_length(i), where);
    }
    case arrow::Type::LARGE_LIST: {
      const auto& l = static_cast<const arrow::LargeListArray&>(a);
      return arrow_list(*l.values(), l.value_offset(i), l.value_offset(i) + l.value_length(i), where);
    }
    case arrow::Type::FIXED_SIZE_LIST: {
      const auto& l = static_cast<const arrow::FixedSizeListArray&>(a);
      return arrow_list(*l.values(), l.value_offset(i), l.value_offset(i) + l.value_length(i), where);
    }
    case arrow::Type::STRUCT: {
      const auto& s = static_cast<const arrow::StructArray&>(a);
      Record obj = Record::object();
      for (int f = 0; f < s.num_fields(); ++f) {
        obj[s.struct_type()->field(f)->name()] = arrow_value(*s.field(f), i, where);
      }
      return obj;
    }
    case arrow::Type::DICTIONARY: {
      const auto& d = static_cast<const arrow::DictionaryArray&>(a);
      return arrow_value(*d.dictionary(), d.GetValueIndex(i), where);
    }
    default: {
      auto scalar = a.GetScalar(i);
      if (!scalar.ok()) fail_records(where.str(), scalar.status().ToString());
      return (*scalar)->ToString();
    }
  }
}

template <typename T>
T arrow_ok(arrow::Result<T> r, const std::string& where) {
  if (!r.ok()) fail_records(where, r.status().ToString());
  return std::move(r).ValueUnsafe();
}

void arrow_check(const arrow::Status& s, const std::string& where) {
  if (!s.ok()) fail_records(where, s.ToString());
}

class ArrowRowsFile : public RecordFile {
 public:
  size_t read(std::vector<Record>& out, size_t max) override {
    size_t n = 0;
    while (n < max) {
      if (!batch_ || at_ == batch_->num_rows()) {
        if (!next_batch()) break;
        continue;
      }
      const auto& schema = *batch_->schema();
      for (; n < max && at_ < batch_->num_rows(); ++at_, ++n, ++row_) {
        Record obj = Record::object();
        for (int c = 0; c < batch_->num_columns(); ++c) {
          obj[schema.field(c)->name()] = arrow_value(*batch_->column(c), at_, RowPlace{path_, row_});
        }
        out.push_back(std::move(obj));
      }
    }
    return n;
  }
  int64_t skip(int64_t n) override {
    int64_t done = 0;
    while (done < n) {
      if (!batch_ || at_ == batch_->num_rows()) {
        if (!next_batch()) break;
        continue;
      }
      const int64_t k = std::min(n - done, batch_->num_rows() - at_);
      at_ += k;
      row_ += k;
      done += k;
    }
    return done;
  }
  std::string where(int64_t row) const override { return fmt::format("{}[{}]", path_, row); }

 protected:
  // Sets batch_ to the next non-empty record batch; false at the end.
  virtual bool next_batch() = 0;
  void check_schema(const arrow::Schema& schema, const std::vector<std::string>& columns) const {
    for (const std::string& c : columns) {
      if (schema.GetFieldIndex(c) < 0) {
        fail_records(path_, fmt::format("no column '{}' (columns: {})", c, fmt::join(schema.field_names(), ", ")));
      }
    }
  }
  std::shared_ptr<arrow::RecordBatch> batch_;
  int64_t at_ = 0, row_ = 0;
};

class RecordBatchReaderFile : public ArrowRowsFile {
 protected:
  bool next_batch() override {
    for (;;) {
      std::shared_ptr<arrow::RecordBatch> b;
      arrow_check(reader_->ReadNext(&b), path_);
      if (!b) return false;
      if (b->num_rows() == 0) continue;
      batch_ = std::move(b);
      at_ = 0;
      return true;
    }
  }
  std::shared_ptr<arrow::RecordBatchReader> reader_;
};

class ParquetFile : public RecordBatchReaderFile {
 public:
  ParquetFile(const std::string& path, const std::vector<std::string>& columns) {
    path_ = path;
    auto input = arrow_ok(arrow::io::ReadableFile::Open(path), path);
    file_ = input;
    file_bytes_ = static_cast<uint64_t>(arrow_ok(input->GetSize(), path));
    parquet::ArrowReaderProperties props;
    props.set_batch_size(1024);
    props.set_use_threads(false);
    parquet::arrow::FileReaderBuilder builder;
    try {
      arrow_check(builder.Open(input), path);
      builder.properties(props);
      arrow_check(builder.Build(&reader_parquet_), path);
    } catch (const parquet::ParquetException& e) {
      fail_records(path, fmt::format("not a readable Parquet file: {}", e.what()));
    }
    std::shared_ptr<arrow::Schema> schema;
    arrow_check(reader_parquet_->GetSchema(&schema), path);
    check_schema(*schema, columns);
    std::vector<int> row_groups(static_cast<size_t>(reader_parquet_->num_row_groups()));
    for (size_t g = 0; g < row_groups.size(); ++g) row_groups[g] = static_cast<int>(g);
    rows_ = reader_parquet_->parquet_reader()->metadata()->num_rows();
    if (columns.empty()) {
      reader_ = arrow_ok(reader_parquet_->GetRecordBatchReader(row_groups), path);
    } else {
      std::vector<int> leaves;
      const auto& fields = reader_parquet_->manifest().schema_fields;
      for (const std::string& c : columns)
        collect_leaves(fields[static_cast<size_t>(schema->GetFieldIndex(c))], leaves);
      reader_ = arrow_ok(reader_parquet_->GetRecordBatchReader(row_groups, leaves), path);
    }
  }
  std::optional<int64_t> rows() const override { return rows_; }
  uint64_t bytes_read() const override {
    return rows_ == 0 ? file_bytes_ : static_cast<uint64_t>(static_cast<double>(file_bytes_) * row_ / rows_);
  }

 private:
  static void collect_leaves(const parquet::arrow::SchemaField& f, std::vector<int>& out) {
    if (f.is_leaf()) out.push_back(f.column_index);
    for (const auto& child : f.children) collect_leaves(child, out);
  }
  std::shared_ptr<arrow::io::RandomAccessFile> file_;
  std::unique_ptr<parquet::arrow::FileReader> reader_parquet_;
  int64_t rows_ = 0;
};

class ArrowIpcFile : public RecordBatchReaderFile {
 public:
  ArrowIpcFile(const std::string& path, const std::vector<std::string>& columns) {
    path_ = path;
    auto input = arrow_ok(arrow::io::ReadableFile::Open(path), path);
    file_ = input;
    file_bytes_ = static_cast<uint64_t>(arrow_ok(input->GetSize(), path));
    std::array<char, 6> magic{};
    const int64_t got = arrow_ok(input->ReadAt(0, 6, magic.data()), path);
    // Both formats: open once without projection to learn the schema, then with the wanted fields.
    const bool file_format = got == 6 && std::string_view(magic.data(), 6) == "ARROW1";
    auto options = arrow::ipc::IpcReadOptions::Defaults();
    options.use_threads = false;
    std::shared_ptr<arrow::Schema> schema;
    if (file_format) {
      file_reader_ = arrow_ok(arrow::ipc::RecordBatchFileReader::Open(input, options), path);
      schema = file_reader_->schema();
      rows_ = arrow_ok(file_reader_->CountRows(), path);
    } else {
      arrow_check(input->Seek(0), path);  // ReadAt above leaves the stream position unset
      schema = arrow_ok(arrow::ipc::RecordBatchStreamReader::Open(input, options), path)->schema();
    }
    check_schema(*schema, columns);
    for (const std::string& c : columns) options.included_fields.push_back(schema->GetFieldIndex(c));
    std::sort(options.included_fields.begin(), options.included_fields.end());
    if (file_format) {
      file_reader_ = arrow_ok(arrow::ipc::RecordBatchFileReader::Open(input, options), path);
    } else {
      arrow_check(input->Seek(0), path);
      reader_ = arrow_ok(arrow::ipc::RecordBatchStreamReader::Open(input, options), path);
    }
  }
  std::optional<int64_t> rows() const override { return rows_; }
  uint64_t bytes_read() const override {
    if (rows_)
      return *rows_ == 0 ? file_bytes_ : static_cast<uint64_t>(static_cast<double>(file_bytes_) * row_ / *rows_);
    return static_cast<uint64_t>(std::max<int64_t>(0, file_->Tell().ValueOr(0)));
  }

 protected:
  bool next_batch() override {
    if (!file_reader_) return RecordBatchReaderFile::next_batch();
    while (next_index_ < file_reader_->num_record_batches()) {
      batch_ = arrow_ok(file_reader_->ReadRecordBatch(next_index_++), path_);
      at_ = 0;
      if (batch_->num_rows() > 0) return true;
    }
    return false;
  }

 private:
  std::shared_ptr<arrow::io::ReadableFile> file_;
  std::shared_ptr<arrow::ipc::RecordBatchFileReader> file_reader_;
  int next_index_ = 0;
  std::optional<int64_t> rows_;
};

class CsvFile : public RecordBatchReaderFile {
 public:
  CsvFile(const std::string& path, const std::vector<std::string>& columns) {
    path_ = path;
    auto raw = arrow_ok(arrow::io::ReadableFile::Open(path), path);
    raw_ = raw;
    file_bytes_ = static_cast<uint64_t>(arrow_ok(raw->GetSize(), path));
    std::shared_ptr<arrow::io::InputStream> input = raw;
    std::array<unsigned char, 4> magic{};
    const int64_t got = arrow_ok(raw->ReadAt(0, 4, magic.data()), path);
    arrow_check(raw->Seek(0), path);
    std::optional<arrow::Compression::type> codec;
    if (got >= 2 && magic[0] == 0x1f && magic[1] == 0x8b) codec = arrow::Compression::GZIP;
    if (got == 4 && magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f && magic[3] == 0xfd) {
      codec = arrow::Compression::ZSTD;
    }
    if (codec) {
      codec_ = arrow_ok(arrow::util::Codec::Create(*codec), path);
      input = arrow_ok(arrow::io::CompressedInputStream::Make(codec_.get(), raw), path);
    }
    auto read = arrow::csv::ReadOptions::Defaults();
    read.use_threads = false;
    read.block_size = 1 << 22;
    auto convert = arrow::csv::ConvertOptions::Defaults();
    convert.strings_can_be_null = true;  // pandas: empty and NA-like fields are missing values
    auto parse = arrow::csv::ParseOptions::Defaults();
    parse.newlines_in_values = true;  // quoted fields may hold line breaks (pandas reads them so)
    reader_ =
        arrow_ok(arrow::csv::StreamingReader::Make(arrow::io::default_io_context(), input, read, parse, convert), path);
    check_schema(*reader_->schema(), columns);
  }
  uint64_t bytes_read() const override { return static_cast<uint64_t>(std::max<int64_t>(0, raw_->Tell().ValueOr(0))); }

 private:
  std::shared_ptr<arrow::io::ReadableFile> raw_;
  std::unique_ptr<arrow::util::Codec> codec_;
};

}  // namespace

RecordFormat parse_record_format(const std::string& name) {
  if (name == "jsonl" || name == "json") return RecordFormat::kJsonl;
  if (name == "parquet") return RecordFormat::kParquet;
  if (name == "arrow") return RecordFormat::kArrow;
  if (name == "csv") return RecordFormat::kCsv;
  if (name == "text") return RecordFormat::kText;
  if (name == "fortunes") return RecordFormat::kFortunes;
  throw ConfigError(
      kRecordsComponent,
      fmt::format("unknown format \"{}\" (expected jsonl, json, parquet, arrow, csv, text or fortunes)", name));
}

const char* record_format_name(RecordFormat format) {
  switch (format) {
    case RecordFormat::kJsonl:
      return "jsonl";
    case RecordFormat::kParquet:
      return "parquet";
    case RecordFormat::kArrow:
      return "arrow";
    case RecordFormat::kCsv:
      return "csv";
    case RecordFormat::kText:
      return "text";
    case RecordFormat::kFortunes:
      return "fortunes";
  }
  return "?";
}

std::optional<RecordFormat> record_format_of(const std::string& path) {
  const std::string name = strip_compression_suffix(fs::path(path).filename().string());
  if (ends_with(name, ".jsonl") || ends_with(name, ".json") || ends_with(name, ".ndjson")) return RecordFormat::kJsonl;
  if (ends_with(name, ".parquet")) return RecordFormat::kParquet;
  if (ends_with(name, ".arrow")) return RecordFormat::kArrow;
  if (ends_with(name, ".csv")) return RecordFormat::kCsv;
  if (ends_with(name, ".txt")) return RecordFormat::kText;
  return std::nullopt;
}

int64_t RecordFile::skip(int64_t n) {
  std::vector<Record> sink;
  int64_t done = 0;
  while (done < n) {
    sink.clear();
    const size_t got = read(sink, static_cast<size_t>(std::min<int64_t>(n - done, 4096)));
    if (got == 0) break;
    done += static_cast<int64_t>(got);
  }
  return done;
}

std::string RecordFile::where(int64_t row) const {
  return fmt::format("{}[{}]", path_, row);
}

std::unique_ptr<RecordFile> RecordFile::open(const std::string& path, RecordFormat format,
                                             const std::vector<std::string>& columns) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) fail_records(path, "no such file");
  std::unique_ptr<RecordFile> f;
  switch (format) {
    case RecordFormat::kJsonl:
      f = std::make_unique<JsonlFile>(path, columns);
      break;
    case RecordFormat::kParquet:
      f = std::make_unique<ParquetFile>(path, columns);
      break;
    case RecordFormat::kArrow:
      f = std::make_unique<ArrowIpcFile>(path, columns);
      break;
    case RecordFormat::kCsv:
      f = std::make_unique<CsvFile>(path, columns);
      break;
    case RecordFormat::kText:
    case RecordFormat::kFortunes:
      f = std::make_unique<TextFile>(path, format == RecordFormat::kFortunes);
      break;
  }
  if (f->file_bytes_ == 0) f->file_bytes_ = fs::file_size(path, ec);
  return f;
}

std::vector<std::string> expand_record_inputs(const std::vector<std::string>& inputs,
                                              std::optional<RecordFormat> format) {
  const auto wanted = [&](const std::string& path) {
    const std::string name = fs::path(path).filename().string();
    if (name.empty() || name[0] == '.') return false;
    if (name == "dataset_info.json" || name == "state.json" || name == "dataset_dict.json") return false;
    if (ends_with(name, ".lock") || ends_with(name, ".incomplete")) return false;
    if (!format) return record_format_of(path).has_value();
    switch (*format) {
      case RecordFormat::kFortunes:
        return !fs::path(name).has_extension();
      case RecordFormat::kText:
        return true;
      default:
        return record_format_of(path) == format;
    }
  };
  std::vector<std::string> files;
  for (const std::string& input : inputs) {
    if (storage::is_remote(input)) {
      const auto objects = storage::list(input);
      std::vector<std::string> found;
      for (const auto& o : objects) {
        if (o.uri == input || wanted(o.uri)) found.push_back(o.uri);
      }
      if (found.empty()) fail_records(input, "no such object or prefix (or none in a format Tessera reads)");
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
      continue;
    }
    std::error_code ec;
    if (fs::is_directory(input, ec)) {
      std::vector<std::string> found;
      for (auto it = fs::recursive_directory_iterator(input, fs::directory_options::follow_directory_symlink, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (it->is_regular_file(ec) && !it->is_symlink(ec) && wanted(it->path().string())) {
          found.push_back(it->path().string());
        }
      }
      if (ec) fail_records(input, fmt::format("cannot list: {}", ec.message()));
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::exists(input, ec)) {
      files.push_back(input);
    } else {
      fail_records(input, "no such file or directory");
    }
  }
  return files;
}

RecordStream::RecordStream(std::vector<std::string> files, std::optional<RecordFormat> format,
                           std::vector<std::string> columns)
    : files_(std::move(files)), format_(format), columns_(std::move(columns)) {
  for (const std::string& f : files_) {
    if (storage::is_remote(f)) continue;
    std::error_code ec;
    const auto size = fs::file_size(f, ec);
    if (!ec) total_bytes_ += size;
  }
}

RecordStream::~RecordStream() {
  current_.reset();
  if (fetched_) {
    std::error_code ec;
    fs::remove_all(fetched_->parent_path(), ec);
  }
}

bool RecordStream::open_next() {
  if (current_) done_bytes_ += current_->file_bytes();
  current_.reset();
  if (fetched_) {
    std::error_code ec;
    fs::remove_all(fetched_->parent_path(), ec);
    fetched_.reset();
  }
  if (next_file_ == files_.size()) return false;
  const std::string& name = files_[next_file_++];
  const std::optional<RecordFormat> format = format_ ? format_ : record_format_of(name);
  if (!format) {
    fail_records(name,
                 "unknown file type (name it .jsonl, .json, .parquet, .arrow, .csv or .txt, optionally .gz "
                 "or .zst; or give the format)");
  }
  std::string local = name;
  if (storage::is_remote(name)) {
    fetched_ = fs::path(util::make_temp_dir("tessera-records", kRecordsComponent)) / fs::path(name).filename();
    storage::download(name, fetched_->string());
    local = fetched_->string();
  }
  current_ = RecordFile::open(local, *format, columns_);
  current_start_ = position_;
  return true;
}

size_t RecordStream::read(std::vector<Record>& out, size_t max) {
  // Rows of one file per call, so that where() can name any of them.
  for (;;) {
    if (!current_ && !open_next()) return 0;
    const size_t got = current_->read(out, max);
    if (got > 0) {
      position_ += static_cast<int64_t>(got);
      return got;
    }
    if (!open_next()) return 0;
  }
}

void RecordStream::skip(int64_t n) {
  int64_t left = n;
  while (left > 0) {
    if (!current_ && !open_next()) break;
    const int64_t got = current_->skip(left);
    position_ += got;
    left -= got;
    if (left > 0 && !open_next()) break;
  }
  if (left > 0) {
    throw Error(kRecordsComponent,
                fmt::format("the inputs hold {} rows, fewer than the {} to skip (did they change?)", n - left, n));
  }
}

std::string RecordStream::where(int64_t row_in_stream) const {
  if (!current_) return "end of input";
  return current_->where(row_in_stream - current_start_);
}

uint64_t RecordStream::bytes_read() const {
  return done_bytes_ + (current_ ? current_->bytes_read() : 0);
}

}  // namespace tessera::data
