// OCI Object Storage (oci://bucket/path, oci://bucket@namespace/path) through its native REST API, signed as the OCI
// SDKs sign (HTTP Signatures with the API key of ~/.oci/config, RSA-SHA256), over the pooled transport
// (http_pool.h). Objects up to 128 MiB go in one PutObject; larger ones as a multipart upload (parts in parallel,
// visible only once committed, aborted on failure). Downloads are parallel ranges pinned with If-Match.
#include <fmt/format.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/sha.h>
#include <openssl/x509.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "backend.h"
#include "http_pool.h"
#include "tessera/storage/aws_files.h"
#include "tessera/storage/s3.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"
#include "tessera/util/http.h"

namespace tessera::storage {
namespace {

constexpr const char* kOciComponent = "oci";

std::string expand_home(const std::string& path) {
  if (path.rfind("~/", 0) != 0) return path;
  return aws::env("HOME") + path.substr(1);
}

std::string sha256_base64(std::string_view data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  return base64_encode(std::string_view(reinterpret_cast<const char*>(digest), SHA256_DIGEST_LENGTH));
}

struct OciConfig;
std::string session_token(const OciConfig& c);

struct OciConfig {
  std::string endpoint;    // scheme://host[:port], no trailing '/'
  std::string host;        // what the Host header (and the signature) carries
  std::string key_id;      // tenancy/user/fingerprint (an API key)
  std::string token_file;  // a session's security_token_file (`oci session authenticate`): keyId "ST$<token>"
  std::shared_ptr<CredentialProvider> principal;  // an instance principal's tokens (session_token), keyId "ST$<token>"
  std::shared_ptr<EVP_PKEY> key;
  // A resource principal's private key as a file the platform rewrites with its token: read at every signing, with
  // its passphrase (the text, or a file's when the key is a file).
  std::string key_file, key_pass;
  std::string refresh_hint;    // how an expired token is renewed, for a 401's message
  std::string source;          // the config file and profile, for messages
  std::string namespace_name;  // resolved on first use when a URI does not name it
  int max_attempts = 5;
  double backoff_base_s = 0.1, backoff_max_s = 5.0;
  long stall_timeout_s = 30;                    // NOLINT(google-runtime-int)
  uint64_t part_size = 16ULL << 20;             // a range of a download, a part of a multipart upload
  uint64_t multipart_threshold = 128ULL << 20;  // larger uploads go in parts (the SDK's UploadManager's default)
  int parallelism = 8;
};

// The session token in `c.token_file`, read at every signing: `oci session refresh` rewrites the file in place.
// A security token as it may stand in a signature's keyId="ST$<token>": a JWT's characters (base64url, '.', and
// base64's '+', '/', '='), nothing that could end the quoted value or the header.
bool token_text(std::string_view token) {
  return !token.empty() && token.size() <= 65536 && std::all_of(token.begin(), token.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) ||
           std::string_view("-_.+/=").find(ch) != std::string_view::npos;
  });
}

std::string session_token(const OciConfig& c) {
  std::string token = util::read_file(c.token_file, kOciComponent);
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
  if (!token_text(token)) {
    throw ConfigError(kOciComponent, fmt::format("{}: not a session token (the security_token_file `oci session "
                                                 "authenticate` writes, or a resource principal's token)",
                                                 c.token_file));
  }
  return token;
}

// The Authorization header the OCI SDKs send (HTTP Signatures, rsa-sha256) for a request to `host`: date,
// (request-target) and host signed (the auth service's federation request: without host), and for a JSON body also
// content-length, content-type and x-content-sha256; the `date` header (and a JSON body's two) are added to
// `headers`. `source` names the key in errors.
std::string http_signature(EVP_PKEY* key, const std::string& key_id, const std::string& host, const std::string& method,
                           const std::string& path_and_query, std::vector<std::pair<std::string, std::string>>& headers,
                           std::string_view json_body, const std::string& source, bool with_host = true) {
  const std::string date = http_date_now();
  headers.emplace_back("date", date);
  std::string lower = method;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  std::string names = with_host ? "date (request-target) host" : "date (request-target)";
  std::string text = fmt::format("date: {}\n(request-target): {} {}", date, lower, path_and_query);
  if (with_host) text += "\nhost: " + host;
  if (json_body.data() != nullptr) {
    const std::string sha = sha256_base64(json_body);
    headers.emplace_back("content-type", "application/json");
    headers.emplace_back("x-content-sha256", sha);
    names += " content-length content-type x-content-sha256";
    text += fmt::format("\ncontent-length: {}\ncontent-type: application/json\nx-content-sha256: {}", json_body.size(),
                        sha);
  }
  const std::optional<std::string> signature = rsa_sha256_sign(key, text);
  if (!signature) throw Error(kOciComponent, fmt::format("signing with {} failed", source));
  return fmt::format(R"(Signature algorithm="rsa-sha256",headers="{}",keyId="{}",signature="{}",version="1")", names,
                     key_id, base64_encode(*signature));
}

