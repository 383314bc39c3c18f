// AWS Signature Version 4: canonical request, string to sign, signing key and the Authorization header.
#include <fmt/format.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cctype>

#include "tessera/storage/s3.h"
#include "tessera/util/hashing.h"
#include "tessera/util/http.h"

namespace tessera::storage::sigv4 {
namespace {

std::string to_hex(const unsigned char* bytes, size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kHex[bytes[i] >> 4];
    out[2 * i + 1] = kHex[bytes[i] & 15];
  }
  return out;
}

std::string hmac(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
       data.size(), out, &len);
  return {reinterpret_cast<const char*>(out), len};
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// Header values are trimmed and inner runs of spaces collapsed.
std::string trim_value(std::string_view v) {
  std::string out;
  bool space = false;
  for (const char c : v) {
    if (c == ' ' || c == '\t') {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

}  // namespace

std::string sha256_hex(std::string_view data) {
  return util::sha256_hex({data});
}

std::string canonical_request(const Request& request) {
  std::vector<std::pair<std::string, std::string>> query;
  query.reserve(request.query.size());
  for (const auto& [k, v] : request.query) query.emplace_back(util::url_encode(k, false), util::url_encode(v, false));
  std::sort(query.begin(), query.end());
  std::string canonical_query;
  for (const auto& [k, v] : query) canonical_query += (canonical_query.empty() ? "" : "&") + k + "=" + v;

  std::vector<std::pair<std::string, std::string>> headers;
  headers.reserve(request.headers.size());
  for (const auto& [k, v] : request.headers) headers.emplace_back(lower(k), trim_value(v));
  std::sort(headers.begin(), headers.end());
  std::string canonical_headers, signed_headers;
  for (const auto& [k, v] : headers) {
    canonical_headers += k + ":" + v + "\n";
    signed_headers += (signed_headers.empty() ? "" : ";") + k;
  }
  return fmt::format("{}\n{}\n{}\n{}\n{}\n{}", request.method, request.path, canonical_query, canonical_headers,
                     signed_headers, request.payload_hash);
}

std::string authorization(const Request& request, const S3Credentials& credentials, const std::string& region,
                          const std::string& service, const std::string& amz_date) {
  const std::string date = amz_date.substr(0, 8);
  const std::string scope = fmt::format("{}/{}/{}/aws4_request", date, region, service);
  const std::string canonical = canonical_request(request);
  const std::string to_sign = fmt::format("AWS4-HMAC-SHA256\n{}\n{}\n{}", amz_date, scope, sha256_hex(canonical));
  const std::string k_date = hmac("AWS4" + credentials.secret_access_key, date);
  const std::string k_signing = hmac(hmac(hmac(k_date, region), service), "aws4_request");
  const std::string mac = hmac(k_signing, to_sign);
  // The signed header list is the canonical request's line before the payload hash.
  const size_t end = canonical.rfind('\n');
  const size_t begin = canonical.rfind('\n', end - 1) + 1;
  const std::string signed_headers = canonical.substr(begin, end - begin);
  return fmt::format("AWS4-HMAC-SHA256 Credential={}/{}, SignedHeaders={}, Signature={}", credentials.access_key_id,
                     scope, signed_headers, to_hex(reinterpret_cast<const unsigned char*>(mac.data()), mac.size()));
}

}  // namespace tessera::storage::sigv4
