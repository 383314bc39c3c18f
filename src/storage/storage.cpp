// storage::*: URI parsing, the table of schemes, and dispatch to local files or a scheme's backend.
#include <fmt/format.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "backend.h"
#include "tessera/storage/s3.h"
#include "tessera/storage/storage.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"

namespace tessera::storage {
namespace {

namespace fs = std::filesystem;
constexpr const char* kComponent = "storage";

void make_parent(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
}

// S3 and everything that speaks its API, through the shared S3 client.
class S3Backend final : public Backend {
 public:
  std::string get(const Uri& u) override { return S3Client::shared().get(u.bucket, u.key); }
  std::string get_range(const Uri& u, uint64_t offset, uint64_t length) override {
    return S3Client::shared().get_range(u.bucket, u.key, offset, length);
  }
  void download(const Uri& u, const std::string& local_path) override {
    S3Client::shared().download(u.bucket, u.key, local_path);
  }
  void put_parts(const Uri& u, const std::vector<std::string_view>& parts) override {
    S3Client::shared().put_parts(u.bucket, u.key, parts);
  }
  void upload_file(const std::string& local_path, const Uri& u) override {
    S3Client::shared().upload_file(local_path, u.bucket, u.key);
  }
  std::vector<ObjectInfo> list(const Uri& prefix) override {
    std::vector<ObjectInfo> out;
    for (auto& l : S3Client::shared().list(prefix.bucket, prefix.key)) {
      out.push_back({fmt::format("s3://{}/{}", prefix.bucket, l.key), l.size, std::move(l.etag)});
    }
    return out;
  }
  void remove(const Uri& u) override { S3Client::shared().remove(u.bucket, u.key); }
  std::optional<std::string> put_if(const Uri& u, std::string_view data,
                                    const std::optional<std::string>& expected) override {
    bool unsupported = false;
    auto etag = S3Client::shared().put_if(u.bucket, u.key, data, expected, &unsupported);
    return unsupported ? Backend::put_if(u, data, expected) : etag;  // (the default: stat's ETag compared first)
  }
  std::optional<ObjectInfo> stat(const Uri& u) override {
    auto h = S3Client::shared().head(u.bucket, u.key);
    if (!h) return std::nullopt;
    return ObjectInfo{u.str(), h->size, std::move(h->etag)};
  }
};

Backend& s3_backend() {
  static S3Backend backend;
  return backend;
}

// The object stores, by scheme: the one place a scheme is named. A URI is the prefix, the bucket (container, volume
// root), '/', the key.
struct SchemeEntry {
  Uri::Scheme scheme;
  std::string_view prefix;
  Backend& (*backend)();
};
constexpr SchemeEntry kSchemes[] = {
    {Uri::Scheme::kS3, "s3://", s3_backend},
    {Uri::Scheme::kGcs, "gs://", gcs_backend},
    {Uri::Scheme::kHf, "hf://", hf_backend},
    {Uri::Scheme::kAzure, "azure://", azure_backend},       // azure://container/path (Streaming's form)
    {Uri::Scheme::kAzureDl, "azure-dl://", azure_backend},  // a Data Lake Gen2 file system, through the Blob API
    {Uri::Scheme::kAbfs, "abfs://", azure_backend},         // abfs[s]://container@account.dfs.core.windows.net/path
    {Uri::Scheme::kAbfss, "abfss://", azure_backend},
    {Uri::Scheme::kDbfs, "dbfs:/", dbfs_backend},  // dbfs:/Volumes/<catalog>/<schema>/<volume>/path
    {Uri::Scheme::kOci, "oci://", oci_backend},    // oci://bucket/path, oci://bucket@namespace/path
};

// The entry whose prefix `uri` starts with, or nullptr.
const SchemeEntry* entry_for(std::string_view uri) {
  for (const auto& e : kSchemes) {
    if (uri.substr(0, e.prefix.size()) == e.prefix) return &e;
  }
  return nullptr;
}

const SchemeEntry& entry_of(Uri::Scheme scheme) {
  for (const auto& e : kSchemes) {
    if (e.scheme == scheme) return e;
  }
  throw Error(kComponent, "no backend for a local path");
}

std::string supported_schemes() {
  std::string out;
  for (const auto& e : kSchemes)
    out += fmt::format("{}{}, ", e.prefix, e.scheme == Uri::Scheme::kDbfs ? "Volumes/" : "");
  return out + "file://, local paths";
}

}  // namespace

Backend& backend_of(const Uri& u) {
  return entry_of(u.scheme).backend();
}

// Runs `work(i)` for i in [0, n) on up to `threads` threads; rethrows the first failure after all stop.
void parallel_for(size_t n, int threads, const std::function<void(size_t)>& work) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto run = [&] {
    for (size_t i = next++; i < n && !failed; i = next++) {
      try {
        work(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  const size_t count = std::min<size_t>(n, static_cast<size_t>(std::max(threads, 1)));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < count; ++t) pool.emplace_back(run);
  run();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

void download_through_temporary(const std::string& uri, const std::string& local_path,
                                const std::function<void(const DownloadWriter&)>& fetch) {
  const std::string tmp = temporary_name(local_path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(kComponent, fmt::format("{}: cannot create {}: {}", uri, tmp, std::strerror(errno)));
  const DownloadWriter write = [&](uint64_t offset, std::string_view bytes) {
    constexpr size_t kSlice = size_t{256} << 10;
    for (size_t at = 0; at < bytes.size(); at += kSlice) {
      const size_t n = std::min(kSlice, bytes.size() - at);
      if (::pwrite(fd, bytes.data() + at, n, static_cast<off_t>(offset + at)) != static_cast<ssize_t>(n)) {
        throw Error(kComponent, fmt::format("{}: cannot write {}: {}", uri, tmp, std::strerror(errno)));
      }
    }
  };
  try {
    fetch(write);
    if (::close(fd) != 0)
      throw Error(kComponent, fmt::format("{}: cannot write {}: {}", uri, tmp, std::strerror(errno)));
    fs::rename(tmp, local_path);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
}

namespace {

uint64_t range_total(std::string_view text, const std::string& uri) {
  const size_t slash = text.rfind('/');
  uint64_t n = 0;
  const std::string_view total = slash == std::string_view::npos ? std::string_view() : text.substr(slash + 1);
  const auto [end, ec] = std::from_chars(total.data(), total.data() + total.size(), n);
  if (total.empty() || ec != std::errc() || end != total.data() + total.size()) {
    throw Error(kComponent,
                fmt::format("{}: the server sent Content-Range '{}', not a range of a known size", uri, text));
  }
  return n;
}

}  // namespace

uint64_t byte_count(std::string_view text, const std::string& where, const char* what, const char* component) {
  uint64_t n = 0;
  if (text.empty()) return n;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size()) {
    throw Error(component, fmt::format("{}: the server sent {} '{}', not a byte count", where, what, text));
  }
  return n;
}

std::string base64_encode(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

std::optional<std::string> base64_decode(std::string_view text) {
  if (text.empty() || text.size() % 4 != 0) return std::nullopt;
  std::string out(3 * text.size() / 4, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(text.data()), static_cast<int>(text.size()));
  if (n < 0) return std::nullopt;
  size_t size = static_cast<size_t>(n);
  for (size_t i = text.size(); i > 0 && text[i - 1] == '='; --i) --size;  // EVP_DecodeBlock counts the padding
  out.resize(size);
  return out;
}

S3Credentials fetch_access_token(const util::HttpRequest& request, const std::string& source, const char* component) {
  const util::HttpResponse r = util::http_request(request);
  if (r.status == 0) throw Error(component, fmt::format("{}: {}", source, r.transport_error));
  const auto j = nlohmann::json::parse(r.body, nullptr, false);
  const bool object = !j.is_discarded() && j.is_object();
  const auto text = [&](const char* key) {
    return object && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
  };
  if (r.status != 200) {
    std::string why = text("error");
    if (!why.empty() && !text("error_description").empty()) why += ": " + text("error_description");
    throw Error(component, fmt::format("{}: the token endpoint answered HTTP {}{}", source, r.status,
                                       why.empty() ? "" : " " + why));
  }
  if (text("access_token").empty()) throw Error(component, fmt::format("{}: the answer holds no access_token", source));
  const auto number = [&](const char* key) -> std::optional<int64_t> {  // a number, or a string of one
    if (!object || !j.contains(key)) return std::nullopt;
    if (j[key].is_number_integer()) return j[key].get<int64_t>();
    const std::string s = text(key);
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (!s.empty() && ec == std::errc() && end == s.data() + s.size()) return v;
    return std::nullopt;
  };
  S3Credentials c;
  c.session_token = text("access_token");
  c.source = source;
  const auto now = std::chrono::system_clock::now();
  if (const auto in = number("expires_in")) {
    c.expiration = now + std::chrono::seconds(*in);
  } else if (const auto on = number("expires_on")) {
    c.expiration = std::chrono::system_clock::time_point(std::chrono::seconds(*on));
  } else {
    c.expiration = now + std::chrono::hours(1);
  }
  return c;
}

std::shared_ptr<EVP_PKEY> rsa_key_from_pem(std::string_view pem, const std::string& pass) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free);
  EVP_PKEY* key =
      PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, pass.empty() ? nullptr : const_cast<char*>(pass.c_str()));
  if (key == nullptr || EVP_PKEY_base_id(key) != EVP_PKEY_RSA) {
    EVP_PKEY_free(key);
    return nullptr;
  }
  return std::shared_ptr<EVP_PKEY>(key, EVP_PKEY_free);
}

std::optional<std::string> rsa_sha256_sign(EVP_PKEY* key, std::string_view text) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  const auto* data = reinterpret_cast<const unsigned char*>(text.data());
  size_t len = 0;
  if (!ctx || EVP_DigestSignInit(ctx.get(), nullptr, EVP_sha256(), nullptr, key) != 1 ||
      EVP_DigestSign(ctx.get(), nullptr, &len, data, text.size()) != 1) {
    return std::nullopt;
  }
  std::string signature(len, '\0');
  if (EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(signature.data()), &len, data, text.size()) != 1) {
    return std::nullopt;
  }
  signature.resize(len);
  return signature;
}

std::string http_date_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  static constexpr const char* kDays[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
  static constexpr const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                            "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  // Not strftime's %a and %b: they follow the locale, and HTTP dates are English.
  return fmt::format("{}, {:02d} {} {} {:02d}:{:02d}:{:02d} GMT", kDays[tm.tm_wday], tm.tm_mday, kMonths[tm.tm_mon],
                     tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

std::string strip_quotes(std::string etag) {
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') etag = etag.substr(1, etag.size() - 2);
  return etag;
}

Concatenation::Concatenation(const std::vector<std::string_view>& parts) : parts_(parts) {
  for (const std::string_view p : parts_) {
    starts_.push_back(size_);
    size_ += p.size();
  }
}

std::vector<std::string_view> Concatenation::views(uint64_t offset, uint64_t length) const {
  std::vector<std::string_view> out;
  size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), offset) - starts_.begin());
  for (i = i == 0 ? 0 : i - 1; i < parts_.size() && length > 0; ++i) {
    if (offset >= starts_[i] + parts_[i].size()) continue;  // empty buffers, and the one `offset` ends
    const uint64_t from = offset - starts_[i], n = std::min<uint64_t>(length, parts_[i].size() - from);
    out.push_back(parts_[i].substr(from, n));
    offset += n;
    length -= n;
  }
  return out;
}