// ---- instance principals (OCI_CLI_AUTH=instance_principal), as the SDKs' InstancePrincipalsSecurityTokenSigner:
// the instance's leaf certificate, its private key and the intermediate certificate come from the instance metadata
// service (OCI_METADATA_BASE_URL, else http://169.254.169.254/opc/v2; "Authorization: Bearer Oracle"); the region's
// auth service (TESSERA_OCI_AUTH_ENDPOINT_URL, else https://auth.<region>.oraclecloud.com) exchanges them, in a
// request signed with the leaf key as <tenancy>/fed-x509/<SHA-1 fingerprint>, for a token bound to a session key of
// this process; requests are then signed with that key as "ST$<token>", and the token is fetched again (with a
// fresh leaf certificate, which the instance rotates) before its `exp`.

std::string metadata_base() {
  std::string base = aws::env("OCI_METADATA_BASE_URL");
  if (base.empty()) base = "http://169.254.169.254/opc/v2";
  while (!base.empty() && base.back() == '/') base.pop_back();
  return base;
}

std::string metadata_get(const std::string& base, const std::string& path) {
  util::HttpRequest req;
  req.url = base + path;
  req.headers = {{"Authorization", "Bearer Oracle"}};
  req.connect_timeout_s = 5;
  req.timeout_s = 30;
  const util::HttpResponse r = util::http_request(req);
  if (r.status != 200) {
    throw Error(kOciComponent,
                fmt::format("instance principal: the instance metadata service answered {} for {} (OCI_CLI_AUTH="
                            "instance_principal works on an OCI compute instance; OCI_METADATA_BASE_URL moves it)",
                            r.status == 0 ? r.transport_error : fmt::format("HTTP {}", r.status), req.url));
  }
  return r.body;
}

// A PEM's base64 on one line, as the auth service takes certificates and keys.
std::string pem_body(std::string_view pem) {
  std::string out;
  size_t at = 0;
  while (at < pem.size()) {
    size_t end = pem.find('\n', at);
    if (end == std::string_view::npos) end = pem.size();
    std::string_view line = pem.substr(at, end - at);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.rfind("-----", 0) != 0) out += line;
    at = end + 1;
  }
  return out;
}

// The tenancy in a leaf certificate's subject (opc-tenant:<ocid>, or opc-identity:<ocid>) and its SHA-1 fingerprint
// (upper-case hex pairs joined by ':'), as the SDKs read them.
std::pair<std::string, std::string> leaf_identity(const std::string& pem, const std::string& where) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr), X509_free);
  if (!cert) throw Error(kOciComponent, fmt::format("instance principal: {} is not a PEM certificate", where));
  std::string tenancy;
  const X509_NAME* subject = X509_get_subject_name(cert.get());
  for (int i = 0; i < X509_NAME_entry_count(subject) && tenancy.empty(); ++i) {
    const ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, i));
    const std::string value(reinterpret_cast<const char*>(ASN1_STRING_get0_data(data)),
                            static_cast<size_t>(ASN1_STRING_length(data)));
    for (const char* prefix : {"opc-tenant:", "opc-identity:"}) {
      if (value.rfind(prefix, 0) == 0) tenancy = value.substr(std::string_view(prefix).size());
    }
  }
  if (tenancy.empty()) {
    throw Error(kOciComponent, fmt::format("instance principal: the certificate of {} names no tenancy (no "
                                           "opc-tenant: in its subject)",
                                           where));
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  X509_digest(cert.get(), EVP_sha1(), digest, &n);
  std::string fingerprint;
  for (unsigned int i = 0; i < n; ++i) fingerprint += fmt::format("{}{:02X}", i == 0 ? "" : ":", digest[i]);
  return {tenancy, fingerprint};
}

