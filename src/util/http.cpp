// One synchronous HTTP exchange over libcurl (tessera/util/http.h).
#include "tessera/util/http.h"

#include <curl/curl.h>
#include <fmt/format.h>

namespace tessera::util {
namespace {

size_t append_body(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
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
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, append_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &r.body);
  if (request.method == "POST" || request.method == "PUT") {
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, request.body.c_str());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
    if (request.method == "PUT") curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "PUT");
  } else if (request.method != "GET") {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  }
  const CURLcode rc = curl_easy_perform(h);
  if (rc != CURLE_OK) {
    r.transport_error = curl_easy_strerror(rc);
  } else {
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.status);
  }
  curl_slist_free_all(headers);
  curl_easy_cleanup(h);
  return r;
}

std::string url_encode(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
        c == '.' || c == '~') {
      out += ch;
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

}  // namespace tessera::util
