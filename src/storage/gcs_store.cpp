// gs://bucket/key: Google Cloud Storage through Arrow's GcsFileSystem, which is google-cloud-cpp's storage client in
// the pyarrow wheel Tessera already links (docs/storage.md says why it is used and what Tessera adds on top).
//
// Credentials, the first found (as Google's client libraries resolve them):
//   STORAGE_EMULATOR_HOST    an emulator (fake-gcs-server, gcp-storage-emulator): http, no credentials, as
//                            google-cloud-storage and gcsfs treat it;
//   GOOGLE_APPLICATION_CREDENTIALS  a service account's key file, or any other credential file Google's "application
//                            default credentials" accept (authorized user, external account / workload identity);
//   otherwise                gcloud's application default credentials file, then the metadata server.
// Access tokens are refreshed by google-cloud-cpp before they expire. TESSERA_GCS_ENDPOINT_URL points the client at
// another endpoint with the same credentials (Private Service Connect, a proxy); TESSERA_GCS_RETRY_LIMIT_S bounds
// the time one request is retried (default 60); TESSERA_GCS_PARALLELISM sets the ranged reads in flight per download
// (default 8; 1 reads one stream).
#include <arrow/buffer.h>
#include <arrow/filesystem/gcsfs.h>
#include <arrow/io/interfaces.h>
#include <arrow/result.h>
#include <arrow/status.h>
#include <arrow/util/io_util.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>

#include "backend.h"
#include "tessera/storage/aws_files.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"

namespace tessera::storage {
namespace {

constexpr const char* kGcsComponent = "gcs";
constexpr int64_t kPartBytes = int64_t{8} << 20;  // one read of a download

// "http://host:port/" -> {"http", "host:port"}.
std::pair<std::string, std::string> split_endpoint(std::string url, const std::string& fallback_scheme) {
  std::string scheme = fallback_scheme;
  for (const char* s : {"https", "http"}) {
    const std::string prefix = std::string(s) + "://";
    if (url.rfind(prefix, 0) == 0) {
      scheme = s;
      url.erase(0, prefix.size());
      break;
    }
  }
  while (!url.empty() && url.back() == '/') url.pop_back();
  return {scheme, url};
}

struct Client {
  std::shared_ptr<arrow::fs::GcsFileSystem> fs;
  int parallelism = 8;      // ranged reads in flight per object (TESSERA_GCS_PARALLELISM)
  std::string credentials;  // where they came from, for error messages; never the credentials themselves
};

Client make_client() {
  using arrow::fs::GcsOptions;
  Client c;
  GcsOptions options;
  if (const std::string emulator = aws::env("STORAGE_EMULATOR_HOST"); !emulator.empty()) {
    options = GcsOptions::Anonymous();
    std::tie(options.scheme, options.endpoint_override) = split_endpoint(emulator, "http");
    c.credentials = fmt::format("none (the emulator at STORAGE_EMULATOR_HOST={})", emulator);
  } else if (const std::string file = aws::env("GOOGLE_APPLICATION_CREDENTIALS"); !file.empty()) {
    const std::string text = util::read_file(file, kGcsComponent);
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      throw ConfigError(kGcsComponent,
                        fmt::format("GOOGLE_APPLICATION_CREDENTIALS={}: not a JSON credentials file", file));
    }
    const std::string type = j.value("type", "");
    options = type == "service_account" ? GcsOptions::FromServiceAccountCredentials(text) : GcsOptions::Defaults();
    c.credentials = fmt::format("GOOGLE_APPLICATION_CREDENTIALS={} ({})", file, type.empty() ? "no type" : type);
  } else {
    options = GcsOptions::Defaults();
    c.credentials = "application default credentials (gcloud's file, else the metadata server)";
  }
  if (const std::string endpoint = aws::env("TESSERA_GCS_ENDPOINT_URL"); !endpoint.empty()) {
    std::tie(options.scheme, options.endpoint_override) = split_endpoint(endpoint, "https");
  }
  double retry_limit = 60;
  if (const std::string v = aws::env("TESSERA_GCS_RETRY_LIMIT_S"); !v.empty()) {
    char* end = nullptr;
    retry_limit = std::strtod(v.c_str(), &end);
    if (end == v.c_str() || *end != '\0' || !(retry_limit > 0)) {
      throw ConfigError(kGcsComponent, fmt::format("TESSERA_GCS_RETRY_LIMIT_S={}: expected a positive number", v));
    }
  }
  options.retry_limit_seconds = retry_limit;
  if (const std::string v = aws::env("TESSERA_GCS_PARALLELISM"); !v.empty()) {
    char* end = nullptr;
    const long n = std::strtol(v.c_str(), &end, 10);  // NOLINT(google-runtime-int): strtol's type
    if (end == v.c_str() || *end != '\0' || n < 1 || n > 64) {
      throw ConfigError(kGcsComponent,
                        fmt::format("TESSERA_GCS_PARALLELISM={}: expected a whole number from 1 to 64", v));
    }
    c.parallelism = static_cast<int>(n);
  }
  auto made = arrow::fs::GcsFileSystem::Make(options);
  if (!made.ok()) throw Error(kGcsComponent, fmt::format("cannot create the client: {}", made.status().message()));
  c.fs = *std::move(made);
  return c;
}

// google-cloud-cpp's status as Arrow words it, without the retry policy's metadata.
std::string short_message(const arrow::Status& st) {
  std::string m = st.message();
  if (const size_t info = m.find(" error_info="); info != std::string::npos) m.erase(info);
  const std::string wrapper = "google::cloud::Status(";
  if (const size_t w = m.find(wrapper); w != std::string::npos) {
    m.erase(w, wrapper.size());
    if (!m.empty() && m.back() == ')') m.pop_back();
  }
  while (!m.empty() && (m.back() == ' ' || m.back() == '.')) m.pop_back();
  return m;
}

bool not_found(const arrow::Status& st) {
  return arrow::internal::ErrnoFromStatus(st) == ENOENT;
}

class GcsBackend final : public Backend {
 public:
  std::string get(const Uri& u) override {
    auto file = open(u, "GET");
    std::string out(static_cast<size_t>(size_of(*file, u)), '\0');
    read_parts(*file, u, out.size(), [&](int64_t offset, const arrow::Buffer& b) {
      std::memcpy(out.data() + offset, b.data(), static_cast<size_t>(b.size()));
    });
    return out;
  }