// When a JWT expires: its payload's `exp` (seconds since the epoch); an hour from now when it does not say.
std::chrono::system_clock::time_point jwt_expiration(const std::string& token) {
  const size_t first = token.find('.'), second = token.find('.', first + 1);
  const auto fallback = std::chrono::system_clock::now() + std::chrono::hours(1);
  if (first == std::string::npos || second == std::string::npos) return fallback;
  std::string payload = token.substr(first + 1, second - first - 1);
  std::replace(payload.begin(), payload.end(), '-', '+');
  std::replace(payload.begin(), payload.end(), '_', '/');
  while (payload.size() % 4 != 0) payload += '=';
  const auto decoded = base64_decode(payload);
  const auto j = decoded ? nlohmann::json::parse(*decoded, nullptr, false) : nlohmann::json();
  if (!j.is_object() || !j.contains("exp") || !j["exp"].is_number()) return fallback;
  return std::chrono::system_clock::time_point(std::chrono::seconds(j["exp"].get<int64_t>()));
}

// The region (from the metadata service), a fresh session key in `c.key` and the token provider in `c.principal`.
// Returns the region.
std::string use_instance_principal(OciConfig& c) {
  const std::string base = metadata_base();
  std::string region = metadata_get(base, "/instance/canonicalRegionName");
  while (!region.empty() && std::isspace(static_cast<unsigned char>(region.back()))) region.pop_back();
  // (it becomes a host name: objectstorage.<region>.oraclecloud.com)
  if (region.empty() || region.size() > 64 || !std::all_of(region.begin(), region.end(), [](char ch) {
        return std::islower(static_cast<unsigned char>(ch)) || std::isdigit(static_cast<unsigned char>(ch)) ||
               ch == '-';
      })) {
    throw Error(kOciComponent, fmt::format("instance principal: {}/instance/canonicalRegionName answered \"{}\", not "
                                           "a region name",
                                           base, region.substr(0, 64)));
  }
  c.source = fmt::format("the instance principal (metadata service {})", base);
  EVP_PKEY* session = EVP_RSA_gen(2048);
  if (session == nullptr) throw Error(kOciComponent, "instance principal: cannot make a session key");
  c.key = std::shared_ptr<EVP_PKEY>(session, EVP_PKEY_free);
  std::unique_ptr<BIO, decltype(&BIO_free)> out(BIO_new(BIO_s_mem()), BIO_free);
  PEM_write_bio_PUBKEY(out.get(), session);
  char* data = nullptr;
  const long size = BIO_get_mem_data(out.get(), &data);  // NOLINT(google-runtime-int): OpenSSL's type
  const std::string public_key = pem_body(std::string_view(data, static_cast<size_t>(size)));
  std::string auth = aws::env("TESSERA_OCI_AUTH_ENDPOINT_URL");
  if (auth.empty()) auth = fmt::format("https://auth.{}.oraclecloud.com", region);
  while (!auth.empty() && auth.back() == '/') auth.pop_back();
  const auto parts = util::parse_url(auth);
  if (!parts) throw ConfigError(kOciComponent, fmt::format("OCI auth endpoint {}: not an http(s) URL", auth));
  const std::string host = parts->authority, url = fmt::format("{}://{}/v1/x509", parts->scheme, parts->authority);
  const std::string source = c.source;
  c.principal = refreshing_credentials(source, [=] {
    const std::string leaf = metadata_get(base, "/identity/cert.pem");
    const std::string intermediate = metadata_get(base, "/identity/intermediate.pem");
    const std::shared_ptr<EVP_PKEY> leaf_key = rsa_key_from_pem(metadata_get(base, "/identity/key.pem"), "");
    if (!leaf_key)
      throw Error(kOciComponent, fmt::format("instance principal: {}/identity/key.pem is not an RSA key", base));
    const auto [tenancy, fingerprint] = leaf_identity(leaf, base + "/identity/cert.pem");
    const std::string body = nlohmann::json{{"certificate", pem_body(leaf)},
                                            {"publicKey", public_key},
                                            {"intermediateCertificates", {pem_body(intermediate)}}}
                                 .dump();
    util::HttpRequest req;
    req.method = "POST";
    req.url = url;
    req.body = body;
    req.headers.emplace_back("Authorization",
                             http_signature(leaf_key.get(), fmt::format("{}/fed-x509/{}", tenancy, fingerprint), host,
                                            "POST", "/v1/x509", req.headers, body, source, /*with_host=*/false));
    const util::HttpResponse r = util::http_request(req);
    const auto j = nlohmann::json::parse(r.body, nullptr, false);
    if (r.status != 200 || !j.is_object() || !j.contains("token") || !j["token"].is_string() ||
        !token_text(j["token"].get<std::string>())) {
      const std::string said = j.is_object() && j.contains("message") && j["message"].is_string()
                                   ? ": " + j["message"].get<std::string>().substr(0, 300)
                                   : "";
      throw Error(kOciComponent,
                  fmt::format("instance principal: the auth service at {} gave no token ({}{})", url,
                              r.status == 0 ? r.transport_error : fmt::format("HTTP {}", r.status), said));
    }
    S3Credentials token;
    token.session_token = j["token"].get<std::string>();
    token.expiration = jwt_expiration(token.session_token);
    token.source = source;
    return token;
  });
  return region;
}

