// One object store behind storage.h's functions: what the URIs of one scheme do. storage.cpp keeps the table of
// schemes and dispatches; each backend gets URIs already parsed (`bucket`, `key`) and keeps storage.h's semantics
// (atomic publish, downloads through a temporary file, a missing object's remove() is not an error).
#pragma once

#include <openssl/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/storage/s3.h"
#include "tessera/storage/storage.h"
#include "tessera/util/http.h"

namespace tessera::storage {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string get(const Uri& u) = 0;
  virtual std::string get_range(const Uri& u, uint64_t offset, uint64_t length) = 0;
  virtual void download(const Uri& u, const std::string& local_path) = 0;  // `local_path`'s folder exists
  virtual void put_parts(const Uri& u, const std::vector<std::string_view>& parts) = 0;
  virtual void upload_file(const std::string& local_path, const Uri& u) = 0;
  virtual std::vector<ObjectInfo> list(const Uri& prefix) = 0;  // every object whose key starts with prefix.key
  virtual void remove(const Uri& u) = 0;
  virtual std::optional<ObjectInfo> stat(const Uri& u) = 0;
  // storage::upload_tree's work: `files` (paths relative to `local_dir`, in upload order) to `folder` + each path,
  // then `stale` removed. This default uploads and removes one object at a time (storage.cpp).
  virtual void upload_tree(const std::string& local_dir, const Uri& folder, const std::vector<std::string>& files,
                           const std::vector<Uri>& stale);
  // storage::write_if's work: `data` to `u` only while its ETag is `expected` (nullopt: absent); the new ETag, or
  // nullopt when the condition fails. This default compares stat()'s ETag, then writes (storage.cpp).
  virtual std::optional<std::string> put_if(const Uri& u, std::string_view data,
                                            const std::optional<std::string>& expected);
  // The pre-flight check that objects can be written under `folder`; throws Error saying why not. This default
  // writes and removes an empty object named `probe_object` (storage.cpp).
  virtual void probe_write(const Uri& folder, const std::string& probe_object);
};

// The backend of an object store's URI (not a local path).
Backend& backend_of(const Uri& u);

// What the store clients share besides the transport (storage.cpp; env_int is util/http.h's).
using util::env_int;
// A byte count a server sent (a listing's size, Content-Length); empty is 0. Anything else is an Error naming `where`
// and `what` (tagged with `component`), not std::stoull's exceptions.
uint64_t byte_count(std::string_view text, const std::string& where, const char* what, const char* component);
// Base64 (RFC 4648, padded) of `bytes`, through OpenSSL.
std::string base64_encode(std::string_view bytes);
// The bytes of padded base64 `text`; nullopt when it is not that (an account key, a token's payload).
std::optional<std::string> base64_decode(std::string_view text);
// An RSA private key from PEM text (PKCS#1 or PKCS#8; `pass` opens an encrypted one); nullptr when it is not one.
std::shared_ptr<EVP_PKEY> rsa_key_from_pem(std::string_view pem, const std::string& pass);
// The RSASSA-PKCS1-v1_5 SHA-256 signature of `text` (OCI's request signatures, GCS's RS256 tokens); nullopt when
// OpenSSL refuses.
std::optional<std::string> rsa_sha256_sign(EVP_PKEY* key, std::string_view text);
// An OAuth 2.0 access token from a token endpoint's JSON answer to `request` (access_token; expires_in, or the
// managed-identity endpoints' expires_on; else an hour), carried as the refresh machinery carries temporary
// credentials: session_token holds the token. No answer, another status than 200 or no access_token is an Error
// (tagged `component`) naming `source`, the status and the endpoint's error and error_description.
S3Credentials fetch_access_token(const util::HttpRequest& request, const std::string& source, const char* component);
// The current time as an HTTP date (RFC 7231: "Mon, 07 Dec 2026 13:00:00 GMT"), as x-ms-date and OCI's signed `date`
// want it.
std::string http_date_now();
// An ETag without its surrounding double quotes.
std::string strip_quotes(std::string etag);
// Several buffers read as one object (a checkpoint's tensors): its size, and any byte range of it without joining
// the buffers first. Keeps a reference to `parts`.
class Concatenation {
 public:
  explicit Concatenation(const std::vector<std::string_view>& parts);
  uint64_t size() const { return size_; }
  // The bytes [offset, offset + length) as views of the buffers, in order, cut to the range.
  std::vector<std::string_view> views(uint64_t offset, uint64_t length) const;
  // The same bytes as one view: of the buffer that holds them all (most parts of a checkpoint lie within one
  // tensor), else copied into `scratch`.
  std::string_view contiguous(uint64_t offset, uint64_t length, std::string& scratch) const;