  std::string get_range(const Uri& u, uint64_t offset, uint64_t length) override {
    auto file = open(u, "GET");
    const int64_t size = size_of(*file, u);
    if (offset + length > static_cast<uint64_t>(size)) {
      throw Error(kGcsComponent,
                  fmt::format("{}: asked for {} bytes at {}, the object has {}", u.str(), length, offset, size));
    }
    auto b = check(file->ReadAt(static_cast<int64_t>(offset), static_cast<int64_t>(length)), u, "GET");
    if (static_cast<uint64_t>(b->size()) != length) {
      throw Error(kGcsComponent, fmt::format("{}: range {}+{} returned {} bytes", u.str(), offset, length, b->size()));
    }
    return b->ToString();
  }

  void download(const Uri& u, const std::string& local_path) override {
    auto file = open(u, "GET");  // pins the object's generation: a replaced object fails the download
    const int64_t size = size_of(*file, u);
    download_through_temporary(u.str(), local_path, [&](const DownloadWriter& write) {
      read_parts(*file, u, static_cast<uint64_t>(size), [&](int64_t offset, const arrow::Buffer& b) {
        write(static_cast<uint64_t>(offset),
              std::string_view(reinterpret_cast<const char*>(b.data()), static_cast<size_t>(b.size())));
      });
    });
  }

