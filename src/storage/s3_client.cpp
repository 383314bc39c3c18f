// S3Client: signed requests over pooled libcurl handles, retries with backoff, parallel ranged downloads and parallel
// multipart uploads.
#include <fcntl.h>
#include <fmt/format.h>
#include <openssl/evp.h>
#include <spdlog/spdlog.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <ctime>
#include <exception>
#include <filesystem>
#include <optional>

#include "backend.h"
#include "http_pool.h"
#include "tessera/storage/aws_files.h"
#include "tessera/storage/s3.h"
#include "tessera/util/error.h"
#include "tessera/util/http.h"
#include "tessera/util/xml.h"

namespace tessera::storage {
namespace {

constexpr const char* kS3ClientComponent = "s3";
constexpr const char* kEmptyHash = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

std::string uri_of(const std::string& bucket, const std::string& key) {
  return fmt::format("s3://{}/{}", bucket, key);
}

}  // namespace

namespace aws {

std::string amz_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

std::pair<std::string, std::string> error_code_message(std::string_view body) {
  const std::optional<util::XmlElement> doc = util::try_parse_xml(body);
  const util::XmlElement* error = doc ? doc->find("Error") : nullptr;
  if (error == nullptr) return {};
  return {error->child_text("Code"), error->child_text("Message")};
}

}  // namespace aws

namespace {

using aws::amz_now;

// S3's own codes for a transient failure come with statuses retryable_status() already retries, except on stores that
// answer them with a 4xx.
bool retryable_s3(long status, const std::string& code) {  // NOLINT(google-runtime-int)
  // (ConditionalRequestConflict: a conditional write raced another; retried, it succeeds or gets 412.)
  return retryable_status(status) || code == "RequestTimeout" || code == "SlowDown" || code == "InternalError" ||
         code == "ConditionalRequestConflict";
}

struct Endpoint {
  std::string scheme;  // "http" / "https"
  std::string host;    // host[:port]
  bool custom = false;
};

Endpoint parse_endpoint(const S3Config& c) {
  Endpoint e;
  const std::string url = c.endpoint.empty() ? fmt::format("https://s3.{}.amazonaws.com", c.region) : c.endpoint;
  const auto parts = util::parse_url(url);
  if (!parts || (parts->scheme != "http" && parts->scheme != "https")) {
    throw ConfigError(kS3ClientComponent,
                      fmt::format("S3 endpoint {}: not an http:// or https:// URL with a host", url));
  }
  e.scheme = parts->scheme;
  e.host = parts->authority;
  e.custom = !c.endpoint.empty();
  return e;
}

bool dns_compatible(const std::string& bucket) {
  if (bucket.size() < 3 || bucket.size() > 63) return false;
  return std::all_of(bucket.begin(), bucket.end(),
                     [](char c) { return std::islower(static_cast<unsigned char>(c)) || std::isdigit(c) || c == '-'; });
}

// The base64 of the big-endian CRC32 of `data`: S3's x-amz-checksum-crc32 value.
std::string crc32_base64(std::string_view data) {
  uLong crc = crc32_z(0L, Z_NULL, 0);
  crc = crc32_z(crc, reinterpret_cast<const Bytef*>(data.data()), data.size());
  const unsigned char be[4] = {static_cast<unsigned char>(crc >> 24), static_cast<unsigned char>(crc >> 16),
                               static_cast<unsigned char>(crc >> 8), static_cast<unsigned char>(crc)};
  unsigned char out[9];
  EVP_EncodeBlock(out, be, 4);
  return std::string(reinterpret_cast<const char*>(out), 8);
}

}  // namespace

std::string S3Response::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k == name) return v;
  }
  return {};
}

struct S3Client::Pool : HttpPool {};

S3Client::S3Client(S3Config config, S3Credentials credentials)
    : S3Client(std::move(config), fixed_credentials(std::move(credentials))) {}

