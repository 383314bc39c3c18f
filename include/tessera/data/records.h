// Rows of dataset files, read in order a batch at a time with bounded memory: JSON lines and JSON arrays (plain, gzip
// or zstd), Parquet, Arrow IPC (the file and the stream format: what Hugging Face `datasets` caches and
// `save_to_disk` write), CSV (plain, gzip or zstd), plain text files and fortune files. Parquet, Arrow and CSV are
// read with Apache Arrow C++ (the libraries the pinned `pyarrow` wheel ships; docs/data.md#readers). Every row is a
// JSON object, column name -> value, with Hugging Face `datasets`' conversions: strings, numbers, booleans, nulls,
// lists and structs as themselves; binary columns as byte strings; other Arrow types (dates, timestamps, decimals)
// as their text. `s3://` inputs are fetched one file at a time through the storage layer.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tessera::data {

using Record = nlohmann::ordered_json;

enum class RecordFormat {
  kJsonl,     // one JSON object per line (a file whose first non-blank character is '[' is read as a JSON array)
  kParquet,   // Parquet
  kArrow,     // Arrow IPC, file ("ARROW1" magic) or stream format
  kCsv,       // CSV with a header row; types inferred, empty and NA-like fields null (as pandas reads them)
  kText,      // one row per file: {"text": contents}
  kFortunes,  // fortune(6) files: {"text": document} per document separated by lines holding only "%"
};

// "jsonl" (also "json"), "parquet", "arrow", "csv", "text", "fortunes"; anything else is a ConfigError naming it.
RecordFormat parse_record_format(const std::string& name);
const char* record_format_name(RecordFormat format);
// The format a file's name says (.jsonl/.json/.ndjson, .parquet, .arrow, .csv, .txt; a .gz, .zst or .zstd suffix is
// looked through); nullopt for other names.
std::optional<RecordFormat> record_format_of(const std::string& path);

// One file's rows in order. Memory: one Arrow record batch (Parquet: of the selected columns) or one read buffer of
// a compressed text file, plus the rows asked for.
class RecordFile {
 public:
  // `columns`: only these columns are needed (Parquet and Arrow then read only them; rows keep every column for the
  // other formats); a named column the file lacks is an error naming the file. Errors are tessera::Error naming the
  // file (and the line or row).
  static std::unique_ptr<RecordFile> open(const std::string& path, RecordFormat format,
                                          const std::vector<std::string>& columns = {});
  virtual ~RecordFile() = default;

  // Appends up to `max` rows to `out`; returns how many (0 at the end of the file).
  virtual size_t read(std::vector<Record>& out, size_t max) = 0;
  // Skips up to `n` rows without converting them where the format allows; returns how many were skipped.
  virtual int64_t skip(int64_t n);
  // Where row `row` (0-based, counted over the rows read) is, for errors: "file:line" or "file[row]".
  virtual std::string where(int64_t row) const;
  // Rows in the file when the format records it (Parquet, Arrow files); nullopt otherwise.
  virtual std::optional<int64_t> rows() const { return std::nullopt; }
  // Bytes of the file on disk consumed so far (compressed bytes for compressed files), and the file's size.
  virtual uint64_t bytes_read() const = 0;
  uint64_t file_bytes() const { return file_bytes_; }
  const std::string& path() const { return path_; }

 protected:
  std::string path_;
  uint64_t file_bytes_ = 0;
};

// The files of `inputs` in order: a file as itself; a directory searched recursively, files in sorted path order,
// taking those `format` (or, with nullopt, any known format) reads and skipping hidden files and `datasets`' metadata
// (dataset_info.json, state.json, *.lock); `s3://` prefixes listed through the storage layer. A missing input is an
// error naming it.
std::vector<std::string> expand_record_inputs(const std::vector<std::string>& inputs,
                                              std::optional<RecordFormat> format);

// The rows of several files, one after another. A file's format is `format`, or else what its name says.
class RecordStream {
 public:
  RecordStream(std::vector<std::string> files, std::optional<RecordFormat> format,
               std::vector<std::string> columns = {});
  ~RecordStream();
  // Appends up to `max` rows; 0 at the end of the last file.
  size_t read(std::vector<Record>& out, size_t max);
  // Skips `n` rows (resuming); an error if the files hold fewer.
  void skip(int64_t n);
  // Rows read or skipped so far, and where the last row read came from (for errors).
  int64_t position() const { return position_; }
  std::string where(int64_t row_in_stream) const;
  // Bytes consumed over all files so far, and the total of the files' sizes (0 for remote inputs not yet fetched).
  uint64_t bytes_read() const;
  uint64_t total_bytes() const { return total_bytes_; }
  const std::vector<std::string>& files() const { return files_; }

 private:
  bool open_next();
  std::vector<std::string> files_;
  std::optional<RecordFormat> format_;
  std::vector<std::string> columns_;
  size_t next_file_ = 0;
  std::unique_ptr<RecordFile> current_;
  int64_t current_start_ = 0;  // stream position of the current file's first row
  int64_t position_ = 0;
  uint64_t done_bytes_ = 0, total_bytes_ = 0;
  std::optional<std::filesystem::path> fetched_;  // local copy of a remote file, removed when done
};

}  // namespace tessera::data
