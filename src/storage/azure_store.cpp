// Azure Blob Storage (azure://, azure-dl://, abfs://, abfss://): Tessera's own client of the Blob service REST API
// over the pooled transport (http_pool.h), signed with Shared Key, a SAS token or a Microsoft Entra bearer token.
// Not Arrow's AzureFileSystem: its output stream creates an empty blob when opened and commits blocks as it goes, so
// a failed upload leaves a partial object under the final name; here a blob appears only whole (one Put Blob, or Put
// Block + Put Block List).
#include <fmt/format.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
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
#include "tessera/storage/s3.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"
#include "tessera/util/http.h"
#include "tessera/util/xml.h"

namespace tessera::storage {
namespace {

constexpr const char* kAzureComponent = "azure";
constexpr const char* kApiVersion = "2023-11-03";
constexpr const char* kStorageScope = "https://storage.azure.com/.default";
constexpr const char* kStorageResource = "https://storage.azure.com/";

std::string env_or(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

std::string hmac_sha256_base64(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
       data.size(), out, &len);
  return base64_encode(std::string_view(reinterpret_cast<const char*>(out), len));
}

// AZURE_STORAGE_CONNECTION_STRING's `Name=value;` pairs (values may hold '=': a key's padding, a SAS).
std::map<std::string, std::string> parse_connection_string(const std::string& text) {
  std::map<std::string, std::string> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(';', at);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(at, end - at);
    const size_t eq = item.find('=');
    if (eq != std::string::npos) out[item.substr(0, eq)] = item.substr(eq + 1);
    at = end + 1;
  }
  return out;
}

// How requests are authorized.
struct AzureAuth {
  enum class Kind { kSharedKey, kSas, kBearer };
  Kind kind = Kind::kSharedKey;
  std::string account_key;                    // decoded, Shared Key
  std::string sas;                            // the token's query, without '?'
  std::shared_ptr<CredentialProvider> token;  // bearer tokens: session_token holds the token, expiration its end
  std::string source;                         // where the credential came from; never a secret
};

// Microsoft Entra's token endpoint for a service principal: a client secret, or a federated token read from a file
// at every refresh (workload identity).
std::shared_ptr<CredentialProvider> entra_client_credentials(const std::string& tenant, const std::string& client,
                                                             const std::string& secret, const std::string& token_file,
                                                             const std::string& source) {
  std::string authority = env_or("AZURE_AUTHORITY_HOST", "https://login.microsoftonline.com");
  while (!authority.empty() && authority.back() == '/') authority.pop_back();
  const std::string url = fmt::format("{}/{}/oauth2/v2.0/token", authority, util::url_encode(tenant));
  return refreshing_credentials(source, [=] {
    util::HttpRequest req;
    req.method = "POST";
    req.url = url;
    req.headers = {{"Content-Type", "application/x-www-form-urlencoded"}};
    req.body = fmt::format("grant_type=client_credentials&client_id={}&scope={}", util::url_encode(client),
                           util::url_encode(kStorageScope));
    if (token_file.empty()) {
      req.body += "&client_secret=" + util::url_encode(secret);
    } else {
      std::string assertion = util::read_file(token_file, kAzureComponent);
      while (!assertion.empty() && std::isspace(static_cast<unsigned char>(assertion.back()))) assertion.pop_back();
      req.body +=
          "&client_assertion_type=" + util::url_encode("urn:ietf:params:oauth:client-assertion-type:jwt-bearer");
      req.body += "&client_assertion=" + util::url_encode(assertion);
    }
    return fetch_access_token(req, source, kAzureComponent);
  });
}

// A managed identity: App Service's and Azure Arc's IDENTITY_ENDPOINT + IDENTITY_HEADER, else the instance metadata
// service (AZURE_POD_IDENTITY_AUTHORITY_HOST, default http://169.254.169.254), for AZURE_CLIENT_ID's user-assigned
// identity when set.
std::shared_ptr<CredentialProvider> managed_identity() {
  const std::string client = env_or("AZURE_CLIENT_ID");
  const std::string endpoint = env_or("IDENTITY_ENDPOINT"), header = env_or("IDENTITY_HEADER");
  util::HttpRequest req;
  std::string source;
  if (!endpoint.empty() && !header.empty()) {
    req.url = fmt::format("{}?api-version=2019-08-01&resource={}", endpoint, util::url_encode(kStorageResource));
    req.headers = {{"X-IDENTITY-HEADER", header}};
    source = "managed identity (IDENTITY_ENDPOINT)";
  } else {
    std::string host = env_or("AZURE_POD_IDENTITY_AUTHORITY_HOST", "http://169.254.169.254");
    while (!host.empty() && host.back() == '/') host.pop_back();
    req.url = fmt::format("{}/metadata/identity/oauth2/token?api-version=2018-02-01&resource={}", host,
                          util::url_encode(kStorageResource));
    req.headers = {{"Metadata", "true"}};
    req.connect_timeout_s = 2;
    source = "managed identity (the instance metadata service)";
  }
  if (!client.empty()) req.url += "&client_id=" + util::url_encode(client);
  return refreshing_credentials(source, [req, source] { return fetch_access_token(req, source, kAzureComponent); });
}

// Where the credentials come from, in the order of Streaming's readers and the Azure SDKs' environment credential.
AzureAuth resolve_auth(const std::map<std::string, std::string>& conn) {
  AzureAuth a;
  const auto shared_key = [&](const std::string& key, const std::string& source) {
    const auto decoded = base64_decode(key);
    if (!decoded) throw ConfigError(kAzureComponent, fmt::format("{}: the account key is not base64", source));
    a.kind = AzureAuth::Kind::kSharedKey;
    a.account_key = *decoded;
    a.source = source;
  };
  const auto sas = [&](std::string token, const std::string& source) {
    if (!token.empty() && token.front() == '?') token.erase(0, 1);
    a.kind = AzureAuth::Kind::kSas;
    a.sas = std::move(token);
    a.source = source;
  };
  if (conn.count("AccountKey") > 0) {
    shared_key(conn.at("AccountKey"), "AZURE_STORAGE_CONNECTION_STRING (AccountKey)");
  } else if (conn.count("SharedAccessSignature") > 0) {
    sas(conn.at("SharedAccessSignature"), "AZURE_STORAGE_CONNECTION_STRING (SharedAccessSignature)");
  } else if (!env_or("AZURE_ACCOUNT_ACCESS_KEY").empty()) {
    shared_key(env_or("AZURE_ACCOUNT_ACCESS_KEY"), "AZURE_ACCOUNT_ACCESS_KEY");
  } else if (!env_or("AZURE_STORAGE_KEY").empty()) {
    shared_key(env_or("AZURE_STORAGE_KEY"), "AZURE_STORAGE_KEY");
  } else if (!env_or("AZURE_STORAGE_SAS_TOKEN").empty()) {
    sas(env_or("AZURE_STORAGE_SAS_TOKEN"), "AZURE_STORAGE_SAS_TOKEN");
  } else {
    const std::string tenant = env_or("AZURE_TENANT_ID"), client = env_or("AZURE_CLIENT_ID");
    a.kind = AzureAuth::Kind::kBearer;
    if (!tenant.empty() && !client.empty() && !env_or("AZURE_CLIENT_SECRET").empty()) {
      a.source = fmt::format("Microsoft Entra client secret (AZURE_CLIENT_SECRET) for client {}", client);
      a.token = entra_client_credentials(tenant, client, env_or("AZURE_CLIENT_SECRET"), "", a.source);
    } else if (!tenant.empty() && !client.empty() && !env_or("AZURE_FEDERATED_TOKEN_FILE").empty()) {
      a.source = fmt::format("workload identity (AZURE_FEDERATED_TOKEN_FILE) for client {}", client);
      a.token = entra_client_credentials(tenant, client, "", env_or("AZURE_FEDERATED_TOKEN_FILE"), a.source);
    } else {
      a.token = managed_identity();
      a.source = a.token->source();
    }
  }
  return a;
}

struct AzureConfig {
  std::string account;        // AccountName, AZURE_ACCOUNT_NAME or AZURE_STORAGE_ACCOUNT; may be empty
  std::string blob_endpoint;  // the connection string's BlobEndpoint; empty: https://<account>.blob.<suffix>
  std::string protocol = "https";
  std::string suffix = "core.windows.net";
  AzureAuth auth;
  int max_attempts = 5;
  double backoff_base_s = 0.1, backoff_max_s = 5.0;
  long stall_timeout_s = 30;                // NOLINT(google-runtime-int)
  uint64_t block_size = 16ULL << 20;        // bytes per range request and per block
  uint64_t single_put_limit = 16ULL << 20;  // larger uploads go in blocks
  int parallelism = 8;
};

AzureConfig azure_config_from_environment() {
  AzureConfig c;
  const auto conn = parse_connection_string(env_or("AZURE_STORAGE_CONNECTION_STRING"));
  const auto field = [&](const char* name) { return conn.count(name) > 0 ? conn.at(name) : std::string(); };
  c.account = field("AccountName");
  if (c.account.empty()) c.account = env_or("AZURE_ACCOUNT_NAME", env_or("AZURE_STORAGE_ACCOUNT"));
  c.blob_endpoint = field("BlobEndpoint");
  while (!c.blob_endpoint.empty() && c.blob_endpoint.back() == '/') c.blob_endpoint.pop_back();
  if (!field("DefaultEndpointsProtocol").empty()) c.protocol = field("DefaultEndpointsProtocol");
  if (!field("EndpointSuffix").empty()) c.suffix = field("EndpointSuffix");
  c.auth = resolve_auth(conn);
  c.max_attempts = env_int("TESSERA_AZURE_MAX_ATTEMPTS", c.max_attempts, 1, 100, kAzureComponent);
  c.parallelism = env_int("TESSERA_AZURE_PARALLELISM", c.parallelism, 1, 256, kAzureComponent);
  c.stall_timeout_s =
      env_int("TESSERA_AZURE_STALL_TIMEOUT_S", static_cast<int>(c.stall_timeout_s), 1, 3600, kAzureComponent);
  c.block_size = static_cast<uint64_t>(env_int("TESSERA_AZURE_BLOCK_SIZE_MB", 16, 1, 4000, kAzureComponent)) << 20;
  c.single_put_limit = c.block_size;
  return c;
}

// One blob's address: the account, the container and the service URL its requests go to.
struct Target {
  std::string uri;  // as the user wrote it, for messages
  std::string account;
  std::string container;
  std::string blob;
  std::string base_url;  // scheme://host[/path] of the Blob service, no trailing '/'
};

class AzureBackend final : public Backend {
 public:
  std::string get(const Uri& u) override { return send(target(u), "GET", {}, {}, {}).body; }