// ---- resource principals (OCI_CLI_AUTH=resource_principal: OCI Functions, Data Science jobs and notebooks), version
// 2.2 as the SDKs' EphemeralResourcePrincipalSigner reads it: OCI_RESOURCE_PRINCIPAL_RPST (the session token) and
// OCI_RESOURCE_PRINCIPAL_PRIVATE_PEM (its key, with OCI_RESOURCE_PRINCIPAL_PRIVATE_PEM_PASSPHRASE), each the value
// itself or an absolute path to a file the platform rewrites (then read at every signing), and
// OCI_RESOURCE_PRINCIPAL_REGION. The older versions (1.1, 2.1) fetch tokens from endpoints and are refused.
std::string use_resource_principal(OciConfig& c) {
  const std::string version = aws::env("OCI_RESOURCE_PRINCIPAL_VERSION");
  if (version != "2.2") {
    throw ConfigError(kOciComponent, fmt::format("OCI_CLI_AUTH=resource_principal: OCI_RESOURCE_PRINCIPAL_VERSION is "
                                                 "\"{}\"; Tessera takes version 2.2 (the session token and its key in "
                                                 "the environment, as OCI Functions and Data Science set them)",
                                                 version.substr(0, 20)));
  }
  const auto need = [](const char* variable) {
    const std::string value = aws::env(variable);
    if (value.empty()) {
      throw ConfigError(kOciComponent,
                        fmt::format("OCI_CLI_AUTH=resource_principal: {} is not set (resource principal 2.2 needs "
                                    "OCI_RESOURCE_PRINCIPAL_RPST, _PRIVATE_PEM and _REGION)",
                                    variable));
    }
    return value;
  };
  const std::string rpst = need("OCI_RESOURCE_PRINCIPAL_RPST"), pem = need("OCI_RESOURCE_PRINCIPAL_PRIVATE_PEM");
  const std::string region = need("OCI_RESOURCE_PRINCIPAL_REGION");
  std::string pass = aws::env("OCI_RESOURCE_PRINCIPAL_PRIVATE_PEM_PASSPHRASE");
  c.source = "the resource principal (OCI_RESOURCE_PRINCIPAL_RPST)";
  if (rpst.front() == '/') {
    c.refresh_hint = fmt::format("; the platform renews the token in {}", rpst);
    c.token_file = rpst;
    (void)session_token(c);  // readable now, not at the first request
  } else if (token_text(rpst)) {
    c.key_id = "ST$" + rpst;
  } else {
    throw ConfigError(kOciComponent, "OCI_RESOURCE_PRINCIPAL_RPST: neither a session token nor an absolute path");
  }
  if (pem.front() == '/') {
    if (!pass.empty() && pass.front() == '/') pass = util::read_file(pass, kOciComponent);
    c.key_file = pem;
    c.key_pass = pass;
    c.key = rsa_key_from_pem(util::read_file(pem, kOciComponent), pass);
  } else {
    c.key = rsa_key_from_pem(pem, pass);
  }
  if (!c.key) {
    throw ConfigError(
        kOciComponent,
        fmt::format("OCI_RESOURCE_PRINCIPAL_PRIVATE_PEM{}: not an RSA private key in PEM{}",
                    pem.front() == '/' ? " (" + pem + ")" : "", pass.empty() ? "" : " or a wrong passphrase"));
  }
  if (region.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") != std::string::npos ||
      region.find('-') == std::string::npos) {
    throw ConfigError(kOciComponent, fmt::format("OCI_RESOURCE_PRINCIPAL_REGION \"{}\": not a region's canonical name "
                                                 "(like us-ashburn-1)",
                                                 region.substr(0, 40)));
  }
  return region;
}

