// The S3 client behind storage::*: AWS Signature Version 4 over libcurl, for AWS S3 and S3-compatible stores (MinIO,
// Ceph RGW, Cloudflare R2, OCI's S3 endpoint). One process-wide client (S3Client::shared()) reads the credentials
// and configuration once, reuses connections, retries transient failures with exponential backoff and jitter, and
// splits large transfers into parallel parts. Credentials come from the AWS SDKs' default chain (static keys, STS
// roles, web identity, credential_process, container and EC2 endpoints) and are refreshed before they expire.
// Credentials never appear in errors or logs. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::storage {

struct S3Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty unless temporary credentials
  std::string source;         // where they came from ("environment", "~/.aws/credentials [default]"), for messages
  // When temporary credentials stop working; none for long-term keys.
  std::optional<std::chrono::system_clock::time_point> expiration;
};

// Where the S3 client gets its credentials, asked before every request. Thread-safe.
class CredentialProvider {
 public:
  virtual ~CredentialProvider() = default;
  // Credentials to sign with now. Temporary ones are fetched again within 5 minutes of their expiration (within half
  // their lifetime when that is shorter); while one thread fetches, the others keep signing with the current ones
  // if those have not expired. Throws Error naming the source when none can be had.
  virtual S3Credentials get() = 0;
  // The server answered ExpiredToken: the next get() fetches new credentials (nothing to do for long-term keys).
  virtual void expired_by_server() {}
  // Where the credentials come from, for messages; never a secret.
  virtual std::string source() const = 0;
};

// Long-term keys, as given.
std::shared_ptr<CredentialProvider> fixed_credentials(S3Credentials credentials);

// Temporary credentials from `fetch`, called again as their expiration nears (the refresh rules of get() above), for
// a source the default chain does not know. A refresh that throws, whatever it throws, keeps unexpired credentials
// (with a warning) and otherwise makes get() throw Error naming `source`; it never leaves other callers waiting.
std::shared_ptr<CredentialProvider> refreshing_credentials(std::string source, std::function<S3Credentials()> fetch);

// The AWS SDKs' default chain (botocore's order), resolved once per call:
//   1. AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN);
//   2. the profile's role_arn (AWS_PROFILE, default "default", in AWS_CONFIG_FILE / AWS_SHARED_CREDENTIALS_FILE)
//      through STS AssumeRole, signed with its source_profile's credentials (themselves any of these, chained) or
//      its credential_source (Environment, Ec2InstanceMetadata, EcsContainer); role_session_name, external_id and
//      duration_seconds as the SDKs read them;
//   3. AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN (+ AWS_ROLE_SESSION_NAME), or the profile's
//      web_identity_token_file + role_arn, through STS AssumeRoleWithWebIdentity (EKS's IAM roles for service
//      accounts; the token file is read again at every refresh);
//   4. the profile's static keys in the credentials file, then its credential_process (a command printing
//      {"Version": 1, "AccessKeyId", ...}), then its static keys in the config file;
//   5. AWS_CONTAINER_CREDENTIALS_RELATIVE_URI (http://169.254.170.2 + it) or AWS_CONTAINER_CREDENTIALS_FULL_URI,
//      with AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE or AWS_CONTAINER_AUTHORIZATION_TOKEN (ECS, SageMaker, EKS Pod
//      Identity);
//   6. the EC2 instance metadata service, IMDSv2 (AWS_EC2_METADATA_SERVICE_ENDPOINT, default
//      http://169.254.169.254; AWS_METADATA_SERVICE_TIMEOUT, default 1 s; off with AWS_EC2_METADATA_DISABLED=true).
// STS is reached at AWS_ENDPOINT_URL_STS, else AWS_ENDPOINT_URL, else the profile's endpoint_url, else
// https://sts.<region>.amazonaws.com. Throws ConfigError saying where it looked when no source has credentials.
std::shared_ptr<CredentialProvider> default_credential_provider();

struct S3Config {
  // Endpoint URL ("http://127.0.0.1:9000"); empty = AWS, https://s3.<region>.amazonaws.com.
  std::string endpoint;
  std::string region = "us-east-1";
  // Path style (endpoint/bucket/key) or virtual-hosted (bucket.endpoint/key). Auto: virtual-hosted on AWS, path style
  // on a custom endpoint (what MinIO and Ceph expect).
  enum class Addressing { kAuto, kPath, kVirtual };
  Addressing addressing = Addressing::kAuto;
  int max_attempts = 5;         // tries per request, retrying 5xx, 429, timeouts, resets, refused connections
  double backoff_base_s = 0.1;  // attempt n sleeps uniform(0, min(backoff_max_s, backoff_base_s * 2^n)) ("full jitter")
  double backoff_max_s = 5.0;
  long connect_timeout_s = 10;       // NOLINT(google-runtime-int): libcurl's type
  long stall_timeout_s = 30;         // NOLINT(google-runtime-int): abort a transfer below 1 KiB/s for this long
  uint64_t part_size = 16ULL << 20;  // bytes per range request / multipart part (S3's minimum is 5 MiB)
  uint64_t multipart_threshold = 16ULL << 20;  // writes above this use a multipart upload
  int parallelism = 8;                         // concurrent part requests per object
  // Send a CRC32 of every uploaded body (x-amz-checksum-crc32; multipart uploads declare CRC32 and list each part's),
  // so the store rejects a body damaged on the way, as the AWS SDKs do by default. Off with
  // AWS_REQUEST_CHECKSUM_CALCULATION=when_required, the SDKs' switch, for stores that refuse these headers.
  bool request_checksums = true;