std::string_view Concatenation::contiguous(uint64_t offset, uint64_t length, std::string& scratch) const {
  const std::vector<std::string_view> pieces = views(offset, length);
  if (pieces.size() == 1) return pieces.front();
  scratch.clear();
  scratch.reserve(length);
  for (const std::string_view p : pieces) scratch.append(p);
  return scratch;
}

MappedFile::MappedFile(const std::string& path, const char* component) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(component, fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(component, fmt::format("{}: cannot stat: {}", path, std::strerror(err)));
  }
  size_ = static_cast<size_t>(st.st_size);
  void* map = size_ == 0 ? nullptr : ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (map == MAP_FAILED) throw Error(component, fmt::format("{}: cannot map: {}", path, std::strerror(err)));
  data_ = map;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

void ranged_download(const std::string& uri, const std::string& local_path, uint64_t part, int parallelism,
                     const RangeFetch& fetch) {
  download_through_temporary(uri, local_path, [&](const DownloadWriter& write) {
    // Bytes [begin, end) into the file; end = 0: the first range, whose length is not known yet.
    const auto get = [&](uint64_t begin, uint64_t end, const std::string& pin) {
      const uint64_t last = (end == 0 ? part : end) - 1;
      std::atomic<uint64_t> got{0};
      RangeAnswer a = fetch(begin, last, pin, [&](uint64_t offset, std::string_view bytes) {
        if (begin + offset + bytes.size() > last + 1) {
          throw Error(kComponent, fmt::format("{}: range {}-{} returned too many bytes", uri, begin, last));
        }
        write(begin + offset, bytes);
        got = offset + bytes.size();
      });
      if (end != 0 && got != end - begin) {
        throw Error(kComponent, fmt::format("{}: range {}-{} returned {} bytes", uri, begin, last, got.load()));
      }
      return std::make_pair(std::move(a), got.load());
    };
    const auto [first, got] = get(0, 0, "");
    if (first.status == 416) return;  // an empty object has no range
    const uint64_t size = first.status == 200 ? got : range_total(first.content_range, uri);
    if (got != std::min(size, part)) {
      throw Error(kComponent, fmt::format("{}: the first range returned {} bytes of {}", uri, got, size));
    }
    const size_t parts = static_cast<size_t>((size + part - 1) / part);
    if (parts > 1) {
      parallel_for(parts - 1, parallelism, [&, pin = first.pin](size_t i) {
        const uint64_t begin = (i + 1) * part;
        get(begin, std::min(size, begin + part), pin);
      });
    }
  });
}

