// One synchronous HTTP exchange over libcurl (tessera/util/http.h).
#include "tessera/util/http.h"

#include <curl/curl.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <memory>
#include <random>
#include <thread>

#include "tessera/util/error.h"

namespace tessera::util {
namespace {

struct Exchange {
  HttpResponse* response;
  const std::function<void(std::string_view)>* sink;
  std::exception_ptr error;
  CURL* handle = nullptr;
};

size_t take_body(char* data, size_t size, size_t n, void* out) {
  auto* x = static_cast<Exchange*>(out);
  long status = 0;  // NOLINT(google-runtime-int): libcurl's type
  curl_easy_getinfo(x->handle, CURLINFO_RESPONSE_CODE, &status);
  if (*x->sink == nullptr || status < 200 || status >= 300) {  // an error's body stays for the message
    x->response->body.append(data, size * n);
    return size * n;
  }
  try {
    (*x->sink)(std::string_view(data, size * n));
  } catch (...) {
    x->error = std::current_exception();
    return 0;  // libcurl ends the transfer
  }
  return size * n;
}

size_t take_header(char* data, size_t size, size_t n, void* out) {
  auto& headers = static_cast<Exchange*>(out)->response->headers;
  std::string_view line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) headers.clear();  // a new response (after a redirect or a 100 Continue)
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos) return size * n;
  std::string name(line.substr(0, colon));
  for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  std::string_view value = line.substr(colon + 1);
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  while (!value.empty() && (value.back() == '\r' || value.back() == '\n' || value.back() == ' '))
    value.remove_suffix(1);
  headers.emplace_back(std::move(name), std::string(value));
  return size * n;
}

bool curl_ready() {
  static const bool initialised = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
  return initialised;
}

}  // namespace

HttpResponse http_request(const HttpRequest& request) {
  HttpResponse r;
  CURL* h = curl_ready() ? curl_easy_init() : nullptr;
  if (h == nullptr) {
    r.transport_error = "libcurl could not be initialised";
    return r;
  }
  curl_slist* headers = curl_slist_append(nullptr, "Expect:");
  for (const auto& [k, v] : request.headers) headers = curl_slist_append(headers, fmt::format("{}: {}", k, v).c_str());
  if (!request.basic_user.empty()) {
    curl_easy_setopt(h, CURLOPT_HTTPAUTH, CURLAUTH_BASIC);
    curl_easy_setopt(h, CURLOPT_USERNAME, request.basic_user.c_str());
    curl_easy_setopt(h, CURLOPT_PASSWORD, request.basic_password.c_str());
  }
  curl_easy_setopt(h, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, request.connect_timeout_s);
  curl_easy_setopt(h, CURLOPT_TIMEOUT, request.timeout_s);
  Exchange x{&r, &request.sink, nullptr, h};
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, take_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &x);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, take_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &x);
  if (request.stall_timeout_s > 0) {
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, request.stall_timeout_s);
  }
  if (request.follow_redirects) {
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(h, CURLOPT_MAXREDIRS, 10L);
  }
  if (request.method == "POST" || request.method == "PUT") {
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, request.body.c_str());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
    if (request.method == "PUT") curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "PUT");
  } else if (request.method == "HEAD") {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (request.method != "GET") {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  }
  const CURLcode rc = curl_easy_perform(h);
  if (rc != CURLE_OK) {
    r.transport_error = curl_easy_strerror(rc);
    r.interrupted = rc == CURLE_OPERATION_TIMEDOUT || rc == CURLE_SEND_ERROR || rc == CURLE_RECV_ERROR ||
                    rc == CURLE_GOT_NOTHING || rc == CURLE_PARTIAL_FILE || rc == CURLE_HTTP2 ||
                    rc == CURLE_HTTP2_STREAM;
  } else {
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.status);
  }
  curl_slist_free_all(headers);
  curl_easy_cleanup(h);
  if (x.error) std::rethrow_exception(x.error);
  return r;
}

std::string HttpResponse::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k == name) return v;
  }
  return "";
}

std::optional<UrlParts> parse_url(const std::string& url) {
  const std::unique_ptr<CURLU, decltype(&curl_url_cleanup)> u(curl_url(), curl_url_cleanup);
  if (!u || curl_url_set(u.get(), CURLUPART_URL, url.c_str(), 0) != CURLUE_OK) return std::nullopt;
  const auto part = [&](CURLUPart which) -> std::optional<std::string> {
    char* raw = nullptr;
    if (curl_url_get(u.get(), which, &raw, 0) != CURLUE_OK || raw == nullptr) return std::nullopt;
    std::string out = raw;
    curl_free(raw);
    return out;
  };
  const auto scheme = part(CURLUPART_SCHEME);
  const auto host = part(CURLUPART_HOST);
  if (!scheme || !host || host->empty()) return std::nullopt;
  UrlParts p;
  p.scheme = *scheme;
  p.authority = *host;
  if (const auto port = part(CURLUPART_PORT)) p.authority += ":" + *port;
  p.host = host->size() > 2 && host->front() == '[' && host->back() == ']' ? host->substr(1, host->size() - 2) : *host;
  p.path = part(CURLUPART_PATH).value_or("/");
  return p;
}

std::string url_encode(std::string_view text, bool keep_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
        c == '.' || c == '~' || (keep_slash && c == '/')) {
      out += ch;
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

bool retryable_status(long status) {  // NOLINT(google-runtime-int)
  return status == 429 || (status >= 500 && status <= 599 && status != 501);
}

void backoff_sleep(int attempt, double base_s, double max_s) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  const double cap = std::min(max_s, base_s * std::pow(2.0, attempt - 1));
  std::this_thread::sleep_for(std::chrono::duration<double>(std::uniform_real_distribution<double>(0, cap)(rng)));
}

int env_int(const char* name, int fallback, int lo, int hi, const char* component) {
  const char* raw = std::getenv(name);
  if (raw == nullptr || *raw == '\0') return fallback;
  const std::string_view v(raw);
  int n = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc() || end != v.data() + v.size() || n < lo || n > hi) {
    throw ConfigError(component, fmt::format("{}={}: not a whole number from {} to {}", name, v, lo, hi));
  }
  return n;
}

}  // namespace tessera::util