  std::string get_range(const Uri& u, uint64_t offset, uint64_t length) override {
    if (length == 0) return {};
    const Target t = target(u);
    util::HttpResponse r =
        send(t, "GET", {}, {{"x-ms-range", fmt::format("bytes={}-{}", offset, offset + length - 1)}}, {});
    if (r.body.size() != length) {
      throw Error(kAzureComponent, fmt::format("{}: asked for {} bytes at {}, got {} (the blob is shorter)", t.uri,
                                               length, offset, r.body.size()));
    }
    return std::move(r.body);
  }

  void download(const Uri& u, const std::string& local_path) override {
    const Target t = target(u);
    const AzureConfig& c = config();
    ranged_download(t.uri, local_path, c.block_size, c.parallelism,
                    [&](uint64_t first, uint64_t last, const std::string& etag, const BodySink& sink) {
                      std::vector<std::pair<std::string, std::string>> headers{
                          {"x-ms-range", fmt::format("bytes={}-{}", first, last)}};
                      if (!etag.empty()) headers.emplace_back("If-Match", etag);
                      const util::HttpResponse r = send(t, "GET", {}, headers, {}, &sink);
                      return RangeAnswer{r.status, r.header("content-range"), r.header("etag")};
                    });
  }

  void put_parts(const Uri& u, const std::vector<std::string_view>& parts) override {
    const Concatenation object(parts);
    upload(target(u), object.size(), [&](uint64_t offset, uint64_t length, std::string& scratch) {
      return object.contiguous(offset, length, scratch);
    });
  }