  // A resumable upload, which GCS publishes only when it is finalized: on close, after every byte was sent. Arrow's
  // stream finalizes also when it is destroyed, so nothing that can fail runs between the first write and the close
  // (upload_file maps the file instead of reading it in pieces). google-cloud-cpp retries each request; an upload
  // that still fails in a way a retry may mend (its session lost, say) is sent again whole, up to three times. The
  // object's size is then checked: google-cloud-cpp takes a finalized upload's answer without comparing it with what
  // it sent, and a server that finalizes a session on the status query after a failed last chunk (fake-gcs-server
  // answers `Content-Range: bytes */*` that way) publishes fewer bytes; such an upload is sent again too.
  void put_parts(const Uri& u, const std::vector<std::string_view>& parts) override {
    constexpr int kAttempts = 3;
    uint64_t size = 0;
    for (std::string_view p : parts) size += p.size();
    std::string last;
    for (int attempt = 1; attempt <= kAttempts; ++attempt) {
      if (attempt > 1) util::backoff_sleep(attempt - 1, 1.0, 8.0);
      const arrow::Status st = upload_once(u, parts);
      if (!st.ok()) {
        if (not_found(st) || permanent(st)) check(st, u, "PUT");  // throws
        last = short_message(st);
        continue;
      }
      const auto info = check(client().fs->GetFileInfo(path(u)), u, "HEAD");
      const uint64_t published = info.type() == arrow::fs::FileType::File ? static_cast<uint64_t>(info.size()) : 0;
      if (published == size) return;
      last = fmt::format("sent {} bytes, and GCS published {}", size, published);
    }
    throw Error(kGcsComponent, fmt::format("{}: PUT failed {} times, the last: {} (credentials: {})", u.str(),
                                           kAttempts, last, client().credentials));
  }

  arrow::Status upload_once(const Uri& u, const std::vector<std::string_view>& parts) {
    ARROW_ASSIGN_OR_RAISE(auto out, client().fs->OpenOutputStream(path(u), /*metadata=*/nullptr));
    for (std::string_view p : parts) {
      if (!p.empty()) ARROW_RETURN_NOT_OK(out->Write(p.data(), static_cast<int64_t>(p.size())));
    }
    return out->Close();
  }

  // A refusal no retry mends: credentials, permissions, a bad request.
  static bool permanent(const arrow::Status& st) {
    const std::string& m = st.message();
    for (const char* code : {"PERMISSION_DENIED", "UNAUTHENTICATED", "INVALID_ARGUMENT", "FAILED_PRECONDITION"}) {
      if (m.find(code) != std::string::npos) return true;
    }
    return false;
  }

  void upload_file(const std::string& local_path, const Uri& u) override {
    const MappedFile file(local_path, kGcsComponent);
    put_parts(u, {file.bytes()});
  }

  // Arrow lists folders; a key prefix ("runs/ep1-" ) is listed as its folder ("runs/") and filtered.
  std::vector<ObjectInfo> list(const Uri& prefix) override {
    arrow::fs::FileSelector sel;
    const size_t slash = prefix.key.rfind('/');
    const std::string folder = slash == std::string::npos ? "" : prefix.key.substr(0, slash);
    sel.base_dir = folder.empty() ? prefix.bucket : prefix.bucket + "/" + folder;
    sel.recursive = true;
    sel.allow_not_found = true;
    const auto infos = check(client().fs->GetFileInfo(sel), prefix, "LIST");
    std::vector<ObjectInfo> out;
    const std::string head = prefix.bucket + "/" + prefix.key;
    for (const auto& i : infos) {
      if (i.type() != arrow::fs::FileType::File || i.path().rfind(head, 0) != 0) continue;
      out.push_back({"gs://" + i.path(), static_cast<uint64_t>(i.size()), ""});
    }
    return out;
  }

  void remove(const Uri& u) override {
    const arrow::Status st = client().fs->DeleteFile(path(u));
    if (!st.ok() && !not_found(st)) check(st, u, "DELETE");
  }

