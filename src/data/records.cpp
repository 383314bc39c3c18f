// Row readers for JSON lines / JSON arrays, text and fortune files, and the public entry points (records.h); the
// Arrow-backed readers (Parquet, Arrow IPC, CSV) are in records_arrow.cpp.
#include "tessera/data/records.h"

#include <fmt/format.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>

#include "records_arrow.h"
#include "tessera/storage/storage.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;
constexpr const char* kRecordsComponent = "records";

using detail::fail_records;

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

}  // namespace

void detail::fail_records(const std::string& where, const std::string& what) {
  throw Error(kRecordsComponent, fmt::format("{}: {}", where, what));
}

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
      f = detail::open_parquet_file(path, columns);
      break;
    case RecordFormat::kArrow:
      f = detail::open_arrow_file(path, columns);
      break;
    case RecordFormat::kCsv:
      f = detail::open_csv_file(path, columns);
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