  // One Put Blob with If-Match (or If-None-Match: *): 412 ConditionNotMet, or 409 BlobAlreadyExists, is a refusal.
  std::optional<std::string> put_if(const Uri& u, std::string_view data,
                                    const std::optional<std::string>& expected) override {
    std::vector<std::pair<std::string, std::string>> headers{{"x-ms-blob-type", "BlockBlob"}};
    headers.emplace_back(expected ? "If-Match" : "If-None-Match", expected ? "\"" + *expected + "\"" : "*");
    const util::HttpResponse r = send(target(u), "PUT", {}, headers, data);
    if (r.status == 412 || r.status == 409) return std::nullopt;
    return strip_quotes(r.header("etag"));
  }

  void upload_file(const std::string& local_path, const Uri& u) override {
    const MappedFile file(local_path, kAzureComponent);
    put_parts(u, {file.bytes()});
  }

  std::vector<ObjectInfo> list(const Uri& prefix) override {
    const Target t = target(prefix);
    std::vector<ObjectInfo> out;
    std::string marker;
    const std::string base = t.uri.substr(0, t.uri.size() - t.blob.size());  // scheme://container/
    while (true) {
      std::vector<std::pair<std::string, std::string>> query{
          {"restype", "container"}, {"comp", "list"}, {"prefix", t.blob}};
      if (!marker.empty()) query.emplace_back("marker", marker);
      const util::HttpResponse r = send(t, "GET", query, {}, {}, nullptr, /*container_level=*/true);
      const util::XmlElement page = util::parse_xml(r.body, kAzureComponent, fmt::format("{}: a listing", t.uri));
      if (const util::XmlElement* blobs = page.find("Blobs")) {
        for (const util::XmlElement* item : blobs->children_named("Blob")) {
          const std::string name = item->child_text("Name");
          const util::XmlElement* props = item->find("Properties");
          ObjectInfo info{base + name, 0, ""};
          if (props != nullptr) {
            info.size = byte_count(props->child_text("Content-Length"), base + name, "a listing Content-Length",
                                   kAzureComponent);
            info.etag = strip_quotes(props->child_text("Etag"));
          }
          out.push_back(std::move(info));
        }
      }
      marker = page.child_text("NextMarker");
      if (marker.empty()) break;
    }
    std::sort(out.begin(), out.end(), [](const ObjectInfo& a, const ObjectInfo& b) { return a.uri < b.uri; });
    return out;
  }

