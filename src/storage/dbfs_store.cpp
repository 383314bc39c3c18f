// Databricks Unity Catalog volumes (dbfs:/Volumes/<catalog>/<schema>/<volume>/...) through the workspace's Files API
// (/api/2.0/fs/files and /api/2.0/fs/directories), as mosaicml-streaming and Composer reach them with databricks-sdk,
// over the pooled transport (http_pool.h). Credentials as databricks-sdk resolves them: a personal access token, or
// OAuth machine-to-machine with a service principal's client id and secret, from the environment or a
// ~/.databrickscfg profile.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <deque>
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
#include "tessera/util/http.h"

namespace tessera::storage {
namespace {

constexpr const char* kDbfsComponent = "dbfs";
// The Files API takes a file of up to 5 GiB in one PUT.
constexpr uint64_t kMaxSinglePut = 5ULL << 30;

struct DbfsConfig {
  std::string host;                           // https://<workspace>, no trailing '/'
  std::string token;                          // a personal access token, or empty with `oauth`
  std::shared_ptr<CredentialProvider> oauth;  // OAuth M2M access tokens (session_token), refreshed
  std::string source;                         // where the credentials came from; never a secret
  int max_attempts = 5;
  double backoff_base_s = 0.1, backoff_max_s = 5.0;
  long stall_timeout_s = 30;  // NOLINT(google-runtime-int)
  uint64_t part_size = 16ULL << 20;
  int parallelism = 8;
};

// OAuth machine-to-machine: the workspace's token endpoint with the service principal's id and secret (HTTP basic),
// scope all-apis, as databricks-sdk's oauth-m2m credentials do.
std::shared_ptr<CredentialProvider> oauth_m2m(const std::string& host, const std::string& client,
                                              const std::string& secret, const std::string& source) {
  return refreshing_credentials(source, [=] {
    util::HttpRequest req;
    req.method = "POST";
    req.url = host + "/oidc/v1/token";
    req.headers = {{"Content-Type", "application/x-www-form-urlencoded"}};
    req.body = "grant_type=client_credentials&scope=all-apis";
    req.basic_user = client;
    req.basic_password = secret;
    const util::HttpResponse r = util::http_request(req);
    if (r.status == 0) throw Error(kDbfsComponent, fmt::format("{}: {}", source, r.transport_error));
    const auto j = nlohmann::json::parse(r.body, nullptr, false);
    const bool ok = !j.is_discarded() && j.is_object();
    if (r.status != 200 || !ok || !j.contains("access_token") || !j["access_token"].is_string()) {
      std::string why;
      if (ok && j.contains("error") && j["error"].is_string()) why = " " + j["error"].get<std::string>();
      if (ok && j.contains("error_description") && j["error_description"].is_string()) {
        why += ": " + j["error_description"].get<std::string>();
      }
      throw Error(kDbfsComponent, fmt::format("{}: the token endpoint answered HTTP {}{}", source, r.status, why));
    }
    S3Credentials c;
    c.session_token = j["access_token"].get<std::string>();
    c.source = source;
    const int64_t lifetime =
        j.contains("expires_in") && j["expires_in"].is_number_integer() ? j["expires_in"].get<int64_t>() : 3600;
    c.expiration = std::chrono::system_clock::now() + std::chrono::seconds(lifetime);
    return c;
  });
}

// DATABRICKS_HOST / _TOKEN / _CLIENT_ID / _CLIENT_SECRET, else the profile (DATABRICKS_CONFIG_PROFILE, default
// DEFAULT) of DATABRICKS_CONFIG_FILE (default ~/.databrickscfg), as databricks-sdk reads them.
DbfsConfig dbfs_config_from_environment() {
  DbfsConfig c;
  const std::string file = aws::env("DATABRICKS_CONFIG_FILE").empty() ? aws::env("HOME") + "/.databrickscfg"
                                                                      : aws::env("DATABRICKS_CONFIG_FILE");
  const std::string profile =
      aws::env("DATABRICKS_CONFIG_PROFILE").empty() ? "DEFAULT" : aws::env("DATABRICKS_CONFIG_PROFILE");
  const auto section = aws::ini_section(file, profile);
  const auto setting = [&](const char* variable, const char* key, std::string* where) {
    if (!aws::env(variable).empty()) {
      *where = variable;
      return aws::env(variable);
    }
    if (section.count(key) > 0 && !section.at(key).empty()) {
      *where = fmt::format("{} [{}]", file, profile);
      return section.at(key);
    }
    return std::string();
  };
  std::string host_from, token_from, id_from, secret_from;
  c.host = setting("DATABRICKS_HOST", "host", &host_from);
  if (c.host.empty()) {
    throw ConfigError(kDbfsComponent,
                      fmt::format("no Databricks workspace: set DATABRICKS_HOST (or `host` in the [{}] profile of {})",
                                  profile, file));
  }
  if (c.host.find("://") == std::string::npos) c.host = "https://" + c.host;
  while (!c.host.empty() && c.host.back() == '/') c.host.pop_back();
  c.token = setting("DATABRICKS_TOKEN", "token", &token_from);
  if (!c.token.empty()) {
    c.source = token_from == "DATABRICKS_TOKEN" ? "DATABRICKS_TOKEN" : fmt::format("the token in {}", token_from);
  } else {
    const std::string client = setting("DATABRICKS_CLIENT_ID", "client_id", &id_from);
    const std::string secret = setting("DATABRICKS_CLIENT_SECRET", "client_secret", &secret_from);
    if (client.empty() || secret.empty()) {
      throw ConfigError(kDbfsComponent,
                        fmt::format("no Databricks credentials for {}: set DATABRICKS_TOKEN, or DATABRICKS_CLIENT_ID "
                                    "and DATABRICKS_CLIENT_SECRET (OAuth machine-to-machine), or `token` / "
                                    "`client_id` + `client_secret` in the [{}] profile of {}",
                                    c.host, profile, file));
    }
    c.source = fmt::format("OAuth machine-to-machine for client {} ({})", client, secret_from);
    c.oauth = oauth_m2m(c.host, client, secret, c.source);
  }
  c.max_attempts = env_int("TESSERA_DBFS_MAX_ATTEMPTS", c.max_attempts, 1, 100, kDbfsComponent);
  c.parallelism = env_int("TESSERA_DBFS_PARALLELISM", c.parallelism, 1, 256, kDbfsComponent);
  c.stall_timeout_s =
      env_int("TESSERA_DBFS_STALL_TIMEOUT_S", static_cast<int>(c.stall_timeout_s), 1, 3600, kDbfsComponent);
  c.part_size = static_cast<uint64_t>(env_int("TESSERA_DBFS_PART_SIZE_MB", 16, 1, 4096, kDbfsComponent)) << 20;
  return c;
}

class DbfsBackend final : public Backend {
 public:
  std::string get(const Uri& u) override { return send(u.str(), "GET", files(u), {}, {}).body; }

