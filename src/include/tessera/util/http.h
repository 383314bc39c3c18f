// One synchronous HTTP exchange over libcurl, for the small JSON/XML APIs Tessera talks to besides S3's data path:
// MLflow's REST API, STS, the EC2 and container credential endpoints. Internal (src/include).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::util {

struct HttpRequest {
  std::string method = "GET";  // GET, POST, PUT, DELETE
  std::string url;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;        // sent for POST and PUT
  std::string basic_user;  // HTTP basic authentication when not empty
  std::string basic_password;
  long connect_timeout_s = 10;  // NOLINT(google-runtime-int): libcurl's type
  long timeout_s = 60;          // NOLINT(google-runtime-int): the whole exchange
};

struct HttpResponse {
  long status = 0;  // NOLINT(google-runtime-int): libcurl's type; 0 when no response came back
  std::string body;
  std::string transport_error;  // libcurl's reason when no HTTP response came back
};

HttpResponse http_request(const HttpRequest& request);

// RFC 3986 percent-encoding of a query or form value (unreserved characters kept).
std::string url_encode(std::string_view text);

}  // namespace tessera::util