  // Reads S3_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, AWS_REGION / AWS_DEFAULT_REGION (else the profile's
  // `region` in ~/.aws/config), TESSERA_S3_ADDRESSING_STYLE (auto|path|virtual), TESSERA_S3_MAX_ATTEMPTS,
  // TESSERA_S3_PART_SIZE_MB, TESSERA_S3_PARALLELISM, TESSERA_S3_STALL_TIMEOUT_S,
  // AWS_REQUEST_CHECKSUM_CALCULATION (when_supported | when_required).
  static S3Config from_environment();
};

// default_credential_provider()->get(): the credentials the default chain gives now.
S3Credentials load_credentials();
// How many times this process has resolved the default chain (tests check the shared client does it once).
int64_t credential_loads();

// One HTTP exchange, as the client saw it.
struct S3Response {
  long status = 0;  // NOLINT(google-runtime-int): libcurl's type
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // lowercase names
  std::string header(std::string_view name) const;           // "" when absent
};

class S3Client {
 public:
  S3Client(S3Config config, S3Credentials credentials);
  S3Client(S3Config config, std::shared_ptr<CredentialProvider> credentials);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  // The process-wide client, built on first use from the environment (the credentials chain resolved once).
  static S3Client& shared();

  const S3Config& config() const { return config_; }

  std::string get(const std::string& bucket, const std::string& key);
  std::string get_range(const std::string& bucket, const std::string& key, uint64_t offset, uint64_t length);
  // Parallel ranged download into a temporary file renamed to `path` when complete. The first range's answer gives
  // the size and the ETag every other range must match (If-Match), so a replaced object fails instead of mixing.
  void download(const std::string& bucket, const std::string& key, const std::string& path);
  // One PUT, or a parallel multipart upload above multipart_threshold (aborted on failure).
  void put(const std::string& bucket, const std::string& key, std::string_view data);
  // put() of the concatenation of `parts`; each part request gathers its bytes from them.
  void put_parts(const std::string& bucket, const std::string& key, const std::vector<std::string_view>& parts);
  // One PUT of `data` only while the object's ETag is `expected` (If-Match; nullopt: If-None-Match: *, no object
  // yet). The new ETag, or nullopt when the store answers 412 Precondition Failed. A store that answers 501 has no
  // conditional PUTs: `*unsupported` is set (from then on without asking; one warning), nothing was written, and the
  // caller checks the condition another way.
  std::optional<std::string> put_if(const std::string& bucket, const std::string& key, std::string_view data,
                                    const std::optional<std::string>& expected, bool* unsupported);
  // Multipart from a file, reading one part per worker at a time.
  void upload_file(const std::string& path, const std::string& bucket, const std::string& key);
  struct Listed {
    std::string key;
    uint64_t size = 0;
    std::string etag;
  };
  std::vector<Listed> list(const std::string& bucket, const std::string& prefix);
  void remove(const std::string& bucket, const std::string& key);
  std::optional<Listed> head(const std::string& bucket, const std::string& key);

  // Requests sent, including retries (benchmarks and tests read it).
  int64_t requests_sent() const { return requests_.load(); }

 private:
  struct Pool;
  // Receives a 2xx response's body as it arrives: (offset within the body, bytes). A retried request starts again at
  // offset 0, so a sink that writes at the offset needs no reset.
  using BodySink = std::function<void(uint64_t, std::string_view)>;
  // Signs and sends one request, retrying transient failures; throws naming s3://bucket/key on failure. With a sink,
  // a 2xx body goes to it and the response's body is left empty.
  S3Response send(const std::string& method, const std::string& bucket, const std::string& key,
                  const std::vector<std::pair<std::string, std::string>>& query,
                  std::vector<std::pair<std::string, std::string>> headers, std::string_view payload,
                  const BodySink& sink = nullptr);
  // One PUT, with the body's CRC32 when request_checksums is on.
  void put_single(const std::string& bucket, const std::string& key, std::string_view data);
  // A parallel multipart upload of `size` bytes; `read_part` gives the bytes [offset, offset + length) as a view of
  // the caller's memory, or of `scratch` where it has to copy or read them.
  void upload_parts(
      const std::string& bucket, const std::string& key, uint64_t size,
      const std::function<std::string_view(uint64_t offset, uint64_t length, std::string& scratch)>& read_part);

  S3Config config_;
  std::shared_ptr<CredentialProvider> credentials_;
  std::unique_ptr<Pool> pool_;
  std::atomic<int64_t> requests_{0};
  std::atomic<bool> conditional_puts_unsupported_{false};  // the store answered a conditional PUT with 501
};

// Signature Version 4 (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_sigv-create-signed-request.html),
// exposed so tests can check it against AWS's published examples and botocore.
namespace sigv4 {

std::string sha256_hex(std::string_view data);

struct Request {
  std::string method;                                        // GET, PUT, ...
  std::string path;                                          // already encoded, starting with '/'
  std::vector<std::pair<std::string, std::string>> query;    // raw (unencoded) names and values
  std::vector<std::pair<std::string, std::string>> headers;  // names any case; host and x-amz-* included
  std::string payload_hash;                                  // x-amz-content-sha256's value
};

std::string canonical_request(const Request& request);
// The Authorization header's value for `request` signed at `amz_date` (YYYYMMDDTHHMMSSZ).
std::string authorization(const Request& request, const S3Credentials& credentials, const std::string& region,
                          const std::string& service, const std::string& amz_date);

}  // namespace sigv4

}  // namespace tessera::storage