// The API key of a profile in the OCI config file (OCI_CONFIG_FILE or the CLI's OCI_CLI_CONFIG_FILE, else
// ~/.oci/config; profile OCI_CLI_PROFILE, else DEFAULT, whose keys every other profile inherits, as the SDKs read it),
// or the session of a profile with a security_token_file (`oci session authenticate`; its key_file is the session's
// key).
// The API key or session of the config file's profile into `c`; returns the profile's region.
std::string api_key_or_session(OciConfig& c) {
  std::string file = aws::env("OCI_CONFIG_FILE");
  if (file.empty()) file = aws::env("OCI_CLI_CONFIG_FILE");
  if (file.empty()) file = expand_home("~/.oci/config");
  const std::string profile = aws::env("OCI_CLI_PROFILE").empty() ? "DEFAULT" : aws::env("OCI_CLI_PROFILE");
  auto settings = aws::ini_section(file, "DEFAULT");
  for (auto& [k, v] : aws::ini_section(file, profile)) settings[k] = v;
  const bool session = settings.count("security_token_file") > 0 && !settings.at("security_token_file").empty();
  c.source = fmt::format("the {} of {} [{}]", session ? "session token" : "API key", file, profile);
  const auto need = [&](const char* key) {
    if (settings.count(key) == 0 || settings.at(key).empty()) {
      throw ConfigError(kOciComponent, fmt::format("no OCI credentials: {} [{}] has no `{}` (an API key profile needs "
                                                   "user, fingerprint, tenancy, region and key_file; a session "
                                                   "profile security_token_file, key_file and region)",
                                                   file, profile, key));
    }
    return settings.at(key);
  };
  if (session) {
    c.refresh_hint = "; an expired session needs `oci session refresh`";
    c.token_file = expand_home(settings.at("security_token_file"));
    (void)session_token(c);  // readable now, not at the first request
  } else {
    const std::string user = need("user"), fingerprint = need("fingerprint"), tenancy = need("tenancy");
    c.key_id = fmt::format("{}/{}/{}", tenancy, user, fingerprint);
  }
  const std::string key_file = expand_home(need("key_file"));
  const std::string pass = settings.count("pass_phrase") > 0 ? settings.at("pass_phrase") : "";
  c.key = rsa_key_from_pem(util::read_file(key_file, kOciComponent), pass);
  if (!c.key) {
    throw ConfigError(kOciComponent, fmt::format("{}: not an RSA private key in PEM{} (key_file of {} [{}])", key_file,
                                                 pass.empty() ? "" : " or a wrong pass_phrase", file, profile));
  }
  // (the region names the endpoint, unless TESSERA_OCI_ENDPOINT_URL does)
  return aws::env("TESSERA_OCI_ENDPOINT_URL").empty() ? need("region") : std::string();
}

OciConfig oci_config_from_environment() {
  OciConfig c;
  std::string region;
  const std::string auth_kind = aws::env("OCI_CLI_AUTH");
  if (auth_kind == "instance_principal") {
    region = use_instance_principal(c);
  } else if (auth_kind == "resource_principal") {
    region = use_resource_principal(c);
  } else if (!auth_kind.empty() && auth_kind != "api_key" && auth_kind != "security_token") {
    throw ConfigError(kOciComponent, fmt::format("OCI_CLI_AUTH={}: Tessera signs with api_key, security_token, "
                                                 "instance_principal or resource_principal",
                                                 auth_kind));
  } else {
    region = api_key_or_session(c);
  }
  std::string endpoint = aws::env("TESSERA_OCI_ENDPOINT_URL");
  if (endpoint.empty()) endpoint = fmt::format("https://objectstorage.{}.oraclecloud.com", region);
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  const auto parts = util::parse_url(endpoint);
  if (!parts || (parts->scheme != "http" && parts->scheme != "https")) {
    throw ConfigError(kOciComponent, fmt::format("OCI endpoint {}: not an http:// or https:// URL", endpoint));
  }
  c.endpoint = fmt::format("{}://{}", parts->scheme, parts->authority);
  c.host = parts->authority;
  c.max_attempts = env_int("TESSERA_OCI_MAX_ATTEMPTS", c.max_attempts, 1, 100, kOciComponent);
  c.parallelism = env_int("TESSERA_OCI_PARALLELISM", c.parallelism, 1, 256, kOciComponent);
  c.stall_timeout_s =
      env_int("TESSERA_OCI_STALL_TIMEOUT_S", static_cast<int>(c.stall_timeout_s), 1, 3600, kOciComponent);
  c.part_size = static_cast<uint64_t>(env_int("TESSERA_OCI_PART_SIZE_MB", 16, 10, 50000, kOciComponent)) << 20;
  c.multipart_threshold =
      static_cast<uint64_t>(env_int("TESSERA_OCI_MULTIPART_THRESHOLD_MB", 128, 10, 50000, kOciComponent)) << 20;
  return c;
}