  std::optional<ObjectInfo> stat(const Uri& u) override {
    const auto info = check(client().fs->GetFileInfo(path(u)), u, "HEAD");
    if (info.type() != arrow::fs::FileType::File) return std::nullopt;
    // Arrow gives no generation or ETag; the version write_if compares is the object's update time (to the
    // microsecond GCS keeps), "" when Arrow has none.
    std::string version;
    if (info.mtime() != arrow::fs::kNoTime) {
      version = std::to_string(
          std::chrono::duration_cast<std::chrono::microseconds>(info.mtime().time_since_epoch()).count());
    }
    return ObjectInfo{u.str(), static_cast<uint64_t>(info.size()), version};
  }

 private:
  static std::string path(const Uri& u) { return u.bucket + "/" + u.key; }

  const Client& client() {
    std::call_once(once_, [this] { client_ = make_client(); });
    return client_;
  }

  void check(const arrow::Status& st, const Uri& u, const char* op) {
    if (st.ok()) return;
    if (not_found(st)) {
      // An upload's only missing thing can be its bucket.
      if (std::string_view(op) == "PUT") {
        throw Error(kGcsComponent, fmt::format("{}: PUT: the bucket {} does not exist", u.str(), u.bucket));
      }
      throw Error(kGcsComponent, fmt::format("{}: {}: no such object or bucket", u.str(), op));
    }
    throw Error(kGcsComponent, fmt::format("{}: {} failed: {} (credentials: {})", u.str(), op, short_message(st),
                                           client().credentials));
  }
  template <typename T>
  T check(arrow::Result<T> r, const Uri& u, const char* op) {
    check(r.status(), u, op);
    return *std::move(r);
  }

  std::shared_ptr<arrow::io::RandomAccessFile> open(const Uri& u, const char* op) {
    return check(client().fs->OpenInputFile(path(u)), u, op);
  }
  int64_t size_of(arrow::io::RandomAccessFile& f, const Uri& u) { return check(f.GetSize(), u, "HEAD"); }

  // Reads [0, size) in kPartBytes pieces, handing each to `sink` (called concurrently). One object part or a
  // parallelism of 1: sequentially from the stream OpenInputFile already opened at offset 0 (no further request);
  // otherwise ranged reads, `parallelism` at a time, each its own request.
  void read_parts(arrow::io::RandomAccessFile& f, const Uri& u, uint64_t size,
                  const std::function<void(int64_t, const arrow::Buffer&)>& sink) {
    const auto n = static_cast<size_t>((size + kPartBytes - 1) / kPartBytes);
    const auto piece = [&](size_t i) {
      const int64_t begin = static_cast<int64_t>(i) * kPartBytes;
      return std::pair{begin, std::min<int64_t>(kPartBytes, static_cast<int64_t>(size) - begin)};
    };
    const auto got = [&](const std::shared_ptr<arrow::Buffer>& b, int64_t begin, int64_t length) {
      if (b->size() != length) {
        throw Error(kGcsComponent, fmt::format("{}: bytes {}+{}: {} arrived", u.str(), begin, length, b->size()));
      }
      sink(begin, *b);
    };
    if (n <= 1 || client().parallelism == 1) {
      // One buffer for every piece: a fresh 8 MiB allocation per piece costs a page fault per 4 KiB.
      auto buffer = check(arrow::AllocateBuffer(std::min<int64_t>(kPartBytes, static_cast<int64_t>(size))), u, "GET");
      for (size_t i = 0; i < n; ++i) {
        const auto [begin, length] = piece(i);
        const int64_t read = check(f.Read(length, buffer->mutable_data()), u, "GET");
        got(std::make_shared<arrow::Buffer>(buffer->data(), read), begin, length);
      }
      return;
    }
    parallel_for(n, client().parallelism, [&](size_t i) {
      const auto [begin, length] = piece(i);
      got(check(f.ReadAt(begin, length), u, "GET"), begin, length);
    });
  }

  std::once_flag once_;
  Client client_;
};

}  // namespace

Backend& gcs_backend() {
  static GcsBackend backend;
  return backend;
}

}  // namespace tessera::storage