std::string temporary_name(const std::string& path) {
  static std::atomic<int64_t> counter{0};
  return fmt::format("{}.tmp-{}-{}", path, ::getpid(), counter++);
}

std::string Uri::str() const {
  return scheme == Scheme::kLocal ? key : fmt::format("{}{}/{}", entry_of(scheme).prefix, bucket, key);
}

Uri parse_uri(std::string_view uri) {
  Uri u;
  const SchemeEntry* e = entry_for(uri);
  if (e == nullptr) {
    const size_t sep = uri.find("://");
    if (sep == std::string_view::npos) {
      u.key = std::string(uri);
      return u;
    }
    if (uri.substr(0, sep) == "file") {
      u.key = std::string(uri.substr(sep + 3));
      return u;
    }
    throw ConfigError(kComponent, fmt::format("{}: unsupported scheme \"{}://\" (supported: {}; R2, MinIO and Ceph "
                                              "work through their S3 endpoints with S3_ENDPOINT_URL)",
                                              uri, uri.substr(0, sep), supported_schemes()));
  }
  u.scheme = e->scheme;
  std::string_view rest = uri.substr(e->prefix.size());
  if (u.scheme == Uri::Scheme::kDbfs) {
    while (!rest.empty() && rest.front() == '/') rest.remove_prefix(1);  // dbfs:/Volumes and dbfs:///Volumes alike
  }
  const size_t slash = rest.find('/');
  u.bucket = std::string(rest.substr(0, slash));
  if (slash != std::string_view::npos) u.key = std::string(rest.substr(slash + 1));
  if (u.bucket.empty()) throw ConfigError(kComponent, fmt::format("{}: no bucket name", uri));
  if (u.scheme == Uri::Scheme::kDbfs && u.bucket != "Volumes") {
    throw ConfigError(kComponent, fmt::format("{}: only Unity Catalog volumes are supported "
                                              "(dbfs:/Volumes/<catalog>/<schema>/<volume>/...), not the DBFS root",
                                              uri));
  }
  return u;
}