class OciBackend final : public Backend {
 public:
  std::string get(const Uri& u) override { return send(u.str(), "GET", object_path(u), {}, {}).body; }

  std::string get_range(const Uri& u, uint64_t offset, uint64_t length) override {
    if (length == 0) return {};
    const std::string uri = u.str();
    util::HttpResponse r =
        send(uri, "GET", object_path(u), {{"range", fmt::format("bytes={}-{}", offset, offset + length - 1)}}, {});
    if (r.body.size() != length) {
      throw Error(kOciComponent, fmt::format("{}: asked for {} bytes at {}, got {} (the object is shorter)", uri,
                                             length, offset, r.body.size()));
    }
    return std::move(r.body);
  }

  void download(const Uri& u, const std::string& local_path) override {
    const OciConfig& c = config();
    const std::string uri = u.str(), path = object_path(u);
    ranged_download(
        uri, local_path, c.part_size, c.parallelism,
        [&](uint64_t first, uint64_t last, const std::string& etag, const BodySink& sink) {
          std::vector<std::pair<std::string, std::string>> headers{{"range", fmt::format("bytes={}-{}", first, last)}};
          if (!etag.empty()) headers.emplace_back("if-match", etag);
          const util::HttpResponse r = send(uri, "GET", path, headers, {}, &sink);
          return RangeAnswer{r.status, r.header("content-range"), r.header("etag")};
        });
  }

  void put_parts(const Uri& u, const std::vector<std::string_view>& parts) override {
    const Concatenation object(parts);
    upload(u, object.size(), [&](uint64_t offset, uint64_t length) { return object.views(offset, length); });
  }

  // One PutObject with if-match (or if-none-match: *): IfMatchFailed / IfNoneMatchFailed is a refusal.
  std::optional<std::string> put_if(const Uri& u, std::string_view data,
                                    const std::optional<std::string>& expected) override {
    std::vector<std::pair<std::string, std::string>> headers{{"content-type", "application/octet-stream"}};
    headers.emplace_back(expected ? "if-match" : "if-none-match", expected ? *expected : "*");
    const util::HttpResponse r = send(u.str(), "PUT", object_path(u), headers, {data});
    if (r.status < 200 || r.status >= 300) return std::nullopt;
    return r.header("etag");
  }

  void upload_file(const std::string& local_path, const Uri& u) override {
    const MappedFile file(local_path, kOciComponent);
    put_parts(u, {file.bytes()});
  }

  std::vector<ObjectInfo> list(const Uri& prefix) override {
    const std::string uri = prefix.str();
    const std::string base = uri.substr(0, uri.size() - prefix.key.size());  // oci://bucket[@ns]/
    std::vector<ObjectInfo> out;
    std::string start;
    do {
      std::string path =
          fmt::format("{}/o?fields=name%2Csize%2Cetag&prefix={}", bucket_path(prefix), util::url_encode(prefix.key));
      if (!start.empty()) path += "&start=" + util::url_encode(start);
      const util::HttpResponse r = send(uri, "GET", path, {}, {});
      const auto j = nlohmann::json::parse(r.body, nullptr, false);
      if (j.is_discarded() || !j.is_object()) {
        throw Error(kOciComponent, fmt::format("{}: a listing that is not a JSON object", uri));
      }
      for (const auto& o : j.value("objects", nlohmann::json::array())) {
        const std::string name = o.value("name", "");
        const uint64_t size = o.contains("size") && o["size"].is_number_unsigned() ? o["size"].get<uint64_t>() : 0;
        out.push_back({base + name, size, o.value("etag", "")});
      }
      start =
          j.contains("nextStartWith") && j["nextStartWith"].is_string() ? j["nextStartWith"].get<std::string>() : "";
    } while (!start.empty());
    std::sort(out.begin(), out.end(), [](const ObjectInfo& a, const ObjectInfo& b) { return a.uri < b.uri; });
    return out;
  }