S3Client::S3Client(S3Config config, std::shared_ptr<CredentialProvider> credentials)
    : config_(std::move(config)), credentials_(std::move(credentials)), pool_(std::make_unique<Pool>()) {}

S3Client::~S3Client() = default;

S3Client& S3Client::shared() {
  static S3Client client(S3Config::from_environment(), default_credential_provider());
  return client;
}

S3Response S3Client::send(const std::string& method, const std::string& bucket, const std::string& key,
                          const std::vector<std::pair<std::string, std::string>>& query,
                          std::vector<std::pair<std::string, std::string>> headers, std::string_view payload,
                          const BodySink& sink) {
  const Endpoint ep = parse_endpoint(config_);
  const bool virtual_host = config_.addressing == S3Config::Addressing::kVirtual ||
                            (config_.addressing == S3Config::Addressing::kAuto && !ep.custom && dns_compatible(bucket));
  const std::string encoded_key = util::url_encode(key, true);
  std::string host = ep.host, path;
  if (virtual_host) {
    host = bucket + "." + ep.host;
    path = "/" + encoded_key;
  } else {
    path = "/" + bucket + (key.empty() && query.size() > 0 ? "" : "/" + encoded_key);
  }
  std::string query_string;
  for (const auto& [k, v] : query) {
    query_string += (query_string.empty() ? "?" : "&") + util::url_encode(k, false) + "=" + util::url_encode(v, false);
  }
  const std::string url = fmt::format("{}://{}{}{}", ep.scheme, host, path, query_string);
  const std::string payload_hash = payload.empty() ? kEmptyHash : sigv4::sha256_hex(payload);
  std::string where = uri_of(bucket, key);
  for (const auto& [k, v] : query) {
    if (key.empty() && k == "prefix") where = uri_of(bucket, v);  // a listing: errors name the prefix
  }

  std::string last_error;
  for (int attempt = 0; attempt < config_.max_attempts; ++attempt) {
    if (attempt > 0) backoff_sleep(attempt, config_.backoff_base_s, config_.backoff_max_s);
    sigv4::Request req{method, path, query, headers, payload_hash};
    const std::string date = amz_now();
    req.headers.emplace_back("host", host);
    req.headers.emplace_back("x-amz-date", date);
    req.headers.emplace_back("x-amz-content-sha256", payload_hash);
    const S3Credentials credentials = credentials_->get();
    if (!credentials.session_token.empty()) req.headers.emplace_back("x-amz-security-token", credentials.session_token);
    const std::string auth = sigv4::authorization(req, credentials, config_.region, "s3", date);

    Exchange x{method, url, {}, payload, {}, &sink, config_.connect_timeout_s, config_.stall_timeout_s};
    for (auto& [k, v] : req.headers) {
      if (k != "host") x.headers.emplace_back(std::move(k), std::move(v));
    }
    x.headers.emplace_back("Authorization", auth);
    ++requests_;
    bool retryable = false;
    util::HttpResponse got = pool_->perform(x, &retryable);
    if (got.status == 0) {
      last_error = fmt::format("{} failed: {}", method, got.transport_error);
      if (retryable) continue;
      throw Error(kS3ClientComponent, fmt::format("{}: {}", where, last_error));
    }
    S3Response response{got.status, std::move(got.body), std::move(got.headers)};
    if (response.status >= 200 && response.status < 300) return response;
    // The body is only read for the error's code and message (a malformed one gives neither).
    const auto [code, message] = aws::error_code_message(response.body);
    last_error = fmt::format("{} HTTP {}{}{}", method, response.status, code.empty() ? "" : " " + code,
                             message.empty() ? "" : ": " + message);
    if (retryable_s3(response.status, code)) continue;
    if (code == "ExpiredToken" || code == "TokenRefreshRequired") {
      credentials_->expired_by_server();  // temporary credentials the server saw expire first: fetch, try again
      continue;
    }
    if (response.status == 403 || code == "InvalidAccessKeyId" || code == "SignatureDoesNotMatch") {
      last_error += fmt::format(" (bucket {}; credentials from {})", bucket, credentials.source);
    }
    response.body = last_error;  // callers that accept a status (404 on HEAD) read the summary
    if (response.status == 404 && (method == "HEAD" || method == "DELETE")) return response;
    if (response.status == 416 && method == "GET") return response;  // a range of an empty object
    // A conditional write's condition failed, or the store has no conditional writes (501): the caller decides.
    const bool conditional = std::any_of(headers.begin(), headers.end(), [](const auto& h) {
      return h.first == "If-Match" || h.first == "If-None-Match";
    });
    if (conditional && method == "PUT" && (response.status == 412 || response.status == 501)) return response;
    throw Error(kS3ClientComponent, fmt::format("{}: {}", where, last_error));
  }
  throw Error(kS3ClientComponent,
              fmt::format("{}: {} (gave up after {} attempts)", where, last_error, config_.max_attempts));
}

