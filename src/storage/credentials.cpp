// The AWS SDKs' default credentials chain for the S3 client (tessera/storage/s3.h): static keys from the environment
// or the shared files; temporary ones from STS (AssumeRole for a profile's role_arn, AssumeRoleWithWebIdentity for
// EKS's IRSA), a profile's credential_process, the container endpoint (ECS, SageMaker, EKS Pod Identity) and the EC2
// instance metadata service (IMDSv2). Temporary credentials are fetched again before they expire.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "tessera/storage/aws_files.h"
#include "tessera/storage/s3.h"
#include "tessera/util/error.h"
#include "tessera/util/http.h"
#include "tessera/util/xml.h"

namespace tessera::storage {
// Named, so that the helpers below cannot meet s3_client.cpp's in a unity build.
namespace credential_chain {
namespace {

using Clock = std::chrono::system_clock;
using aws::env;
constexpr const char* kCredentialsComponent = "s3 credentials";
std::atomic<int64_t> g_credential_loads{0};

// ---- small parsers

// ISO 8601 as AWS writes expirations: 2026-11-28T01:02:03Z, with optional fractional seconds or a +HH:MM offset.
Clock::time_point parse_expiration(const std::string& text, const std::string& where) {
  std::tm tm{};
  int consumed = 0;
  if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                  &tm.tm_min, &tm.tm_sec, &consumed) != 6) {
    throw Error(kCredentialsComponent, fmt::format("{}: unreadable Expiration '{}'", where, text));
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  auto t = Clock::from_time_t(timegm(&tm));
  size_t i = static_cast<size_t>(consumed);
  if (i < text.size() && text[i] == '.') {
    while (i + 1 < text.size() && std::isdigit(static_cast<unsigned char>(text[i + 1]))) ++i;
    ++i;
  }
  int oh = 0, om = 0;
  if (i < text.size() && (text[i] == '+' || text[i] == '-') &&
      std::sscanf(text.c_str() + i + 1, "%2d:%2d", &oh, &om) == 2) {
    const auto offset = std::chrono::hours(oh) + std::chrono::minutes(om);
    t = text[i] == '+' ? t - offset : t + offset;
  }
  return t;
}

// Credentials from a JSON document as the container endpoint, IMDS and credential_process write them.
S3Credentials from_json(const std::string& body, const std::string& where, const char* token_key) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(body);
  } catch (const nlohmann::json::exception&) {
    throw Error(kCredentialsComponent, fmt::format("{}: the answer is not JSON", where));
  }
  S3Credentials c;
  if (!j.is_object() || !j.contains("AccessKeyId") || !j.contains("SecretAccessKey")) {
    throw Error(kCredentialsComponent, fmt::format("{}: the answer has no AccessKeyId and SecretAccessKey", where));
  }
  for (const char* key : {"AccessKeyId", "SecretAccessKey"}) {
    if (!j.at(key).is_string()) {
      throw Error(kCredentialsComponent, fmt::format("{}: {} in the answer is not a string", where, key));
    }
  }
  c.access_key_id = j.at("AccessKeyId").get<std::string>();
  c.secret_access_key = j.at("SecretAccessKey").get<std::string>();
  if (j.contains(token_key) && j.at(token_key).is_string()) c.session_token = j.at(token_key).get<std::string>();
  if (j.contains("Expiration") && j.at("Expiration").is_string()) {
    c.expiration = parse_expiration(j.at("Expiration").get<std::string>(), where);
  }
  c.source = where;
  return c;
}

std::string read_token_file(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  if (!in) throw ConfigError(kCredentialsComponent, fmt::format("{}: cannot read the token file {}", what, path));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string token = ss.str();
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
  return token;
}

// An HTTP exchange with a few tries on transport failures and 5xx answers (the metadata endpoints and STS throttle).
util::HttpResponse exchange(const util::HttpRequest& request, int attempts) {
  util::HttpResponse r;
  for (int i = 0; i < attempts; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100 << i));
    r = util::http_request(request);
    if (r.transport_error.empty() && r.status < 500) break;
  }
  return r;
}

std::string describe(const util::HttpResponse& r) {
  return r.transport_error.empty() ? fmt::format("HTTP {}", r.status) : r.transport_error;
}