  void remove(const Uri& u) override { send(target(u), "DELETE", {}, {}, {}); }

  std::optional<ObjectInfo> stat(const Uri& u) override {
    const Target t = target(u);
    const util::HttpResponse r = send(t, "HEAD", {}, {}, {});
    if (r.status == 404) return std::nullopt;
    return ObjectInfo{t.uri, byte_count(r.header("content-length"), t.uri, "a Content-Length", kAzureComponent),
                      strip_quotes(r.header("etag"))};
  }

 private:
  const AzureConfig& config() {
    std::call_once(config_once_, [this] { config_ = azure_config_from_environment(); });
    return config_;
  }

  Target target(const Uri& u) {
    const AzureConfig& c = config();
    Target t;
    t.uri = u.str();
    t.blob = u.key;
    t.container = u.bucket;
    t.account = c.account;
    std::string suffix = c.suffix;
    const size_t at = u.bucket.find('@');
    if (at != std::string::npos) {  // abfs[s]://container@account.dfs.core.windows.net/path
      t.container = u.bucket.substr(0, at);
      const std::string host = u.bucket.substr(at + 1);
      const size_t dot = host.find('.');
      t.account = host.substr(0, dot);
      const std::string rest = dot == std::string::npos ? "" : host.substr(dot + 1);
      // The Data Lake endpoint's account answers the Blob API too (multi-protocol access).
      for (const char* service : {"dfs.", "blob."}) {
        if (rest.rfind(service, 0) == 0) suffix = rest.substr(std::string_view(service).size());
      }
    }
    if (t.container.empty()) throw ConfigError(kAzureComponent, fmt::format("{}: no container name", t.uri));
    if (!c.blob_endpoint.empty()) {
      t.base_url = c.blob_endpoint;
    } else if (t.account.empty()) {
      throw ConfigError(
          kAzureComponent,
          fmt::format("{}: no storage account: name it in AZURE_ACCOUNT_NAME (or AZURE_STORAGE_ACCOUNT, or "
                      "AccountName in AZURE_STORAGE_CONNECTION_STRING), or use "
                      "abfss://<container>@<account>.dfs.core.windows.net/<path>",
                      t.uri));
    } else {
      t.base_url = fmt::format("{}://{}.blob.{}", c.protocol, t.account, suffix);
    }
    return t;
  }

