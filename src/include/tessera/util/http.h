// One synchronous HTTP exchange over libcurl, for the small JSON/XML APIs Tessera talks to besides S3's data path:
// MLflow's REST API, STS, the EC2 and container credential endpoints, the Hugging Face Hub's downloads. Internal
// (src/include).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::util {

struct HttpRequest {
  std::string method = "GET";  // GET, HEAD, POST, PUT, DELETE
  std::string url;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;        // sent for POST and PUT
  std::string basic_user;  // HTTP basic authentication when not empty
  std::string basic_password;
  long connect_timeout_s = 10;  // NOLINT(google-runtime-int): libcurl's type
  long timeout_s = 60;          // NOLINT(google-runtime-int): the whole exchange; 0 for none
  long stall_timeout_s = 0;     // NOLINT(google-runtime-int): give up below 1 KiB/s for this long; 0 for never
  // Follow redirects (headers set above are not sent to another host; libcurl drops them).
  bool follow_redirects = false;
  // When set, a 2xx body goes here as it arrives instead of into HttpResponse::body (a large download; any other
  // status's body stays in HttpResponse::body, for the error message). An exception it throws ends the exchange and
  // is rethrown by http_request.
  std::function<void(std::string_view)> sink;
};

struct HttpResponse {
  long status = 0;  // NOLINT(google-runtime-int): libcurl's type; 0 when no response came back
  std::string body;
  std::string transport_error;  // libcurl's reason when no HTTP response came back
  // No response, after a connection was made (a reset, an answer cut short or stalled): trying again may help. A host
  // that does not resolve or refuses the connection (offline, a wrong endpoint) is not this.
  bool interrupted = false;
  std::vector<std::pair<std::string, std::string>> headers;  // the last response's, names in lower case
  // The value of header `name` (lower case), or "".
  std::string header(std::string_view name) const;
};

HttpResponse http_request(const HttpRequest& request);

// An absolute URL as libcurl, which makes the requests, reads it (its URL API): the lowercase scheme, the host (an IPv6
// address without its brackets), the authority a Host header carries (host[:port], IPv6 in brackets) and the path.
// User names, queries and fragments are parsed away. nullopt when `url` has no scheme or no host.
struct UrlParts {
  std::string scheme;
  std::string host;
  std::string authority;
  std::string path;
};
std::optional<UrlParts> parse_url(const std::string& url);

// RFC 3986 percent-encoding (unreserved characters kept, every other byte as %XX in upper case): a query or form
// value, or with `keep_slash` a path (as AWS Signature V4 wants both). The one encoder of the code base.
std::string url_encode(std::string_view text, bool keep_slash = false);

// An integer setting from the environment (a client's attempts, timeouts, parallelism): `fallback` when unset, else
// a whole number in [lo, hi] or a ConfigError naming the variable (tagged with `component`).
int env_int(const char* name, int fallback, int lo, int hi, const char* component);

// Worth retrying by its status alone, whatever the body: 429, and every 5xx but 501 Not Implemented (a feature the
// server lacks, as permanent as a 4xx). An overloaded server, or a proxy in front of it, answers with any body.
bool retryable_status(long status);  // NOLINT(google-runtime-int)

// The pause before retry `attempt` (1, 2, ...): uniform(0, min(max_s, base_s * 2^(attempt - 1))), "full jitter".
void backoff_sleep(int attempt, double base_s, double max_s);

}  // namespace tessera::util