// ---- providers

class FixedProvider final : public CredentialProvider {
 public:
  explicit FixedProvider(S3Credentials c) : c_(std::move(c)) {}
  S3Credentials get() override { return c_; }
  std::string source() const override { return c_.source; }

 private:
  S3Credentials c_;
};

// Temporary credentials from `fetch`, fetched again when they are about to expire: within 5 minutes of their
// expiration, or within half their lifetime when that is shorter. While one thread fetches, the others go on with
// the credentials they have if those have not expired yet, so transfers do not stop for a refresh. A failed refresh
// keeps unexpired credentials (with a warning) and fails only once they have expired.
class RefreshingProvider final : public CredentialProvider {
 public:
  RefreshingProvider(std::string source, std::function<S3Credentials()> fetch)
      : source_(std::move(source)), fetch_(std::move(fetch)) {}

  S3Credentials get() override {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      const auto now = Clock::now();
      if (current_ && !stale_ && !due(now)) return *current_;
      if (!refreshing_) break;
      if (current_ && !expired(now)) return *current_;  // someone is fetching; these still work
      cv_.wait(lock);
    }
    refreshing_ = true;
    // However this refresh ends (credentials, an error, any exception from here on), refreshing_ goes down and the
    // waiters wake; left up, it made every later get() wait forever.
    const Lowered lowered(*this, lock);
    lock.unlock();
    std::optional<S3Credentials> fresh;
    std::string failure;
    try {
      fresh = fetch_();
    } catch (const Error& e) {
      failure = e.message();
    } catch (const std::exception& e) {  // a source's answer that a parser choked on, bad_alloc, ...
      failure = fmt::format("{}: {}", source_, e.what());
    } catch (...) {
      failure = fmt::format("{}: the refresh failed with an unknown exception", source_);
    }
    lock.lock();
    if (fresh) {
      obtained_ = Clock::now();
      current_ = std::move(fresh);
      stale_ = false;
      return *current_;
    }
    if (current_ && !expired(Clock::now())) {
      spdlog::warn("{}: refreshing the credentials failed, using the current ones until they expire: {}", source_,
                   failure);
      return *current_;
    }
    throw Error(kCredentialsComponent, failure);
  }

  void expired_by_server() override {
    std::lock_guard<std::mutex> lock(mutex_);
    stale_ = true;
  }

  std::string source() const override { return source_; }

 private:
  // Lowers refreshing_ and wakes the waiters when it goes out of scope, taking `lock` back if it is not held.
  class Lowered {
   public:
    Lowered(RefreshingProvider& p, std::unique_lock<std::mutex>& lock) : p_(p), lock_(lock) {}
    Lowered(const Lowered&) = delete;
    Lowered& operator=(const Lowered&) = delete;
    ~Lowered() {
      if (!lock_.owns_lock()) lock_.lock();
      p_.refreshing_ = false;
      p_.cv_.notify_all();
    }

   private:
    RefreshingProvider& p_;
    std::unique_lock<std::mutex>& lock_;
  };

  bool due(Clock::time_point now) const {
    if (!current_->expiration) return false;
    const auto lifetime = *current_->expiration - obtained_;
    const auto margin = std::min<Clock::duration>(std::chrono::minutes(5), lifetime / 2);
    return now >= *current_->expiration - margin;
  }
  bool expired(Clock::time_point now) const { return current_->expiration && now >= *current_->expiration; }

  const std::string source_;
  const std::function<S3Credentials()> fetch_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::optional<S3Credentials> current_;
  Clock::time_point obtained_;
  bool refreshing_ = false;
  bool stale_ = false;
};

// ---- STS

std::string sts_endpoint(const std::map<std::string, std::string>& profile) {
  std::string e = env("AWS_ENDPOINT_URL_STS");
  if (e.empty()) e = env("AWS_ENDPOINT_URL");
  if (e.empty() && profile.count("endpoint_url")) e = profile.at("endpoint_url");
  if (e.empty()) e = fmt::format("https://sts.{}.amazonaws.com", aws::region());
  while (!e.empty() && e.back() == '/') e.pop_back();
  return e;
}

