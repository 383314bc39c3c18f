// Parquet, Arrow IPC and CSV rows through Apache Arrow C++ (records.h; the pyarrow wheel's libraries).
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

#include <algorithm>
#include <array>

#include "records_arrow.h"

namespace tessera::data::detail {
namespace {

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

std::unique_ptr<RecordFile> open_parquet_file(const std::string& path, const std::vector<std::string>& columns) {
  return std::make_unique<ParquetFile>(path, columns);
}

std::unique_ptr<RecordFile> open_arrow_file(const std::string& path, const std::vector<std::string>& columns) {
  return std::make_unique<ArrowIpcFile>(path, columns);
}

std::unique_ptr<RecordFile> open_csv_file(const std::string& path, const std::vector<std::string>& columns) {
  return std::make_unique<CsvFile>(path, columns);
}

}  // namespace tessera::data::detail
