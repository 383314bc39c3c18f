// gs://bucket/key: Google Cloud Storage through Arrow's GcsFileSystem, which is google-cloud-cpp's storage client in
// the pyarrow wheel Tessera already links (docs/storage.md says why it is used and what Tessera adds on top).
//
// Credentials, the first found (as Google's client libraries resolve them):
//   STORAGE_EMULATOR_HOST    an emulator (fake-gcs-server, gcp-storage-emulator): http, no credentials, as
//                            google-cloud-storage and gcsfs treat it;
//   GOOGLE_APPLICATION_CREDENTIALS  a service account's key file, or any other credential file Google's "application
//                            default credentials" accept (authorized user, external account / workload identity);
//   otherwise                gcloud's application default credentials file, then the metadata server.
// Access tokens are refreshed by google-cloud-cpp before they expire. Arrow's client exposes no generation and no
// precondition, so stat and write_if (the atomic `latest` pointer) go to GCS's JSON API themselves, with tokens of
// their own for the same credentials (JsonApi below). TESSERA_GCS_ENDPOINT_URL points the client at
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
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>

#include "backend.h"
#include "tessera/storage/aws_files.h"
#include "tessera/storage/s3.h"
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

// ---- GCS's JSON API, for what Arrow's client does not expose: an object's generation and an upload conditioned on
// it (ifGenerationMatch; 0: the object must not exist), which makes write_if's check the service's. Bearer tokens for
// the credentials make_client() found, obtained as Google's client libraries obtain them:
//   service_account   a self-signed JWT (RS256, kid = the key's private_key_id, scope cloud-platform), as
//                     google-cloud-cpp sends for storage.googleapis.com; signed again before its hour ends;
//   authorized_user   the token endpoint's refresh_token grant (token_uri, else Google's);
//   neither file      the metadata server's GET /computeMetadata/v1/instance/service-accounts/default/token
//                     (Metadata-Flavor: Google) at GCE_METADATA_ROOT, else GCE_METADATA_HOST, else
//                     metadata.google.internal;
//   the emulator      none.
// Other credential files (external_account, impersonated_service_account) have no token source here: write_if then
// compares stat()'s version just before writing, and the race between compare and write stays.

constexpr const char* kCloudPlatformScope = "https://www.googleapis.com/auth/cloud-platform";

struct JsonApi {
  std::string endpoint;                       // scheme://host[:port]
  std::shared_ptr<CredentialProvider> token;  // its session_token is the bearer token; nullptr: none (the emulator)
};

std::string base64url(std::string_view bytes) {
  std::string s = base64_encode(bytes);
  while (!s.empty() && s.back() == '=') s.pop_back();
  for (char& ch : s) ch = ch == '+' ? '-' : ch == '/' ? '_' : ch;
  return s;
}

std::string json_text(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}

std::shared_ptr<CredentialProvider> service_account_tokens(const nlohmann::json& j, const std::string& source) {
  const std::string pem = json_text(j, "private_key"), email = json_text(j, "client_email");
  const std::string key_id = json_text(j, "private_key_id");
  return refreshing_credentials(source, [=] {
    const std::shared_ptr<EVP_PKEY> key = rsa_key_from_pem(pem, "");
    if (!key || email.empty()) {
      throw ConfigError(kGcsComponent, fmt::format("{}: no RSA private_key and client_email in it", source));
    }
    const auto now = std::chrono::system_clock::now();
    const int64_t iat = std::chrono::duration_cast<std::chrono::seconds>(now.time_since_epoch()).count();
    const nlohmann::json header{{"alg", "RS256"}, {"typ", "JWT"}, {"kid", key_id}};
    const nlohmann::json claims{
        {"iss", email}, {"sub", email}, {"scope", kCloudPlatformScope}, {"iat", iat}, {"exp", iat + 3600}};
    const std::string text = base64url(header.dump()) + "." + base64url(claims.dump());
    const std::optional<std::string> signature = rsa_sha256_sign(key.get(), text);
    if (!signature) throw Error(kGcsComponent, fmt::format("{}: signing a token failed", source));
    S3Credentials c;
    c.session_token = text + "." + base64url(*signature);
    c.source = source;
    c.expiration = now + std::chrono::seconds(3600);
    return c;
  });
}

std::shared_ptr<CredentialProvider> user_tokens(const nlohmann::json& j, const std::string& source) {
  util::HttpRequest req;
  req.method = "POST";
  req.url = json_text(j, "token_uri").empty() ? "https://oauth2.googleapis.com/token" : json_text(j, "token_uri");
  req.headers = {{"Content-Type", "application/x-www-form-urlencoded"}};
  req.body = fmt::format("grant_type=refresh_token&client_id={}&client_secret={}&refresh_token={}",
                         util::url_encode(json_text(j, "client_id")), util::url_encode(json_text(j, "client_secret")),
                         util::url_encode(json_text(j, "refresh_token")));
  return refreshing_credentials(source, [req, source] { return fetch_access_token(req, source, kGcsComponent); });
}

