// Databricks Unity Catalog volumes (dbfs:/Volumes/<catalog>/<schema>/<volume>/...) through the workspace's Files API
// (/api/2.0/fs/files and /api/2.0/fs/directories), as mosaicml-streaming and Composer reach them with databricks-sdk,
// over the pooled transport (http_pool.h). Credentials as databricks-sdk resolves them: a personal access token, or
// OAuth machine-to-machine with a service principal's client id and secret, from the environment or a
// ~/.databrickscfg profile.
//
// Uploads above 50 MiB go as databricks-sdk's files client sends them where the workspace offers it: a multipart
// upload whose parts go in parallel to presigned cloud-storage URLs (the only way past the Files API's 5 GiB for one
// PUT, which a rank's checkpoint shard can exceed).
#include <fmt/format.h>
#include <strings.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
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
#include "tessera/util/xml.h"

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
  long stall_timeout_s = 30;                   // NOLINT(google-runtime-int)
  uint64_t part_size = 16ULL << 20;            // a range of a download, a part of a multipart upload
  uint64_t multipart_threshold = 50ULL << 20;  // larger uploads go in parts (databricks-sdk's default)
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
    return fetch_access_token(req, source, kDbfsComponent);
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
  c.multipart_threshold =
      static_cast<uint64_t>(env_int("TESSERA_DBFS_MULTIPART_THRESHOLD_MB", 50, 1, 5120, kDbfsComponent)) << 20;
  return c;
}

// Whether a cloud store's answer to a part's PUT says its presigned URL expired (S3, GCS and Azure each say it their
// own way, as databricks-sdk recognises them).
bool presigned_url_expired(const util::HttpResponse& r) {
  if (r.status != 400 && r.status != 403) return false;
  const std::optional<util::XmlElement> doc = util::try_parse_xml(r.body);
  if (!doc || doc->name != "Error") return false;
  const std::string code = doc->child_text("Code");
  return code == "ExpiredToken" || (code == "AccessDenied" && doc->child_text("Message") == "Request has expired") ||
         (code == "AuthenticationFailed" &&
          doc->child_text("AuthenticationErrorDetail").find("Signature not valid in the specified time frame") !=
              std::string::npos);
}