bool is_remote(std::string_view uri) {
  return entry_for(uri) != nullptr;
}

std::string join(std::string_view base, std::string_view name) {
  std::string out(base);
  if (!out.empty() && out.back() != '/') out += '/';
  while (!name.empty() && name.front() == '/') name.remove_prefix(1);
  return out + std::string(name);
}

std::string read(const std::string& uri) {
  const Uri u = parse_uri(uri);
  if (u.scheme != Uri::Scheme::kLocal) return backend_of(u).get(u);
  return util::read_file(u.key, kComponent);
}

std::string read_range(const std::string& uri, uint64_t offset, uint64_t length) {
  const Uri u = parse_uri(uri);
  if (u.scheme != Uri::Scheme::kLocal) return backend_of(u).get_range(u, offset, length);
  std::ifstream in(u.key, std::ios::binary);
  if (!in) throw Error(kComponent, fmt::format("{}: cannot open", u.key));
  std::string out(length, '\0');
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(out.data(), static_cast<std::streamsize>(length));
  if (static_cast<uint64_t>(in.gcount()) != length) {
    throw Error(kComponent, fmt::format("{}: asked for {} bytes at {}, the file is shorter", u.key, length, offset));
  }
  return out;
}

void download(const std::string& uri, const std::string& local_path) {
  const Uri u = parse_uri(uri);
  make_parent(local_path);
  if (u.scheme != Uri::Scheme::kLocal) {
    backend_of(u).download(u, local_path);
    return;
  }
  util::write_file_atomically(local_path, util::read_file(u.key, kComponent), kComponent);
}

