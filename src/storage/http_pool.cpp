// HttpPool: pooled libcurl handles for the object stores' clients (http_pool.h).
#include "http_pool.h"

#include <curl/curl.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <exception>
#include <mutex>

#include "tessera/util/error.h"

namespace tessera::storage {
namespace {

struct Transfer {
  std::vector<std::string_view> upload;  // the PUT body, in order
  uint64_t upload_size = 0;
  size_t part = 0;  // where the next byte comes from: upload[part], at offset within it
  size_t part_offset = 0;
  util::HttpResponse* response = nullptr;
  CURL* handle = nullptr;
  const BodySink* sink = nullptr;
  uint64_t received = 0;
  std::exception_ptr sink_error;
};

size_t on_read(char* buf, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t done = 0;
  while (done < size * n && t->part < t->upload.size()) {
    const std::string_view part = t->upload[t->part];
    const size_t len = std::min(size * n - done, part.size() - t->part_offset);
    std::memcpy(buf + done, part.data() + t->part_offset, len);
    done += len;
    t->part_offset += len;
    if (t->part_offset == part.size()) {
      ++t->part;
      t->part_offset = 0;
    }
  }
  return done;
}

// libcurl rewinds the body when it resends a request on a fresh connection.
int on_seek(void* user, curl_off_t offset, int origin) {
  auto* t = static_cast<Transfer*>(user);
  if (origin != SEEK_SET || offset < 0 || static_cast<uint64_t>(offset) > t->upload_size) return CURL_SEEKFUNC_FAIL;
  auto left = static_cast<uint64_t>(offset);
  for (t->part = 0; t->part < t->upload.size() && left >= t->upload[t->part].size(); ++t->part) {
    left -= t->upload[t->part].size();
  }
  t->part_offset = static_cast<size_t>(left);
  return CURL_SEEKFUNC_OK;
}

size_t on_write(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t len = size * n;
  long status = 0;  // NOLINT(google-runtime-int)
  curl_easy_getinfo(t->handle, CURLINFO_RESPONSE_CODE, &status);
  if (t->sink != nullptr && *t->sink && status >= 200 && status < 300) {
    try {
      (*t->sink)(t->received, std::string_view(data, len));
    } catch (...) {
      t->sink_error = std::current_exception();
      return 0;  // aborts the transfer
    }
    t->received += len;
  } else {
    t->response->body.append(data, len);
  }
  return len;
}

size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::string_view line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) {
    t->response->headers.clear();  // a new response (after 100 Continue or a redirect)
    return size * n;
  }
  const size_t colon = line.find(':');
  if (colon != std::string_view::npos) {
    std::string name(line.substr(0, colon));
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    std::string value(line.substr(colon + 1));
    while (!value.empty() && std::isspace(static_cast<unsigned char>(value.back()))) value.pop_back();
    value.erase(0, value.find_first_not_of(" \t"));
    t->response->headers.emplace_back(std::move(name), std::move(value));
  }
  return size * n;
}

bool retryable_curl(CURLcode c) {
  switch (c) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

void init_curl_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

}  // namespace

// Idle easy handles; each keeps its connections open between requests (curl_easy_reset keeps the connection cache).
struct HttpPool::Idle {
  std::mutex mutex;
  std::vector<CURL*> handles;
  CURL* acquire() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!handles.empty()) {
        CURL* h = handles.back();
        handles.pop_back();
        curl_easy_reset(h);
        return h;
      }
    }
    CURL* h = curl_easy_init();
    if (!h) throw Error("http", "curl_easy_init failed");
    return h;
  }
  void release(CURL* h) {
    std::lock_guard<std::mutex> lock(mutex);
    handles.push_back(h);
  }
  ~Idle() {
    for (CURL* h : handles) curl_easy_cleanup(h);
  }
};

HttpPool::HttpPool() : idle_(std::make_unique<Idle>()) {
  init_curl_once();
}

HttpPool::~HttpPool() = default;

util::HttpResponse HttpPool::perform(const Exchange& x, bool* retryable) {
  *retryable = false;
  curl_slist* list = nullptr;
  for (const auto& [k, v] : x.headers) list = curl_slist_append(list, fmt::format("{}: {}", k, v).c_str());
  list = curl_slist_append(list, "Expect:");
  util::HttpResponse response;
  Transfer t;
  t.upload = x.payload_parts.empty() ? std::vector<std::string_view>{x.payload} : x.payload_parts;
  for (const std::string_view part : t.upload) t.upload_size += part.size();
  t.response = &response;
  t.sink = x.sink;
  CURL* h = idle_->acquire();
  t.handle = h;
  curl_easy_setopt(h, CURLOPT_URL, x.url.c_str());
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, x.connect_timeout_s);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, x.stall_timeout_s);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  // Bodies arrive in pieces of up to 512 KiB rather than libcurl's default 16 KiB: a download's sink writes each
  // piece to the page cache, and on loopback 16 KiB writes halved the rate (1.1 GB/s against 2.3 for 1 MiB writes).
  curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 512L << 10);
  curl_easy_setopt(h, CURLOPT_UPLOAD_BUFFERSIZE, 512L << 10);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &t);
  if (x.method == "HEAD") {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (x.method == "PUT") {
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
    curl_easy_setopt(h, CURLOPT_READDATA, &t);
    curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, on_seek);
    curl_easy_setopt(h, CURLOPT_SEEKDATA, &t);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(t.upload_size));
  } else if (x.method == "POST") {
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, x.payload.data());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(x.payload.size()));
  } else if (x.method != "GET") {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, x.method.c_str());
  }
  const CURLcode rc = curl_easy_perform(h);
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &response.status);
  curl_slist_free_all(list);
  if (rc != CURLE_OK) {
    // A broken handle may hold a broken connection: drop it rather than pool it.
    curl_easy_cleanup(h);
    if (t.sink_error) std::rethrow_exception(t.sink_error);
    response.status = 0;
    response.transport_error = curl_easy_strerror(rc);
    *retryable = retryable_curl(rc);
    return response;
  }
  idle_->release(h);
  return response;
}

}  // namespace tessera::storage