// One STS Query API call (https://docs.aws.amazon.com/STS/latest/APIReference/); signed with `signer` unless null
// (AssumeRoleWithWebIdentity is not signed). Returns the credentials in its answer.
S3Credentials sts(const std::string& endpoint, const std::string& action,
                  const std::vector<std::pair<std::string, std::string>>& params, const S3Credentials* signer,
                  const std::string& what) {
  std::string form = "Action=" + action + "&Version=2011-06-15";
  for (const auto& [k, v] : params) form += "&" + k + "=" + util::url_encode(v);
  util::HttpRequest req;
  req.method = "POST";
  req.url = endpoint + "/";
  req.body = form;
  req.connect_timeout_s = 10;
  req.timeout_s = 30;
  req.headers.emplace_back("Content-Type", "application/x-www-form-urlencoded; charset=utf-8");
  if (signer != nullptr) {
    const auto parts = util::parse_url(endpoint);
    if (!parts)
      throw ConfigError(kCredentialsComponent, fmt::format("STS endpoint {}: not a URL with a host", endpoint));
    const std::string& host = parts->authority;
    const std::string date = aws::amz_now();
    const std::string payload_hash = sigv4::sha256_hex(form);
    sigv4::Request sr{"POST", "/", {}, {}, payload_hash};
    sr.headers = {{"content-type", "application/x-www-form-urlencoded; charset=utf-8"},
                  {"host", host},
                  {"x-amz-date", date},
                  {"x-amz-content-sha256", payload_hash}};
    if (!signer->session_token.empty()) sr.headers.emplace_back("x-amz-security-token", signer->session_token);
    req.headers.emplace_back("X-Amz-Date", date);
    req.headers.emplace_back("X-Amz-Content-Sha256", payload_hash);
    if (!signer->session_token.empty()) req.headers.emplace_back("X-Amz-Security-Token", signer->session_token);
    req.headers.emplace_back("Authorization", sigv4::authorization(sr, *signer, aws::region(), "sts", date));
  }
  const std::string where = fmt::format("{}: STS {} at {}", what, action, endpoint);
  const util::HttpResponse r = exchange(req, 3);
  if (!r.transport_error.empty() || r.status != 200) {
    const auto [code, message] = aws::error_code_message(r.body);
    throw Error(kCredentialsComponent, fmt::format("{}: {}{}{}", where, describe(r), code.empty() ? "" : " " + code,
                                                   message.empty() ? "" : ": " + message));
  }
  const util::XmlElement answer = util::parse_xml(r.body, kCredentialsComponent, where + "'s answer");
  const util::XmlElement* credentials = answer.find("Credentials");
  if (credentials == nullptr)
    throw Error(kCredentialsComponent, fmt::format("{}: the answer holds no credentials", where));
  S3Credentials c;
  c.access_key_id = credentials->child_text("AccessKeyId");
  c.secret_access_key = credentials->child_text("SecretAccessKey");
  c.session_token = credentials->child_text("SessionToken");
  if (c.access_key_id.empty() || c.secret_access_key.empty()) {
    throw Error(kCredentialsComponent, fmt::format("{}: the answer holds no credentials", where));
  }
  const std::string expiration = credentials->child_text("Expiration");
  if (!expiration.empty()) c.expiration = parse_expiration(expiration, where);
  c.source = what;
  return c;
}

std::string session_name(const std::map<std::string, std::string>& profile, const char* env_name) {
  if (env_name != nullptr && !env(env_name).empty()) return env(env_name);
  if (profile.count("role_session_name")) return profile.at("role_session_name");
  return fmt::format("tessera-{}",
                     std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count());
}

std::shared_ptr<CredentialProvider> web_identity(const std::string& token_file, const std::string& role_arn,
                                                 const std::string& session, const std::string& endpoint,
                                                 const std::string& what) {
  return std::make_shared<RefreshingProvider>(what, [=] {
    const std::string token = read_token_file(token_file, what);  // read each time: EKS rotates it
    return sts(endpoint, "AssumeRoleWithWebIdentity",
               {{"RoleArn", role_arn}, {"RoleSessionName", session}, {"WebIdentityToken", token}}, nullptr, what);
  });
}