  void remove(const Uri& u) override { send(u.str(), "DELETE", object_path(u), {}, {}); }

  std::optional<ObjectInfo> stat(const Uri& u) override {
    const std::string uri = u.str();
    const util::HttpResponse r = send(uri, "HEAD", object_path(u), {}, {});
    if (r.status == 404) return std::nullopt;
    return ObjectInfo{uri, byte_count(r.header("content-length"), uri, "a Content-Length", kOciComponent),
                      r.header("etag")};
  }

 private:
  const OciConfig& config() {
    std::call_once(once_, [this] { config_ = oci_config_from_environment(); });
    return config_;
  }

  // The namespace a URI names (bucket@namespace), else the tenancy's, asked of the service once (GetNamespace).
  std::string namespace_of(const Uri& u) {
    const size_t at = u.bucket.find('@');
    if (at != std::string::npos) return u.bucket.substr(at + 1);
    std::call_once(namespace_once_, [&] {
      const util::HttpResponse r = send(u.str(), "GET", "/n/", {}, {});
      const auto j = nlohmann::json::parse(r.body, nullptr, false);
      if (j.is_discarded() || !j.is_string() || j.get<std::string>().empty()) {
        throw Error(kOciComponent, fmt::format("{}: GetNamespace answered '{}', not a namespace", u.str(), r.body));
      }
      namespace_ = j.get<std::string>();
    });
    if (namespace_.empty()) throw Error(kOciComponent, fmt::format("{}: the tenancy's namespace is unknown", u.str()));
    return namespace_;
  }

  std::string bucket_path(const Uri& u) {
    const std::string bucket = u.bucket.substr(0, u.bucket.find('@'));
    if (bucket.empty()) throw ConfigError(kOciComponent, fmt::format("{}: no bucket name", u.str()));
    return fmt::format("/n/{}/b/{}", util::url_encode(namespace_of(u)), util::url_encode(bucket));
  }

  std::string object_path(const Uri& u) { return bucket_path(u) + "/o/" + util::url_encode(u.key); }

  // PutObject up to multipart_threshold; above it a multipart upload: create, the parts in parallel, commit (abort on
  // failure).
  void upload(const Uri& u, uint64_t size,
              const std::function<std::vector<std::string_view>(uint64_t, uint64_t)>& read) {
    const OciConfig& c = config();
    const std::string uri = u.str();
    if (size <= c.multipart_threshold) {
      send(uri, "PUT", object_path(u), {{"content-type", "application/octet-stream"}}, read(0, size));
      return;
    }
    uint64_t part = c.part_size;
    while ((size + part - 1) / part > 10000) part *= 2;  // a multipart upload holds up to 10,000 parts
    const std::string upload_path = bucket_path(u) + "/u";
    const util::HttpResponse created =
        send(uri, "POST", upload_path, {}, {nlohmann::json{{"object", u.key}}.dump()}, nullptr, true);
    const auto j = nlohmann::json::parse(created.body, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("uploadId") || !j["uploadId"].is_string()) {
      throw Error(kOciComponent, fmt::format("{}: CreateMultipartUpload returned no uploadId", uri));
    }
    const std::string id = j["uploadId"].get<std::string>();
    const std::string upload = upload_path + "/" + util::url_encode(u.key);
    const size_t parts = static_cast<size_t>((size + part - 1) / part);
    std::vector<std::string> etags(parts);
    try {
      parallel_for(parts, c.parallelism, [&](size_t i) {
        const uint64_t begin = i * part, length = std::min(size - begin, part);
        const util::HttpResponse r =
            send(uri, "PUT", fmt::format("{}?uploadId={}&uploadPartNum={}", upload, util::url_encode(id), i + 1),
                 {{"content-type", "application/octet-stream"}}, read(begin, length));
        etags[i] = r.header("etag");
        if (etags[i].empty()) throw Error(kOciComponent, fmt::format("{}: part {} returned no ETag", uri, i + 1));
      });
      nlohmann::json commit{{"partsToCommit", nlohmann::json::array()}};
      for (size_t i = 0; i < parts; ++i) commit["partsToCommit"].push_back({{"partNum", i + 1}, {"etag", etags[i]}});
      send(uri, "POST", fmt::format("{}?uploadId={}", upload, util::url_encode(id)), {}, {commit.dump()}, nullptr,
           true);
    } catch (...) {
      try {
        send(uri, "DELETE", fmt::format("{}?uploadId={}", upload, util::url_encode(id)), {}, {});
      } catch (const std::exception&) {
        // The upload expires unseen; the first error is the one to report.
      }
      throw;
    }
  }