// Now plus an hour in RFC 3339 (the expire_time of the part URLs asked for).
std::string an_hour_from_now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now() + std::chrono::hours(1));
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
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

  // A first write (`expected` absent) is checked by the workspace: one PUT with overwrite=false, which it refuses
  // (409 ALREADY_EXISTS) when the file exists. A later one compares stat's Last-Modified first (the Files API has no
  // If-Match).
  std::optional<std::string> put_if(const Uri& u, std::string_view data,
                                    const std::optional<std::string>& expected) override {
    if (expected) return Backend::put_if(u, data, expected);
    const util::HttpResponse r = send(u.str(), "PUT", files(u) + "?overwrite=false",
                                      {{"Content-Type", "application/octet-stream"}}, {data}, nullptr, {409});
    if (r.status == 409) return std::nullopt;
    const std::optional<ObjectInfo> after = stat(u);
    return after ? after->etag : std::string();
  }

  std::optional<ObjectInfo> stat(const Uri& u) override {
    const std::string uri = u.str();
    const util::HttpResponse r = send(uri, "HEAD", files(u), {}, {});
    if (r.status == 404) return std::nullopt;
    // The Files API sends no ETag: the version write_if compares is the file's Last-Modified (to the second).
    return ObjectInfo{uri, byte_count(r.header("content-length"), uri, "a Content-Length", kDbfsComponent),
                      r.header("last-modified")};
  }

 private:
  const DbfsConfig& config() {
    std::call_once(once_, [this] { config_ = dbfs_config_from_environment(); });
    return config_;
  }

  std::string files(const Uri& u) {
    return fmt::format("{}/api/2.0/fs/files/{}/{}", config().host, u.bucket, util::url_encode(u.key, true));
  }

  // Above multipart_threshold a multipart upload where the workspace offers one; else one PUT of the whole file.
  // Either way the file appears whole when the last request completes.
  void put(const Uri& u, const std::vector<std::string_view>& parts) {
    const Concatenation object(parts);
    const std::string uri = u.str();
    if (object.size() > config().multipart_threshold && put_multipart(u, object)) return;
    if (object.size() > kMaxSinglePut) {
      throw Error(kDbfsComponent, fmt::format("{}: {} bytes; the Files API takes up to 5 GiB in one PUT, and workspace "
                                              "{} offers no multipart upload",
                                              uri, object.size(), config().host));
    }
    send(uri, "PUT", files(u) + "?overwrite=true", {{"Content-Type", "application/octet-stream"}}, parts);
  }

  // A multipart upload as databricks-sdk's files client makes one: initiate-upload opens a session, each part goes
  // to the presigned URL create-upload-part-urls hands out for it, complete-upload publishes the file from the parts'
  // ETags, abort-upload drops the session on failure. False, with nothing written, when the workspace refuses to
  // open a session (it offers only single PUTs).
  bool put_multipart(const Uri& u, const Concatenation& object) {
    const DbfsConfig& c = config();
    const std::string uri = u.str(), url = files(u), path = "/" + u.bucket + "/" + u.key;
    const util::HttpResponse opened =
        send(uri, "POST", url + "?action=initiate-upload&overwrite=true", {}, {}, nullptr, {400, 404, 405, 501});
    if (opened.status >= 300) return false;
    const auto j = nlohmann::json::parse(opened.body, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("multipart_upload") || !j["multipart_upload"].is_object() ||
        !j["multipart_upload"].contains("session_token") || !j["multipart_upload"]["session_token"].is_string() ||
        j["multipart_upload"]["session_token"].get<std::string>().empty()) {
      return false;
    }
    const std::string session = j["multipart_upload"]["session_token"].get<std::string>();
    const std::string session_query = "&upload_type=multipart&session_token=" + util::url_encode(session);
    const uint64_t size = object.size();
    uint64_t part = c.part_size;
    while ((size + part - 1) / part > 10000) part *= 2;  // a cloud store's multipart upload holds up to 10,000 parts
    const size_t count = static_cast<size_t>((size + part - 1) / part);
    std::vector<std::string> etags(count);
    try {
      parallel_for(count, c.parallelism, [&](size_t i) {
        const uint64_t begin = i * part;
        etags[i] = put_part(uri, path, session, i + 1, object.views(begin, std::min(size - begin, part)));
      });
      nlohmann::json done{{"parts", nlohmann::json::array()}};
      for (size_t i = 0; i < count; ++i) done["parts"].push_back({{"part_number", i + 1}, {"etag", etags[i]}});
      const std::string body = done.dump();
      send(uri, "POST", url + "?action=complete-upload" + session_query, {{"Content-Type", "application/json"}},
           {body});
    } catch (...) {
      try {
        send(uri, "POST", url + "?action=abort-upload" + session_query, {}, {});
      } catch (const std::exception&) {
        // The session expires unseen; the first error is the one to report.
      }
      throw;
    }
    return true;
  }

  // One part: its presigned URL from the workspace, then a PUT there with the headers the workspace named and none
  // of the workspace's credentials. Transient failures are retried; an expired URL is replaced (up to 3 times).
  // Errors never show the URL (its signature is a credential). Returns the ETag the cloud store gave the part.
  std::string put_part(const std::string& uri, const std::string& path, const std::string& session, size_t number,
                       const std::vector<std::string_view>& data) {
    const DbfsConfig& c = config();
    std::string last_error;
    int replaced = 0;
    for (int attempt = 0; attempt < c.max_attempts; ++attempt) {
      if (attempt > 0) backoff_sleep(attempt, c.backoff_base_s, c.backoff_max_s);
      Exchange x = part_url(uri, path, session, number);
      x.payload_parts = data;
      bool retryable = false;
      const util::HttpResponse r = pool_.perform(x, &retryable);
      if (r.status >= 200 && r.status < 300) {
        std::string etag = r.header("etag");
        if (etag.empty())
          throw Error(kDbfsComponent, fmt::format("{}: part {} was stored without an ETag", uri, number));
        return etag;
      }
      if (r.status == 0) {
        last_error = fmt::format("part {} PUT failed: {}", number, r.transport_error);
        if (retryable) continue;
        throw Error(kDbfsComponent, fmt::format("{}: {}", uri, last_error));
      }
      if (presigned_url_expired(r)) {
        last_error = fmt::format("part {}: the presigned URL expired {} times", number, replaced + 1);
        if (replaced++ < 3) {
          --attempt;  // a new URL is not a retry of a failure
          continue;
        }
        throw Error(kDbfsComponent, fmt::format("{}: {}", uri, last_error));
      }
      const std::optional<util::XmlElement> doc = util::try_parse_xml(r.body);
      const std::string code = doc ? doc->child_text("Code") : "";
      last_error = fmt::format("part {} PUT HTTP {} from the cloud store{}", number, r.status,
                               code.empty() ? "" : " (" + code + ")");
      if (retryable_status(r.status)) continue;
      throw Error(kDbfsComponent, fmt::format("{}: {}", uri, last_error));
    }
    throw Error(kDbfsComponent, fmt::format("{}: {} (gave up after {} attempts)", uri, last_error, c.max_attempts));
  }

  // The PUT of part `number` as create-upload-part-urls describes it: its URL (http or https) and headers.
  Exchange part_url(const std::string& uri, const std::string& path, const std::string& session, size_t number) {
    const nlohmann::json ask{{"path", path},
                             {"session_token", session},
                             {"start_part_number", number},
                             {"count", 1},
                             {"expire_time", an_hour_from_now()}};
    const std::string body = ask.dump();
    const util::HttpResponse r = send(uri, "POST", config().host + "/api/2.0/fs/create-upload-part-urls",
                                      {{"Content-Type", "application/json"}}, {body});
    const auto j = nlohmann::json::parse(r.body, nullptr, false);
    const nlohmann::json* entry = nullptr;
    if (!j.is_discarded() && j.is_object() && j.contains("upload_part_urls") && j["upload_part_urls"].is_array()) {
      for (const auto& e : j["upload_part_urls"]) {
        if (e.is_object() && e.contains("part_number") && e["part_number"].is_number_unsigned() &&
            e["part_number"].get<uint64_t>() == number && e.contains("url") && e["url"].is_string()) {
          entry = &e;
        }
      }
    }
    const std::string url = entry != nullptr ? (*entry)["url"].get<std::string>() : "";
    if (url.rfind("https://", 0) != 0 && url.rfind("http://", 0) != 0) {
      throw Error(kDbfsComponent,
                  fmt::format("{}: create-upload-part-urls gave no http(s) URL for part {}", uri, number));
    }
    Exchange x{
        "PUT", url, {{"Content-Type", "application/octet-stream"}}, {}, {}, nullptr, 10, config().stall_timeout_s};
    if (entry->contains("headers") && (*entry)["headers"].is_array()) {
      for (const auto& h : (*entry)["headers"]) {
        if (!h.is_object() || !h.contains("name") || !h["name"].is_string() || !h.contains("value") ||
            !h["value"].is_string()) {
          throw Error(kDbfsComponent,
                      fmt::format("{}: create-upload-part-urls gave a malformed header for part {}", uri, number));
        }
        const std::string name = h["name"].get<std::string>(), value = h["value"].get<std::string>();
        if (name.find_first_of(":\r\n") != std::string::npos || value.find_first_of("\r\n") != std::string::npos) {
          throw Error(kDbfsComponent,
                      fmt::format("{}: create-upload-part-urls gave a malformed header for part {}", uri, number));
        }
        auto same = std::find_if(x.headers.begin(), x.headers.end(),
                                 [&](const auto& kv) { return strcasecmp(kv.first.c_str(), name.c_str()) == 0; });
        if (same != x.headers.end()) {
          same->second = value;
        } else {
          x.headers.emplace_back(name, value);
        }
      }
    }
    return x;
  }

  // Sends one request with the workspace's credentials, retrying transient failures; throws naming `uri`. 404 on
  // HEAD, DELETE and directory listings, 416 on GET and the statuses in `returned` come back to the caller. `parts`
  // is a PUT's body, or a POST's JSON as one buffer.
  util::HttpResponse send(const std::string& uri, const std::string& method, const std::string& url,
                          const std::vector<std::pair<std::string, std::string>>& headers,
                          const std::vector<std::string_view>& parts, const BodySink* sink = nullptr,
                          const std::vector<int>& returned = {}) {
    const DbfsConfig& c = config();
    std::string last_error;
    for (int attempt = 0; attempt < c.max_attempts; ++attempt) {
      if (attempt > 0) backoff_sleep(attempt, c.backoff_base_s, c.backoff_max_s);
      Exchange x{method, url, headers, {}, {}, sink, 10, c.stall_timeout_s};
      if (method == "POST") {
        x.payload = parts.empty() ? std::string_view("") : parts.front();
      } else {
        x.payload_parts = parts;
      }
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
      if (std::find(returned.begin(), returned.end(), static_cast<int>(r.status)) != returned.end()) return r;
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