// ---- the container endpoint and EC2 instance metadata

// An address the container endpoint may have over plain http, as the AWS SDKs allow: loopback (127.0.0.0/8, ::1,
// and 127/8 mapped into IPv6) or the ECS and EKS Pod Identity endpoints (169.254.170.2, 169.254.170.23,
// fd00:ec2::23).
bool container_address(const sockaddr* a) {
  const auto v4 = [](uint32_t ip) { return (ip >> 24) == 127 || ip == 0xa9feaa02 || ip == 0xa9feaa17; };
  if (a->sa_family == AF_INET) return v4(ntohl(reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr));
  if (a->sa_family != AF_INET6) return false;
  const in6_addr& ip = reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr;
  in6_addr eks{};
  ::inet_pton(AF_INET6, "fd00:ec2::23", &eks);
  if (IN6_IS_ADDR_LOOPBACK(&ip) || std::memcmp(&ip, &eks, sizeof ip) == 0) return true;
  if (!IN6_IS_ADDR_V4MAPPED(&ip)) return false;
  uint32_t mapped = 0;
  std::memcpy(&mapped, ip.s6_addr + 12, 4);
  return v4(ntohl(mapped));
}

std::string address_text(const sockaddr* a) {
  char buf[INET6_ADDRSTRLEN] = {};
  const void* raw = a->sa_family == AF_INET
                        ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(a)->sin_addr)
                        : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr);
  return ::inet_ntop(a->sa_family, raw, buf, sizeof buf) != nullptr ? buf : "?";
}