  // The Authorization header of one request: HTTP Signatures over date, (request-target) and host, and for a JSON
  // body also its length, type and SHA-256 (the SDKs sign object and part uploads without their bodies).
  std::string authorization(const std::string& method, const std::string& path_and_query,
                            std::vector<std::pair<std::string, std::string>>& headers, std::string_view json_body) {
    const OciConfig& c = config();
    std::string key_id = c.key_id;
    if (!c.token_file.empty()) key_id = "ST$" + session_token(c);
    if (c.principal) key_id = "ST$" + c.principal->get().session_token;
    std::shared_ptr<EVP_PKEY> key = c.key;
    if (!c.key_file.empty()) {  // rewritten with the token: the key that goes with the token just read
      key = rsa_key_from_pem(util::read_file(c.key_file, kOciComponent), c.key_pass);
      if (!key) throw Error(kOciComponent, fmt::format("{}: not an RSA private key in PEM any more", c.key_file));
    }
    return http_signature(key.get(), key_id, c.host, method, path_and_query, headers, json_body, c.source);
  }

  // Signs and sends one request, retrying transient failures; throws naming `uri`. 404 on HEAD and DELETE, and 416
  // on GET, come back to the caller. `body` is the PUT body (object bytes) or, with `json`, a JSON POST body.
  util::HttpResponse send(const std::string& uri, const std::string& method, const std::string& path_and_query,
                          const std::vector<std::pair<std::string, std::string>>& headers,
                          const std::vector<std::string_view>& body, const BodySink* sink = nullptr,
                          bool json = false) {
    const OciConfig& c = config();
    std::string last_error;
    for (int attempt = 0; attempt < c.max_attempts; ++attempt) {
      if (attempt > 0) backoff_sleep(attempt, c.backoff_base_s, c.backoff_max_s);
      Exchange x{method, c.endpoint + path_and_query, headers, {}, {}, sink, 10, c.stall_timeout_s};
      if (json) {
        x.payload = body.empty() ? std::string_view("") : body.front();  // a POST body
      } else {
        x.payload_parts = body;
      }
      const std::string auth = authorization(method, path_and_query, x.headers, json ? x.payload : std::string_view());
      x.headers.emplace_back("authorization", auth);
      bool retryable = false;
      util::HttpResponse r = pool_.perform(x, &retryable);
      if (r.status == 0) {
        last_error = fmt::format("{} failed: {}", method, r.transport_error);
        if (retryable) continue;
        throw Error(kOciComponent, fmt::format("{}: {}", uri, last_error));
      }
      if (r.status >= 200 && r.status < 300) return r;
      std::string code, message;
      const auto j = nlohmann::json::parse(r.body, nullptr, false);
      if (!j.is_discarded() && j.is_object()) {
        if (j.contains("code") && j["code"].is_string()) code = j["code"].get<std::string>();
        if (j.contains("message") && j["message"].is_string()) message = j["message"].get<std::string>();
      }
      last_error = fmt::format("{} HTTP {}{}{}", method, r.status, code.empty() ? "" : " " + code,
                               message.empty() ? "" : ": " + message);
      if (retryable_status(r.status)) continue;
      if (r.status == 404 && (method == "HEAD" || method == "DELETE")) return r;
      if (r.status == 416 && method == "GET") return r;
      if (method == "PUT" && (code == "IfMatchFailed" || code == "IfNoneMatchFailed")) return r;  // (conditional)
      if (r.status == 401 || r.status == 403) {
        last_error += fmt::format(" (credentials: {}{})", c.source, c.refresh_hint);
      }
      throw Error(kOciComponent, fmt::format("{}: {}", uri, last_error));
    }
    throw Error(kOciComponent, fmt::format("{}: {} (gave up after {} attempts)", uri, last_error, c.max_attempts));
  }

  std::once_flag once_, namespace_once_;
  OciConfig config_;
  std::string namespace_;
  HttpPool pool_;
};

}  // namespace

Backend& oci_backend() {
  static OciBackend backend;
  return backend;
}

}  // namespace tessera::storage