  std::string get_range(const Uri& u, uint64_t offset, uint64_t length) override {
    if (length == 0) return {};
    const std::string uri = u.str();
    util::HttpResponse r =
        send(uri, "GET", files(u), {{"Range", fmt::format("bytes={}-{}", offset, offset + length - 1)}}, {});
    if (r.status == 200 && r.body.size() >= offset + length) r.body = r.body.substr(offset, length);
    if (r.body.size() != length) {
      throw Error(kDbfsComponent, fmt::format("{}: asked for {} bytes at {}, got {} (the file is shorter)", uri, length,
                                              offset, r.body.size()));
    }
    return std::move(r.body);
  }

  void download(const Uri& u, const std::string& local_path) override {
    const DbfsConfig& c = config();
    const std::string uri = u.str(), url = files(u);
    // Ranges after the first are pinned to the version it saw with If-Unmodified-Since (the Files API's condition).
    ranged_download(
        uri, local_path, c.part_size, c.parallelism,
        [&](uint64_t first, uint64_t last, const std::string& modified, const BodySink& sink) {
          std::vector<std::pair<std::string, std::string>> headers{{"Range", fmt::format("bytes={}-{}", first, last)}};
          if (!modified.empty()) headers.emplace_back("If-Unmodified-Since", modified);
          const util::HttpResponse r = send(uri, "GET", url, headers, {}, &sink);
          return RangeAnswer{r.status, r.header("content-range"), r.header("last-modified")};
        });
  }

  void put_parts(const Uri& u, const std::vector<std::string_view>& parts) override { put(u, parts); }

  void upload_file(const std::string& local_path, const Uri& u) override {
    const MappedFile file(local_path, kDbfsComponent);
    put(u, {file.bytes()});
  }

  std::vector<ObjectInfo> list(const Uri& prefix) override {
    // The Files API lists one directory at a time: start at the prefix's folder, keep what starts with the prefix,
    // and walk down every directory under it.
    const std::string want = "/" + prefix.bucket + "/" + prefix.key;
    const std::string top = want.substr(0, want.rfind('/'));
    std::vector<ObjectInfo> out;
    std::deque<std::string> folders{top};
    while (!folders.empty()) {
      const std::string folder = folders.front();
      folders.pop_front();
      std::string page_token;
      do {
        std::string url = fmt::format("{}/api/2.0/fs/directories{}", config().host, util::url_encode(folder, true));
        if (!page_token.empty()) url += "?page_token=" + util::url_encode(page_token);
        const util::HttpResponse r = send("dbfs:" + folder, "GET", url, {}, {});
        if (r.status == 404) break;  // a folder that does not exist holds nothing
        const auto j = nlohmann::json::parse(r.body, nullptr, false);
        if (j.is_discarded() || !j.is_object()) {
          throw Error(kDbfsComponent, fmt::format("dbfs:{}: a listing that is not a JSON object", folder));
        }
        for (const auto& entry : j.value("contents", nlohmann::json::array())) {
          const std::string path = entry.value("path", "");
          if (path.rfind(folder + "/", 0) != 0) {
            throw Error(kDbfsComponent, fmt::format("dbfs:{}: the listing names {}, outside the folder", folder, path));
          }
          if (entry.value("is_directory", false)) {
            if (path.rfind(want, 0) == 0 || want.rfind(path + "/", 0) == 0) folders.push_back(path);
          } else if (path.rfind(want, 0) == 0) {
            const uint64_t size = entry.contains("file_size") && entry["file_size"].is_number_unsigned()
                                      ? entry["file_size"].get<uint64_t>()
                                      : 0;
            out.push_back({"dbfs:" + path, size, ""});
          }
        }
        page_token = j.contains("next_page_token") && j["next_page_token"].is_string()
                         ? j["next_page_token"].get<std::string>()
                         : "";
      } while (!page_token.empty());
    }
    std::sort(out.begin(), out.end(), [](const ObjectInfo& a, const ObjectInfo& b) { return a.uri < b.uri; });
    return out;
  }