// The AWS SDKs' rule for the container endpoint: https to any host, plain http only to a host all of whose addresses
// container_address() allows. The host is the one libcurl (which makes the request) reads from the URI, after any
// user name and without brackets: a text prefix let http://127.evil.example/ and http://127.0.0.1@evil.example/
// through. Throws ConfigError starting with `setting` (the variable and its value) and naming the host. (The host is
// resolved again when the request is made; like the SDKs' check, this one trusts the resolver not to answer
// differently a moment later.)
void check_container_uri(const std::string& url, const std::string& setting) {
  const auto refuse = [&](const std::string& why) {
    throw ConfigError(kCredentialsComponent, fmt::format("{}: {}", setting, why));
  };
  const auto parts = util::parse_url(url);
  if (!parts) throw ConfigError(kCredentialsComponent, fmt::format("{}: not a URL with a host", setting));
  if (parts->scheme == "https") return;
  if (parts->scheme != "http") refuse(fmt::format("the scheme must be http or https, not {}", parts->scheme));
  const std::string& host = parts->host;
  const std::string rule =
      "over http the host must resolve only to loopback addresses (127.0.0.0/8, ::1) or the ECS/EKS endpoints "
      "(169.254.170.2, 169.254.170.23, fd00:ec2::23)";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0) {
    refuse(fmt::format("{}, and host {} does not resolve ({})", rule, host, ::gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> keep(found, ::freeaddrinfo);
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (!container_address(a->ai_addr)) {
      refuse(fmt::format("{}; host {} resolves to {}", rule, host, address_text(a->ai_addr)));
    }
  }
}

std::shared_ptr<CredentialProvider> container_provider() {
  const std::string relative = env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
  const std::string full = env("AWS_CONTAINER_CREDENTIALS_FULL_URI");
  const std::string url = !relative.empty() ? "http://169.254.170.2" + relative : full;
  const std::string what = fmt::format("the container credentials endpoint {}", url);
  // The relative URI too: appended to the ECS address, "@evil.example/" would make it another host.
  check_container_uri(url, relative.empty()
                               ? "AWS_CONTAINER_CREDENTIALS_FULL_URI=" + full
                               : fmt::format("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI={} ({})", relative, url));
  return std::make_shared<RefreshingProvider>(what, [url, what] {
    util::HttpRequest req;
    req.url = url;
    req.connect_timeout_s = 2;
    req.timeout_s = 5;
    std::string token;
    if (!env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE").empty()) {
      token = read_token_file(env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"), what);
    } else {
      token = env("AWS_CONTAINER_AUTHORIZATION_TOKEN");
    }
    if (!token.empty()) req.headers.emplace_back("Authorization", token);
    const util::HttpResponse r = exchange(req, 3);
    if (!r.transport_error.empty() || r.status != 200) {
      throw Error(kCredentialsComponent, fmt::format("{}: {}", what, describe(r)));
    }
    return from_json(r.body, what, "Token");
  });
}

// IMDSv2 (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-retrieval.html): a session token
// from PUT /latest/api/token, then the role's name and its credentials. IMDSv1 only when the token request is
// refused as unknown (403/404/405), as the SDKs do.
std::shared_ptr<CredentialProvider> instance_metadata_provider(const std::string& endpoint) {
  const std::string what = fmt::format("the EC2 instance metadata service at {}", endpoint);
  long timeout_s = 1;  // NOLINT(google-runtime-int): libcurl's type
  int attempts = 1;
  if (!env("AWS_METADATA_SERVICE_TIMEOUT").empty()) timeout_s = std::stol(env("AWS_METADATA_SERVICE_TIMEOUT"));
  if (!env("AWS_METADATA_SERVICE_NUM_ATTEMPTS").empty()) attempts = std::stoi(env("AWS_METADATA_SERVICE_NUM_ATTEMPTS"));
  return std::make_shared<RefreshingProvider>(what, [=] {
    auto call = [&](const std::string& method, const std::string& path,
                    std::vector<std::pair<std::string, std::string>> headers) {
      util::HttpRequest req;
      req.method = method;
      req.url = endpoint + path;
      req.headers = std::move(headers);
      req.connect_timeout_s = timeout_s;
      req.timeout_s = timeout_s + 1;
      return exchange(req, attempts);
    };
    const util::HttpResponse token =
        call("PUT", "/latest/api/token", {{"X-aws-ec2-metadata-token-ttl-seconds", "21600"}});
    std::vector<std::pair<std::string, std::string>> auth;
    if (token.transport_error.empty() && token.status == 200) {
      auth.emplace_back("X-aws-ec2-metadata-token", token.body);
    } else if (!(token.transport_error.empty() &&
                 (token.status == 403 || token.status == 404 || token.status == 405))) {
      throw Error(kCredentialsComponent, fmt::format("{}: session token: {}", what, describe(token)));
    }
    const std::string base = "/latest/meta-data/iam/security-credentials/";
    const util::HttpResponse role = call("GET", base, auth);
    if (!role.transport_error.empty() || role.status != 200 || role.body.empty()) {
      throw Error(kCredentialsComponent, fmt::format("{}: no instance profile role ({})", what, describe(role)));
    }
    const std::string name = role.body.substr(0, role.body.find('\n'));
    const util::HttpResponse creds = call("GET", base + name, auth);
    if (!creds.transport_error.empty() || creds.status != 200) {
      throw Error(kCredentialsComponent, fmt::format("{}: role {}: {}", what, name, describe(creds)));
    }
    return from_json(creds.body, fmt::format("{} (role {})", what, name), "Token");
  });
}

// ---- credential_process

S3Credentials run_credential_process(const std::string& command, const std::string& what) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) throw Error(kCredentialsComponent, fmt::format("{}: cannot start it", what));
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  const int status = pclose(pipe);
  if (status != 0) {
    throw Error(kCredentialsComponent,
                fmt::format("{}: exited with status {}", what, WIFEXITED(status) ? WEXITSTATUS(status) : status));
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(out);
  } catch (const nlohmann::json::exception&) {
    throw Error(kCredentialsComponent, fmt::format("{}: its output is not JSON", what));
  }
  if (!j.is_object() || !j.contains("Version") || j.at("Version") != 1) {
    throw Error(kCredentialsComponent, fmt::format("{}: its output must be a JSON object with \"Version\": 1", what));
  }
  return from_json(out, what, "SessionToken");
}

// ---- profiles

constexpr int kMaxRoleChain = 8;

std::shared_ptr<CredentialProvider> env_provider() {
  const std::string id = env("AWS_ACCESS_KEY_ID"), secret = env("AWS_SECRET_ACCESS_KEY");
  if (id.empty() || secret.empty()) return nullptr;
  S3Credentials c{id, secret, env("AWS_SESSION_TOKEN"), "environment", std::nullopt};
  return std::make_shared<FixedProvider>(std::move(c));
}