  // Signs and sends one request to the blob (or, `container_level`, its container), retrying transient failures;
  // throws naming the URI. 404 on HEAD and DELETE and 416 on GET come back to the caller.
  util::HttpResponse send(const Target& t, const std::string& method,
                          const std::vector<std::pair<std::string, std::string>>& query,
                          const std::vector<std::pair<std::string, std::string>>& headers, std::string_view payload,
                          const BodySink* sink = nullptr, bool container_level = false) {
    const AzureConfig& c = config();
    const std::string path =
        "/" + util::url_encode(t.container, false) + (container_level ? "" : "/" + util::url_encode(t.blob, true));
    const size_t base_path = c.blob_endpoint.empty() ? 0 : t.base_url.find('/', t.base_url.find("://") + 3);
    const std::string url_path =
        (base_path == 0 || base_path == std::string::npos ? "" : t.base_url.substr(base_path)) + path;
    std::string query_string;
    for (const auto& [k, v] : query) {
      query_string += (query_string.empty() ? "?" : "&") + util::url_encode(k) + "=" + util::url_encode(v);
    }
    if (c.auth.kind == AzureAuth::Kind::kSas && !c.auth.sas.empty()) {
      query_string += (query_string.empty() ? "?" : "&") + c.auth.sas;
    }
    const std::string url = t.base_url + path + query_string;
    std::string last_error;
    for (int attempt = 0; attempt < c.max_attempts; ++attempt) {
      if (attempt > 0) backoff_sleep(attempt, c.backoff_base_s, c.backoff_max_s);
      Exchange x{method, url, headers, payload, {}, sink, 10, c.stall_timeout_s};
      x.headers.emplace_back("x-ms-date", http_date_now());
      x.headers.emplace_back("x-ms-version", kApiVersion);
      if (c.auth.kind == AzureAuth::Kind::kSharedKey) {
        x.headers.emplace_back("Authorization",
                               shared_key(t.account, method, url_path, query, x.headers, payload.size()));
      } else if (c.auth.kind == AzureAuth::Kind::kBearer) {
        x.headers.emplace_back("Authorization", "Bearer " + c.auth.token->get().session_token);
      }
      bool retryable = false;
      util::HttpResponse r = pool_.perform(x, &retryable);
      if (r.status == 0) {
        last_error = fmt::format("{} failed: {}", method, r.transport_error);
        if (retryable) continue;
        throw Error(kAzureComponent, fmt::format("{}: {}", t.uri, last_error));
      }
      if (r.status >= 200 && r.status < 300) return r;
      // Azure's error code comes in x-ms-error-code (HEAD answers have no body) and in the body's <Error>.
      std::string code = r.header("x-ms-error-code"), message;
      if (const auto doc = util::try_parse_xml(r.body); doc && doc->name == "Error") {
        if (code.empty()) code = doc->child_text("Code");
        message = doc->child_text("Message");
        if (const size_t nl = message.find('\n'); nl != std::string::npos) message.resize(nl);
      }
      last_error = fmt::format("{} HTTP {}{}{}", method, r.status, code.empty() ? "" : " " + code,
                               message.empty() ? "" : ": " + message);
      if (retryable_status(r.status) || code == "OperationTimedOut" || code == "ServerBusy") continue;
      if (r.status == 401 && c.auth.kind == AzureAuth::Kind::kBearer && attempt + 1 < c.max_attempts) {
        c.auth.token->expired_by_server();  // a token the service saw expire first: fetch another, try again
        continue;
      }
      if (r.status == 404 && (method == "HEAD" || method == "DELETE")) return r;
      if (r.status == 416 && method == "GET") return r;
      if (method == "PUT" && (r.status == 412 || code == "BlobAlreadyExists")) return r;  // a conditional write's
      if (r.status == 401 || r.status == 403) {
        last_error +=
            fmt::format(" (account {}, container {}; credentials from {})", t.account, t.container, c.auth.source);
      } else if (code == "ContainerNotFound") {
        last_error += fmt::format(" (account {} has no container {})", t.account, t.container);
      }
      throw Error(kAzureComponent, fmt::format("{}: {}", t.uri, last_error));
    }
    throw Error(kAzureComponent, fmt::format("{}: {} (gave up after {} attempts)", t.uri, last_error, c.max_attempts));
  }