void write(const std::string& uri, std::string_view data) {
  write_parts(uri, {data});
}

void write_parts(const std::string& uri, const std::vector<std::string_view>& parts) {
  const Uri u = parse_uri(uri);
  if (u.scheme != Uri::Scheme::kLocal) {
    backend_of(u).put_parts(u, parts);
    return;
  }
  make_parent(u.key);
  util::write_file_atomically(u.key, parts, kComponent);
}

void upload(const std::string& local_path, const std::string& uri) {
  const Uri u = parse_uri(uri);
  if (u.scheme != Uri::Scheme::kLocal) {
    backend_of(u).upload_file(local_path, u);
    return;
  }
  if (fs::exists(u.key) && fs::equivalent(local_path, u.key)) return;
  make_parent(u.key);
  util::write_file_atomically(u.key, util::read_file(local_path, kComponent), kComponent);
}

std::optional<std::string> Backend::put_if(const Uri& u, std::string_view data,
                                           const std::optional<std::string>& expected) {
  const std::optional<ObjectInfo> now = stat(u);
  if (now.has_value() != expected.has_value() || (now && now->etag != *expected)) return std::nullopt;
  put_parts(u, {data});
  const std::optional<ObjectInfo> after = stat(u);
  return after ? after->etag : std::string();
}

std::optional<std::string> write_if(const std::string& uri, std::string_view data,
                                    const std::optional<std::string>& expected) {
  const Uri u = parse_uri(uri);
  if (u.scheme == Uri::Scheme::kLocal) {
    throw Error(kComponent, fmt::format("{}: a conditional write is for object stores, not local paths", uri));
  }
  Backend& backend = backend_of(u);
  if (auto etag = backend.put_if(u, data, expected)) return etag;
  // Refused: unless the object holds exactly these bytes (this writer's own PUT, answered and retried).
  const std::optional<ObjectInfo> now = backend.stat(u);
  if (now && now->size == data.size() && backend.get(u) == data) return now->etag;
  return std::nullopt;
}

void Backend::probe_write(const Uri& folder, const std::string& probe_object) {
  const Uri object = parse_uri(join(folder.str(), probe_object));
  put_parts(object, {});
  remove(object);
}

void Backend::upload_tree(const std::string& local_dir, const Uri& folder, const std::vector<std::string>& files,
                          const std::vector<Uri>& stale) {
  for (const std::string& rel : files)
    upload_file((fs::path(local_dir) / rel).string(), parse_uri(join(folder.str(), rel)));
  for (const Uri& s : stale) remove(s);
}