std::string S3Client::get(const std::string& bucket, const std::string& key) {
  return send("GET", bucket, key, {}, {}, {}).body;
}

std::string S3Client::get_range(const std::string& bucket, const std::string& key, uint64_t offset, uint64_t length) {
  if (length == 0) return {};
  S3Response r = send("GET", bucket, key, {}, {{"range", fmt::format("bytes={}-{}", offset, offset + length - 1)}}, {});
  if (r.body.size() != length) {
    throw Error(kS3ClientComponent, fmt::format("{}: asked for {} bytes at {}, got {} (the object is shorter)",
                                                uri_of(bucket, key), length, offset, r.body.size()));
  }
  return std::move(r.body);
}

void S3Client::download(const std::string& bucket, const std::string& key, const std::string& path) {
  // The first range also gives the size (Content-Range: bytes 0-N/TOTAL) and the ETag that pins the other ranges to
  // the same version of the object; an empty object answers 416.
  ranged_download(
      uri_of(bucket, key), path, config_.part_size, config_.parallelism,
      [&](uint64_t first, uint64_t last, const std::string& etag, const BodySink& sink) {
        std::vector<std::pair<std::string, std::string>> headers{{"range", fmt::format("bytes={}-{}", first, last)}};
        if (!etag.empty()) headers.emplace_back("if-match", etag);
        const S3Response r = send("GET", bucket, key, {}, headers, {}, sink);
        return RangeAnswer{r.status, r.header("content-range"), r.header("etag")};
      });
}

void S3Client::put(const std::string& bucket, const std::string& key, std::string_view data) {
  if (data.size() <= config_.multipart_threshold) {
    put_single(bucket, key, data);
    return;
  }
  upload_parts(bucket, key, data.size(),
               [&](uint64_t offset, uint64_t length, std::string&) { return data.substr(offset, length); });
}

void S3Client::put_parts(const std::string& bucket, const std::string& key,
                         const std::vector<std::string_view>& parts) {
  const Concatenation object(parts);
  const uint64_t size = object.size();
  const auto gather = [&](uint64_t offset, uint64_t length, std::string& scratch) {
    return object.contiguous(offset, length, scratch);
  };
  if (parts.empty()) {
    put_single(bucket, key, {});
    return;
  }
  if (size <= config_.multipart_threshold) {
    std::string scratch;
    put_single(bucket, key, gather(0, size, scratch));
    return;
  }
  upload_parts(bucket, key, size, gather);
}