  // The Shared Key Authorization header: HMAC-SHA256 with the account key over the verb, the standard headers, the
  // x-ms-* headers sorted and the canonicalized resource (/account/path, then each query parameter on a line).
  std::string shared_key(const std::string& account, const std::string& method, const std::string& url_path,
                         const std::vector<std::pair<std::string, std::string>>& query,
                         const std::vector<std::pair<std::string, std::string>>& headers, size_t content_length) {
    std::map<std::string, std::string> standard, ms;
    for (const auto& [k, v] : headers) {
      std::string name = k;
      std::transform(name.begin(), name.end(), name.begin(),
                     [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
      (name.rfind("x-ms-", 0) == 0 ? ms : standard)[name] = v;
    }
    const auto h = [&](const char* name) { return standard.count(name) > 0 ? standard.at(name) : std::string(); };
    // PUT always carries a Content-Length (libcurl sends it); 0 is signed as empty (API versions since 2015-02-21).
    const std::string length = content_length == 0 ? "" : std::to_string(content_length);
    // Range is left empty: ranges go in x-ms-range, as the Azure SDKs send them.
    std::string s = fmt::format("{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n\n", method, h("content-encoding"),
                                h("content-language"), length, h("content-md5"), h("content-type"), h("date"),
                                h("if-modified-since"), h("if-match"), h("if-none-match"), h("if-unmodified-since"));
    // (x-ms-* names here are lower case letters and '-', where Azure's collation and byte order agree.)
    for (const auto& [k, v] : ms) s += k + ":" + v + "\n";
    s += "/" + account + url_path;
    std::map<std::string, std::string> params;
    for (const auto& [k, v] : query) {
      std::string name = k;
      std::transform(name.begin(), name.end(), name.begin(),
                     [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
      params[name] = v;
    }
    for (const auto& [k, v] : params) s += "\n" + k + ":" + v;
    return fmt::format("SharedKey {}:{}", account, hmac_sha256_base64(config().auth.account_key, s));
  }

  // One Put Blob up to single_put_limit; above it Put Block in parallel, then Put Block List, which publishes the
  // whole blob at once (uncommitted blocks of a failed upload are never visible and Azure drops them within a week).
  void upload(const Target& t, uint64_t size,
              const std::function<std::string_view(uint64_t, uint64_t, std::string&)>& read_part) {
    const AzureConfig& c = config();
    if (size <= c.single_put_limit) {
      std::string scratch;
      send(t, "PUT", {}, {{"x-ms-blob-type", "BlockBlob"}}, read_part(0, size, scratch));
      return;
    }
    uint64_t block = c.block_size;
    while ((size + block - 1) / block > 50000) block *= 2;  // a blob holds up to 50,000 blocks
    const size_t blocks = static_cast<size_t>((size + block - 1) / block);
    // Block ids: base64 of equal-length strings, unique to this upload so that concurrent writers of one name never
    // commit each other's blocks.
    const std::string upload_id =
        fmt::format("{:08x}{:08x}", static_cast<uint32_t>(::getpid()), static_cast<uint32_t>(upload_counter_++));
    std::vector<std::string> ids(blocks);
    for (size_t i = 0; i < blocks; ++i) ids[i] = base64_encode(fmt::format("{}-{:06d}", upload_id, i));
    parallel_for(blocks, c.parallelism, [&](size_t i) {
      const uint64_t begin = i * block, length = std::min(size - begin, block);
      std::string scratch;
      send(t, "PUT", {{"comp", "block"}, {"blockid", ids[i]}}, {}, read_part(begin, length, scratch));
    });
    std::string xml = "<?xml version=\"1.0\" encoding=\"utf-8\"?><BlockList>";
    for (const std::string& id : ids) xml += "<Latest>" + id + "</Latest>";
    xml += "</BlockList>";
    send(t, "PUT", {{"comp", "blocklist"}}, {{"Content-Type", "application/xml"}}, xml);
  }

  std::once_flag config_once_;
  AzureConfig config_;
  HttpPool pool_;
  std::atomic<uint64_t> upload_counter_{0};
};

}  // namespace

Backend& azure_backend() {
  static AzureBackend backend;
  return backend;
}

}  // namespace tessera::storage