std::shared_ptr<CredentialProvider> metadata_server_tokens() {
  std::string host = aws::env("GCE_METADATA_ROOT");  // google-cloud-cpp's variable; google-auth's comes second
  if (host.empty()) host = aws::env("GCE_METADATA_HOST");
  if (host.empty()) host = "metadata.google.internal";
  util::HttpRequest req;
  req.url = (host.find("://") == std::string::npos ? "http://" + host : host) +
            "/computeMetadata/v1/instance/service-accounts/default/token";
  req.headers = {{"Metadata-Flavor", "Google"}};
  req.connect_timeout_s = 2;
  const std::string source = fmt::format("the metadata server ({})", host);
  return refreshing_credentials(source, [req, source] { return fetch_access_token(req, source, kGcsComponent); });
}

// The token source for a credentials file of `type`; nullptr for a kind only google-cloud-cpp speaks.
std::shared_ptr<CredentialProvider> file_tokens(const nlohmann::json& j, const std::string& type,
                                                const std::string& source) {
  if (type == "service_account") return service_account_tokens(j, source);
  if (type == "authorized_user") return user_tokens(j, source);
  return nullptr;
}

// An object resource's generation (the JSON API writes int64s as strings); "" when it has none.
std::string generation_of(const nlohmann::json& j) {
  if (j.contains("generation") && j["generation"].is_number_integer()) {
    return std::to_string(j["generation"].get<int64_t>());
  }
  return json_text(j, "generation");
}

struct Client {
  std::shared_ptr<arrow::fs::GcsFileSystem> fs;
  int parallelism = 8;         // ranged reads in flight per object (TESSERA_GCS_PARALLELISM)
  double retry_limit_s = 60;   // TESSERA_GCS_RETRY_LIMIT_S
  std::string credentials;     // where they came from, for error messages; never the credentials themselves
  std::optional<JsonApi> api;  // nullopt: credentials only google-cloud-cpp speaks
};