void S3Client::upload_file(const std::string& path, const std::string& bucket, const std::string& key) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(kS3ClientComponent, fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  const off_t size = ::lseek(fd, 0, SEEK_END);
  const auto read_part = [&](uint64_t offset, uint64_t length, std::string& buf) -> std::string_view {
    buf.resize(length);
    uint64_t done = 0;
    while (done < length) {
      const ssize_t n = ::pread(fd, buf.data() + done, length - done, static_cast<off_t>(offset + done));
      if (n <= 0)
        throw Error(kS3ClientComponent,
                    fmt::format("{}: read failed at {}: {}", path, offset + done, std::strerror(errno)));
      done += static_cast<uint64_t>(n);
    }
    return buf;
  };
  if (static_cast<uint64_t>(size) <= config_.multipart_threshold) {
    std::string scratch;
    put_single(bucket, key, read_part(0, static_cast<uint64_t>(size), scratch));
    return;
  }
  upload_parts(bucket, key, static_cast<uint64_t>(size), read_part);
}

std::optional<std::string> S3Client::put_if(const std::string& bucket, const std::string& key, std::string_view data,
                                            const std::optional<std::string>& expected, bool* unsupported) {
  *unsupported = conditional_puts_unsupported_;
  if (*unsupported) return std::nullopt;
  std::vector<std::pair<std::string, std::string>> headers;
  if (expected) {
    headers.emplace_back("If-Match", "\"" + *expected + "\"");
  } else {
    headers.emplace_back("If-None-Match", "*");
  }
  const S3Response r = send("PUT", bucket, key, {}, std::move(headers), data);
  if (r.status == 412) return std::nullopt;
  if (r.status == 501) {  // NotImplemented: a store without conditional PUTs (older S3-compatible servers)
    if (!conditional_puts_unsupported_.exchange(true)) {
      spdlog::warn(
          "[s3] {}: the store has no conditional PUT (HTTP 501); comparing its ETag before each write "
          "instead, which narrows a race between writers without closing it",
          uri_of(bucket, key));
    }
    *unsupported = true;
    return std::nullopt;
  }
  std::string etag;
  for (const auto& [k, v] : r.headers) {
    if (k == "etag") etag = v;
  }
  etag.erase(std::remove(etag.begin(), etag.end(), '"'), etag.end());
  return etag;
}

void S3Client::put_single(const std::string& bucket, const std::string& key, std::string_view data) {
  std::vector<std::pair<std::string, std::string>> headers;
  if (config_.request_checksums) {
    headers.emplace_back("x-amz-checksum-crc32", crc32_base64(data));
    headers.emplace_back("x-amz-sdk-checksum-algorithm", "CRC32");  // as the SDKs send it (some stores read it)
  }
  send("PUT", bucket, key, {}, std::move(headers), data);
}