std::shared_ptr<CredentialProvider> instance_metadata_from_environment() {
  std::string endpoint = env("AWS_EC2_METADATA_SERVICE_ENDPOINT");
  if (endpoint.empty()) endpoint = "http://169.254.169.254";
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  return instance_metadata_provider(endpoint);
}

// The credentials a named profile gives, botocore's order within a profile: role_arn (with source_profile or
// credential_source), web_identity_token_file, static keys in the credentials file, credential_process, static keys
// in the config file. Null when the profile holds none of these.
std::shared_ptr<CredentialProvider> profile_provider(const std::string& name, int depth) {
  if (depth > kMaxRoleChain) {
    throw ConfigError(
        kCredentialsComponent,
        fmt::format("profile [{}]: role chain longer than {} (a source_profile loop?)", name, kMaxRoleChain));
  }
  const std::string credentials_file = aws::credentials_file(), config_file = aws::config_file();
  const auto keys = aws::ini_section(credentials_file, name);
  const auto cfg = aws::config_profile(name);
  auto merged = cfg;
  for (const auto& [k, v] : keys) merged[k] = v;
  const std::string where = fmt::format("profile [{}] ({} / {})", name, credentials_file, config_file);

  if (merged.count("role_arn")) {
    const std::string role_arn = merged.at("role_arn");
    if (merged.count("mfa_serial")) {
      throw ConfigError(kCredentialsComponent,
                        fmt::format("{}: mfa_serial needs an MFA code typed in; Tessera runs unattended", where));
    }
    if (merged.count("web_identity_token_file") && !merged.count("source_profile")) {
      return web_identity(merged.at("web_identity_token_file"), role_arn, session_name(merged, nullptr),
                          sts_endpoint(cfg), fmt::format("{}: web identity for {}", where, role_arn));
    }
    std::shared_ptr<CredentialProvider> source;
    if (merged.count("source_profile")) {
      const std::string from = merged.at("source_profile");
      // A profile that names itself as source uses its own static keys (the SDKs allow this).
      if (from == name && keys.count("aws_access_key_id") && keys.count("aws_secret_access_key")) {
        source = std::make_shared<FixedProvider>(
            S3Credentials{keys.at("aws_access_key_id"), keys.at("aws_secret_access_key"),
                          keys.count("aws_session_token") ? keys.at("aws_session_token") : "",
                          fmt::format("{} [{}]", credentials_file, name), std::nullopt});
      } else {
        source = profile_provider(from, depth + 1);
      }
      if (!source) {
        throw ConfigError(kCredentialsComponent,
                          fmt::format("{}: source_profile [{}] holds no credentials", where, from));
      }
    } else if (merged.count("credential_source")) {
      const std::string cs = merged.at("credential_source");
      if (cs == "Environment") {
        source = env_provider();
      } else if (cs == "EcsContainer") {
        source = container_provider();
      } else if (cs == "Ec2InstanceMetadata") {
        source = instance_metadata_from_environment();
      } else {
        throw ConfigError(kCredentialsComponent,
                          fmt::format("{}: credential_source {}: expected Environment, Ec2InstanceMetadata or "
                                      "EcsContainer",
                                      where, cs));
      }
      if (!source) {
        throw ConfigError(kCredentialsComponent,
                          fmt::format("{}: credential_source Environment but AWS_ACCESS_KEY_ID and "
                                      "AWS_SECRET_ACCESS_KEY are not set",
                                      where));
      }
    } else {
      throw ConfigError(kCredentialsComponent, fmt::format("{}: role_arn needs source_profile, credential_source or "
                                                           "web_identity_token_file",
                                                           where));
    }
    std::vector<std::pair<std::string, std::string>> params = {{"RoleArn", role_arn},
                                                               {"RoleSessionName", session_name(merged, nullptr)}};
    if (merged.count("external_id")) params.emplace_back("ExternalId", merged.at("external_id"));
    if (merged.count("duration_seconds")) params.emplace_back("DurationSeconds", merged.at("duration_seconds"));
    const std::string endpoint = sts_endpoint(cfg);
    const std::string what = fmt::format("{}: role {} from {}", where, role_arn, source->source());
    return std::make_shared<RefreshingProvider>(what, [=] {
      const S3Credentials signer = source->get();
      return sts(endpoint, "AssumeRole", params, &signer, what);
    });
  }
  if (keys.count("aws_access_key_id") && keys.count("aws_secret_access_key")) {
    return std::make_shared<FixedProvider>(
        S3Credentials{keys.at("aws_access_key_id"), keys.at("aws_secret_access_key"),
                      keys.count("aws_session_token") ? keys.at("aws_session_token") : "",
                      fmt::format("{} [{}]", credentials_file, name), std::nullopt});
  }
  if (merged.count("credential_process")) {
    const std::string command = merged.at("credential_process");
    const std::string what = fmt::format("{}: credential_process", where);
    return std::make_shared<RefreshingProvider>(what, [=] { return run_credential_process(command, what); });
  }
  if (cfg.count("aws_access_key_id") && cfg.count("aws_secret_access_key")) {
    const std::string section = name == "default" ? name : "profile " + name;
    return std::make_shared<FixedProvider>(
        S3Credentials{cfg.at("aws_access_key_id"), cfg.at("aws_secret_access_key"),
                      cfg.count("aws_session_token") ? cfg.at("aws_session_token") : "",
                      fmt::format("{} [{}]", config_file, section), std::nullopt});
  }
  return nullptr;
}