  void remove(const Uri& u) override { send(u.str(), "DELETE", files(u), {}, {}); }

  std::optional<ObjectInfo> stat(const Uri& u) override {
    const std::string uri = u.str();
    const util::HttpResponse r = send(uri, "HEAD", files(u), {}, {});
    if (r.status == 404) return std::nullopt;
    return ObjectInfo{uri, byte_count(r.header("content-length"), uri, "a Content-Length", kDbfsComponent), ""};
  }

 private:
  const DbfsConfig& config() {
    std::call_once(once_, [this] { config_ = dbfs_config_from_environment(); });
    return config_;
  }

  std::string files(const Uri& u) {
    return fmt::format("{}/api/2.0/fs/files/{}/{}", config().host, u.bucket, util::url_encode(u.key, true));
  }

  // One PUT of the whole file (the Files API publishes it when the request completes).
  void put(const Uri& u, const std::vector<std::string_view>& parts) {
    uint64_t size = 0;
    for (const std::string_view p : parts) size += p.size();
    const std::string uri = u.str();
    if (size > kMaxSinglePut) {
      throw Error(kDbfsComponent, fmt::format("{}: {} bytes; the Files API takes up to 5 GiB in one upload, and "
                                              "Tessera does not split uploads to volumes yet",
                                              uri, size));
    }
    send(uri, "PUT", files(u) + "?overwrite=true", {{"Content-Type", "application/octet-stream"}}, parts);
  }

  // Sends one request with the workspace's credentials, retrying transient failures; throws naming `uri`. 404 on
  // HEAD, DELETE and directory listings, and 416 on GET, come back to the caller.
  util::HttpResponse send(const std::string& uri, const std::string& method, const std::string& url,
                          const std::vector<std::pair<std::string, std::string>>& headers,
                          const std::vector<std::string_view>& parts, const BodySink* sink = nullptr) {
    const DbfsConfig& c = config();
    std::string last_error;
    for (int attempt = 0; attempt < c.max_attempts; ++attempt) {
      if (attempt > 0) backoff_sleep(attempt, c.backoff_base_s, c.backoff_max_s);
      Exchange x{method, url, headers, {}, parts, sink, 10, c.stall_timeout_s};
      x.headers.emplace_back("Authorization", "Bearer " + (c.oauth ? c.oauth->get().session_token : c.token));
      bool retryable = false;
      util::HttpResponse r = pool_.perform(x, &retryable);
      if (r.status == 0) {
        last_error = fmt::format("{} failed: {}", method, r.transport_error);
        if (retryable) continue;
        throw Error(kDbfsComponent, fmt::format("{}: {}", uri, last_error));
      }
      if (r.status >= 200 && r.status < 300) return r;
      std::string code, message;
      const auto j = nlohmann::json::parse(r.body, nullptr, false);
      if (!j.is_discarded() && j.is_object()) {
        if (j.contains("error_code") && j["error_code"].is_string()) code = j["error_code"].get<std::string>();
        if (j.contains("message") && j["message"].is_string()) message = j["message"].get<std::string>();
      }
      last_error = fmt::format("{} HTTP {}{}{}", method, r.status, code.empty() ? "" : " " + code,
                               message.empty() ? "" : ": " + message);
      if (retryable_status(r.status) || code == "TEMPORARILY_UNAVAILABLE" || code == "REQUEST_LIMIT_EXCEEDED") {
        continue;
      }
      if (r.status == 401 && c.oauth && attempt + 1 < c.max_attempts) {
        c.oauth->expired_by_server();  // a token the workspace saw expire first: fetch another, try again
        continue;
      }
      if (r.status == 404 &&
          (method == "HEAD" || method == "DELETE" || url.find("/fs/directories") != std::string::npos)) {
        return r;
      }
      if (r.status == 416 && method == "GET") return r;
      if (r.status == 401 || r.status == 403) {
        last_error += fmt::format(" (workspace {}; credentials from {})", c.host, c.source);
      }
      throw Error(kDbfsComponent, fmt::format("{}: {}", uri, last_error));
    }
    throw Error(kDbfsComponent, fmt::format("{}: {} (gave up after {} attempts)", uri, last_error, c.max_attempts));
  }

  std::once_flag once_;
  DbfsConfig config_;
  HttpPool pool_;
};

}  // namespace

Backend& dbfs_backend() {
  static DbfsBackend backend;
  return backend;
}

}  // namespace tessera::storage