Client make_client() {
  using arrow::fs::GcsOptions;
  Client c;
  GcsOptions options;
  if (const std::string emulator = aws::env("STORAGE_EMULATOR_HOST"); !emulator.empty()) {
    options = GcsOptions::Anonymous();
    std::tie(options.scheme, options.endpoint_override) = split_endpoint(emulator, "http");
    c.credentials = fmt::format("none (the emulator at STORAGE_EMULATOR_HOST={})", emulator);
    c.api = JsonApi{};
  } else if (const std::string file = aws::env("GOOGLE_APPLICATION_CREDENTIALS"); !file.empty()) {
    const std::string text = util::read_file(file, kGcsComponent);
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      throw ConfigError(kGcsComponent,
                        fmt::format("GOOGLE_APPLICATION_CREDENTIALS={}: not a JSON credentials file", file));
    }
    const std::string type = json_text(j, "type");
    options = type == "service_account" ? GcsOptions::FromServiceAccountCredentials(text) : GcsOptions::Defaults();
    c.credentials = fmt::format("GOOGLE_APPLICATION_CREDENTIALS={} ({})", file, type.empty() ? "no type" : type);
    if (auto tokens = file_tokens(j, type, c.credentials)) c.api = JsonApi{"", std::move(tokens)};
  } else {
    options = GcsOptions::Defaults();
    c.credentials = "application default credentials (gcloud's file, else the metadata server)";
    // google-cloud-cpp's order: gcloud's file, else the metadata server.
    const std::string config =
        aws::env("CLOUDSDK_CONFIG").empty() ? aws::env("HOME") + "/.config/gcloud" : aws::env("CLOUDSDK_CONFIG");
    const std::string adc = config + "/application_default_credentials.json";
    std::error_code ec;
    if (std::filesystem::is_regular_file(adc, ec)) {
      const nlohmann::json j = nlohmann::json::parse(util::read_file(adc, kGcsComponent), nullptr, false);
      const std::string type = j.is_object() ? json_text(j, "type") : "";
      c.credentials = fmt::format("gcloud's application default credentials {} ({})", adc, type);
      if (auto tokens = j.is_object() ? file_tokens(j, type, c.credentials) : nullptr) {
        c.api = JsonApi{"", std::move(tokens)};
      }
    } else {
      c.api = JsonApi{"", metadata_server_tokens()};
      c.credentials = fmt::format("application default credentials ({})", c.api->token->source());
    }
  }
  if (const std::string endpoint = aws::env("TESSERA_GCS_ENDPOINT_URL"); !endpoint.empty()) {
    std::tie(options.scheme, options.endpoint_override) = split_endpoint(endpoint, "https");
  }
  if (c.api) {
    c.api->endpoint = options.endpoint_override.empty() ? "https://storage.googleapis.com"
                                                        : options.scheme + "://" + options.endpoint_override;
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
  c.retry_limit_s = retry_limit;
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

  // The write GCS checks: with the JSON API, an upload conditioned on the generation `expected` (stat()'s version;
  // ifGenerationMatch=0 for an absent object), which GCS refuses with 412 when another writer replaced the object.
  // Without it, the default: stat() compared, then written.
  std::optional<std::string> put_if(const Uri& u, std::string_view data,
                                    const std::optional<std::string>& expected) override {
    const Client& c = client();
    if (!c.api) return Backend::put_if(u, data, expected);
    const std::string generation = expected.value_or("0");
    if (generation.empty() || generation.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
    // A multipart upload (the object's name, then its bytes), as google-cloud-storage sends small objects; the
    // emulators check preconditions on this kind only.
    std::string boundary = "tessera-boundary";
    while (data.find(boundary) != std::string_view::npos) boundary += "-" + std::to_string(boundary.size());
    util::HttpRequest req;
    req.method = "POST";
    req.url = fmt::format("{}/upload/storage/v1/b/{}/o?uploadType=multipart&ifGenerationMatch={}", c.api->endpoint,
                          util::url_encode(u.bucket), generation);
    req.headers = {{"Content-Type", "multipart/related; boundary=" + boundary}};
    req.body = fmt::format(
        "--{0}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{1}\r\n--{0}\r\n"
        "Content-Type: application/octet-stream\r\n\r\n",
        boundary, nlohmann::json{{"name", u.key}}.dump());
    req.body.append(data);
    req.body += fmt::format("\r\n--{}--\r\n", boundary);
    const util::HttpResponse r = json_exchange(req, u, "PUT");
    if (r.status == 412) return std::nullopt;
    if (r.status == 404) {
      throw Error(kGcsComponent, fmt::format("{}: PUT: the bucket {} does not exist", u.str(), u.bucket));
    }
    std::string version = generation_of(json_answer(r, u, "PUT"));
    if (version.empty()) throw Error(kGcsComponent, fmt::format("{}: GCS's answer gives no generation", u.str()));
    return version;
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

  // The version is the object's generation, which put_if's precondition names (the JSON API); with credentials only
  // google-cloud-cpp speaks, Arrow's update time (microseconds; Arrow gives no generation), "" when it has none.
  std::optional<ObjectInfo> stat(const Uri& u) override {
    const Client& c = client();
    if (c.api) {
      util::HttpRequest req;
      req.url = fmt::format("{}/storage/v1/b/{}/o/{}?fields=size,generation", c.api->endpoint,
                            util::url_encode(u.bucket), util::url_encode(u.key));
      const util::HttpResponse r = json_exchange(req, u, "HEAD");
      if (r.status == 404) return std::nullopt;
      const nlohmann::json j = json_answer(r, u, "HEAD");
      return ObjectInfo{u.str(), byte_count(json_text(j, "size"), u.str(), "size", kGcsComponent), generation_of(j)};
    }
    const auto info = check(c.fs->GetFileInfo(path(u)), u, "HEAD");
    if (info.type() != arrow::fs::FileType::File) return std::nullopt;
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

  // One JSON API request with the current bearer token, tried again (backoff) on 429, 5xx and interrupted transfers
  // within TESSERA_GCS_RETRY_LIMIT_S, and once with a fresh token after a 401. A store that cannot be reached throws;
  // any HTTP answer is returned.
  util::HttpResponse json_exchange(util::HttpRequest req, const Uri& u, const char* op) {
    const Client& c = client();
    req.timeout_s = 120;
    req.stall_timeout_s = 30;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(c.retry_limit_s);
    for (int attempt = 1;; ++attempt) {
      util::HttpRequest signed_request = req;
      if (c.api->token) {
        std::string token;
        try {
          token = c.api->token->get().session_token;
        } catch (const Error& e) {  // names the source; not the store's error
          throw Error(kGcsComponent, fmt::format("{}: {}: no access token: {}", u.str(), op, e.message()));
        }
        signed_request.headers.emplace_back("Authorization", "Bearer " + token);
      }
      const util::HttpResponse r = util::http_request(signed_request);
      bool again = r.status == 0 ? r.interrupted : util::retryable_status(r.status);
      if (r.status == 401 && c.api->token && attempt == 1) {
        c.api->token->expired_by_server();
        again = true;
      }
      if (!again || std::chrono::steady_clock::now() >= deadline) {
        if (r.status == 0) {
          throw Error(kGcsComponent, fmt::format("{}: {} failed: {} (credentials: {})", u.str(), op, r.transport_error,
                                                 c.credentials));
        }
        return r;
      }
      util::backoff_sleep(attempt, 0.5, 8.0);
    }
  }

  // A 2xx answer's JSON object; any other answer is an Error naming the URI, the status, GCS's message and where the
  // credentials came from.
  nlohmann::json json_answer(const util::HttpResponse& r, const Uri& u, const char* op) {
    const nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
    if (r.status / 100 == 2 && j.is_object()) return j;
    std::string why;
    if (j.is_object() && j.contains("error") && j["error"].is_object()) why = json_text(j["error"], "message");
    throw Error(kGcsComponent, fmt::format("{}: {} HTTP {}{} (credentials: {})", u.str(), op, r.status,
                                           why.empty() ? "" : " " + why, client().credentials));
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