bool truthy(const std::string& v) {
  std::string l;
  for (const char ch : v) l += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return l == "true" || l == "1";
}

}  // namespace
}  // namespace credential_chain

using namespace credential_chain;  // NOLINT(google-build-using-namespace): this file's own helpers

std::shared_ptr<CredentialProvider> fixed_credentials(S3Credentials credentials) {
  return std::make_shared<FixedProvider>(std::move(credentials));
}

std::shared_ptr<CredentialProvider> refreshing_credentials(std::string source, std::function<S3Credentials()> fetch) {
  return std::make_shared<RefreshingProvider>(std::move(source), std::move(fetch));
}

std::shared_ptr<CredentialProvider> default_credential_provider() {
  ++g_credential_loads;
  if (auto p = env_provider()) return p;
  const std::string name = aws::profile_name();
  const auto cfg = aws::config_profile(name);
  // A profile's role comes before the environment's web identity (botocore's order).
  const bool profile_role =
      cfg.count("role_arn") > 0 || aws::ini_section(aws::credentials_file(), name).count("role_arn") > 0;
  if (!profile_role && !env("AWS_WEB_IDENTITY_TOKEN_FILE").empty() && !env("AWS_ROLE_ARN").empty()) {
    const std::string role_arn = env("AWS_ROLE_ARN");
    return web_identity(env("AWS_WEB_IDENTITY_TOKEN_FILE"), role_arn, session_name(cfg, "AWS_ROLE_SESSION_NAME"),
                        sts_endpoint(cfg), fmt::format("web identity (AWS_WEB_IDENTITY_TOKEN_FILE) for {}", role_arn));
  }
  if (auto p = profile_provider(name, 0)) return p;
  if (!env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").empty() || !env("AWS_CONTAINER_CREDENTIALS_FULL_URI").empty()) {
    return container_provider();
  }
  std::string imds_note = "the EC2 instance metadata service is off (AWS_EC2_METADATA_DISABLED)";
  if (!truthy(env("AWS_EC2_METADATA_DISABLED"))) {
    auto imds = instance_metadata_from_environment();
    try {
      imds->get();  // the last link answers only on EC2: try it now, so that elsewhere the error below says so
      return imds;
    } catch (const Error& e) {
      imds_note = e.message();
    }
  }
  throw ConfigError(kCredentialsComponent,
                    fmt::format("no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
                                "profile [{}] in {} or {} (AWS_PROFILE picks the profile), or "
                                "AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN, or a container credentials endpoint; "
                                "and {}",
                                name, aws::credentials_file(), aws::config_file(), imds_note));
}

S3Credentials load_credentials() {
  return default_credential_provider()->get();
}

int64_t credential_loads() {
  return g_credential_loads.load();
}

}  // namespace tessera::storage