 private:
  const std::vector<std::string_view>& parts_;
  std::vector<uint64_t> starts_;
  uint64_t size_ = 0;
};

// A local file mapped read-only for an upload (an empty file maps nothing); the constructor throws Error naming the
// path. Uploads send from the mapping, so a file of any size costs no memory of ours.
class MappedFile {
 public:
  MappedFile(const std::string& path, const char* component);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::string_view bytes() const { return {static_cast<const char*>(data_), size_}; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Runs `work(i)` for i in [0, n) on up to `threads` threads; rethrows the first failure after all stop.
void parallel_for(size_t n, int threads, const std::function<void(size_t)>& work);

// A download's temporary file beside `path`, unique to this process and call: `path.tmp-PID-N`.
std::string temporary_name(const std::string& path);

// Writes `bytes` at `offset` of the file being downloaded (thread-safe: positioned writes).
using DownloadWriter = std::function<void(uint64_t offset, std::string_view bytes)>;
// A download of object `uri` into `local_path` through a temporary_name() file: `fetch` writes the object's bytes
// with the writer it is given (any order, any threads), and once it returns the file is renamed over `local_path`.
// If `fetch` (or a write) throws, the temporary file is removed and the error rethrown: no partial file under the
// final name. Writes go to the page cache in 256 KiB slices (one 8 MiB write copies at a third of the speed).
void download_through_temporary(const std::string& uri, const std::string& local_path,
                                const std::function<void(const DownloadWriter&)>& fetch);

// One ranged GET of a parallel download: bytes [first, last] of the object, conditioned on `pin` (empty for the first
// range), each byte handed to `sink` at its offset within the range. The answer's status (206, 200 for an object that
// fits the range, or 416 for an empty object), its Content-Range and the value that pins the other ranges to the same
// version (an ETag, a Last-Modified).
struct RangeAnswer {
  long status = 0;  // NOLINT(google-runtime-int): libcurl's type
  std::string content_range;
  std::string pin;
};
using RangeFetch = std::function<RangeAnswer(uint64_t first, uint64_t last, const std::string& pin,
                                             const std::function<void(uint64_t, std::string_view)>& sink)>;
// A download through download_through_temporary() in ranges of `part` bytes: the first range's answer gives the size
// (Content-Range's total) and the pin, then the other ranges go `parallelism` at a time. Each range must deliver
// exactly its bytes, or the download fails naming `uri`.
void ranged_download(const std::string& uri, const std::string& local_path, uint64_t part, int parallelism,
                     const RangeFetch& fetch);

// Google Cloud Storage through Arrow's GcsFileSystem (google-cloud-cpp), created on first use (gcs_store.cpp).
Backend& gcs_backend();
// Azure Blob Storage and Data Lake Storage Gen2 through the Blob API, Tessera's own client (azure_store.cpp).
Backend& azure_backend();
// Databricks Unity Catalog volumes through the workspace's Files API (dbfs_store.cpp).
Backend& dbfs_backend();
// OCI Object Storage through its native API, signed with an API key (oci_store.cpp).
Backend& oci_backend();
// Files in Hugging Face Hub repositories, written by commits (hf_store.cpp).
Backend& hf_backend();

}  // namespace tessera::storage