void S3Client::upload_parts(const std::string& bucket, const std::string& key, uint64_t size,
                            const std::function<std::string_view(uint64_t, uint64_t, std::string&)>& read_part) {
  const std::string where = uri_of(bucket, key);
  uint64_t part = config_.part_size;
  while ((size + part - 1) / part > 10000) part *= 2;  // S3 allows 10,000 parts
  // With checksums on, the upload declares CRC32 and each part carries its own, as the AWS SDKs do: the store checks
  // every part as it arrives and keeps a composite checksum of the object.
  std::vector<std::pair<std::string, std::string>> create_headers;
  if (config_.request_checksums) create_headers.emplace_back("x-amz-checksum-algorithm", "CRC32");
  const std::string upload_id =
      util::parse_xml(send("POST", bucket, key, {{"uploads", ""}}, std::move(create_headers), {}).body,
                      kS3ClientComponent, where + ": CreateMultipartUpload's answer")
          .child_text("UploadId");
  if (upload_id.empty())
    throw Error(kS3ClientComponent, fmt::format("{}: CreateMultipartUpload returned no UploadId", where));
  const size_t parts = static_cast<size_t>((size + part - 1) / part);
  std::vector<std::string> etags(parts), crcs(parts);
  try {
    parallel_for(parts, config_.parallelism, [&](size_t i) {
      const uint64_t begin = i * part, length = std::min(size - begin, part);
      std::string scratch;
      const std::string_view body = read_part(begin, length, scratch);
      std::vector<std::pair<std::string, std::string>> headers;
      if (config_.request_checksums) {
        crcs[i] = crc32_base64(body);
        headers.emplace_back("x-amz-checksum-crc32", crcs[i]);
        headers.emplace_back("x-amz-sdk-checksum-algorithm", "CRC32");
      }
      const S3Response r = send("PUT", bucket, key, {{"partNumber", std::to_string(i + 1)}, {"uploadId", upload_id}},
                                std::move(headers), body);
      etags[i] = r.header("etag");
      if (etags[i].empty()) throw Error(kS3ClientComponent, fmt::format("{}: part {} returned no ETag", where, i + 1));
    });
    std::string xml = "<CompleteMultipartUpload>";
    for (size_t i = 0; i < parts; ++i) {
      const std::string crc = crcs[i].empty() ? "" : "<ChecksumCRC32>" + crcs[i] + "</ChecksumCRC32>";
      xml += fmt::format("<Part>{}<ETag>{}</ETag><PartNumber>{}</PartNumber></Part>", crc, util::xml_escape(etags[i]),
                         i + 1);
    }
    xml += "</CompleteMultipartUpload>";
    const S3Response r =
        send("POST", bucket, key, {{"uploadId", upload_id}}, {{"content-type", "application/xml"}}, xml);
    // CompleteMultipartUpload can fail with 200 and an <Error> body.
    const util::XmlElement done =
        util::parse_xml(r.body, kS3ClientComponent, where + ": CompleteMultipartUpload's answer");
    if (done.name == "Error") {
      throw Error(kS3ClientComponent, fmt::format("{}: CompleteMultipartUpload failed: {} {}", where,
                                                  done.child_text("Code"), done.child_text("Message")));
    }
  } catch (...) {
    try {
      send("DELETE", bucket, key, {{"uploadId", upload_id}}, {}, {});
    } catch (const std::exception& e) {
      spdlog::warn("[s3] {}: could not abort multipart upload: {}", where, e.what());
    }
    throw;
  }
}

std::vector<S3Client::Listed> S3Client::list(const std::string& bucket, const std::string& prefix) {
  std::vector<Listed> out;
  std::string token;
  while (true) {
    std::vector<std::pair<std::string, std::string>> query{{"list-type", "2"}, {"prefix", prefix}};
    if (!token.empty()) query.emplace_back("continuation-token", token);
    const S3Response r = send("GET", bucket, "", query, {}, {});
    const util::XmlElement page =
        util::parse_xml(r.body, kS3ClientComponent, fmt::format("{}: a listing", uri_of(bucket, prefix)));
    for (const util::XmlElement* item : page.children_named("Contents")) {
      Listed l;
      l.key = item->child_text("Key");
      l.size = byte_count(item->child_text("Size"), uri_of(bucket, l.key), "a listing Size", kS3ClientComponent);
      l.etag = strip_quotes(item->child_text("ETag"));
      out.push_back(std::move(l));
    }
    if (page.child_text("IsTruncated") != "true") break;
    token = page.child_text("NextContinuationToken");
    if (token.empty()) break;
  }
  std::sort(out.begin(), out.end(), [](const Listed& a, const Listed& b) { return a.key < b.key; });
  return out;
}

void S3Client::remove(const std::string& bucket, const std::string& key) {
  send("DELETE", bucket, key, {}, {}, {});
}

std::optional<S3Client::Listed> S3Client::head(const std::string& bucket, const std::string& key) {
  const S3Response r = send("HEAD", bucket, key, {}, {}, {});
  if (r.status == 404) return std::nullopt;
  Listed l;
  l.key = key;
  l.size = byte_count(r.header("content-length"), uri_of(bucket, key), "a Content-Length", kS3ClientComponent);
  l.etag = strip_quotes(r.header("etag"));
  return l;
}

}  // namespace tessera::storage