void upload_tree(const std::string& local_dir, const std::string& uri, const std::vector<std::string>& last,
                 bool replace) {
  std::vector<std::string> files, final;
  for (const auto& e : fs::recursive_directory_iterator(local_dir)) {
    if (!e.is_regular_file()) continue;
    const std::string rel = fs::relative(e.path(), local_dir).generic_string();
    (std::find(last.begin(), last.end(), rel) == last.end() ? files : final).push_back(rel);
  }
  std::sort(files.begin(), files.end());
  std::sort(final.begin(), final.end(), [&](const std::string& a, const std::string& b) {
    return std::find(last.begin(), last.end(), a) < std::find(last.begin(), last.end(), b);
  });
  files.insert(files.end(), final.begin(), final.end());
  std::vector<Uri> stale;
  if (replace) {
    // (as list() spells what it returns: `file://` stripped)
    const std::string prefix = parse_uri(uri.ends_with('/') ? uri : uri + "/").str();
    const std::set<std::string> fresh(files.begin(), files.end());
    for (const ObjectInfo& o : list(prefix)) {
      if (o.uri.rfind(prefix, 0) == 0 && fresh.count(o.uri.substr(prefix.size())) == 0) {
        stale.push_back(parse_uri(o.uri));
      }
    }
  }
  const Uri u = parse_uri(uri);
  if (u.scheme != Uri::Scheme::kLocal) {
    backend_of(u).upload_tree(local_dir, u, files, stale);
    return;
  }
  for (const std::string& rel : files) upload((fs::path(local_dir) / rel).string(), join(uri, rel));
  for (const Uri& s : stale) remove(s.str());
}

std::vector<ObjectInfo> list(const std::string& prefix_uri) {
  const Uri u = parse_uri(prefix_uri);
  std::vector<ObjectInfo> out;
  if (u.scheme != Uri::Scheme::kLocal) {
    out = backend_of(u).list(u);
    std::sort(out.begin(), out.end(), [](const ObjectInfo& a, const ObjectInfo& b) { return a.uri < b.uri; });
    return out;
  }
  // A local prefix is a directory (everything under it) or a file-name prefix within its parent.
  const fs::path p(u.key);
  std::error_code ec;
  if (fs::is_directory(p, ec)) {
    for (const auto& e : fs::recursive_directory_iterator(p)) {
      if (e.is_regular_file()) out.push_back({e.path().string(), e.file_size(), ""});
    }
  } else if (fs::is_directory(p.parent_path().empty() ? "." : p.parent_path(), ec)) {
    const std::string name = p.filename().string();
    for (const auto& e : fs::directory_iterator(p.parent_path().empty() ? "." : p.parent_path())) {
      if (e.path().filename().string().rfind(name, 0) != 0) continue;
      if (e.is_regular_file()) {
        out.push_back({e.path().string(), e.file_size(), ""});
      } else if (e.is_directory()) {
        for (const auto& f : fs::recursive_directory_iterator(e.path())) {
          if (f.is_regular_file()) out.push_back({f.path().string(), f.file_size(), ""});
        }
      }
    }
  }
  std::sort(out.begin(), out.end(), [](const ObjectInfo& a, const ObjectInfo& b) { return a.uri < b.uri; });
  return out;
}

void remove(const std::string& uri) {
  const Uri u = parse_uri(uri);
  if (u.scheme != Uri::Scheme::kLocal) {
    backend_of(u).remove(u);
    return;
  }
  std::error_code ec;
  fs::remove(u.key, ec);
  if (ec) throw Error(kComponent, fmt::format("{}: cannot delete: {}", u.key, ec.message()));
}

std::optional<ObjectInfo> stat(const std::string& uri) {
  const Uri u = parse_uri(uri);
  if (u.scheme != Uri::Scheme::kLocal) return backend_of(u).stat(u);
  std::error_code ec;
  if (!fs::is_regular_file(u.key, ec)) return std::nullopt;
  return ObjectInfo{uri, fs::file_size(u.key), ""};
}

}  // namespace tessera::storage
