// The transport under the object stores' own clients (S3, Azure Blob): pooled libcurl handles that keep their
// connections open between requests, request bodies sent from the caller's memory (rewound when libcurl resends),
// and response bodies handed to a sink at their offset as they arrive. One exchange per call: signing, retries and
// error messages are the client's.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessera/util/http.h"

namespace tessera::storage {

// Receives a 2xx response's body as it arrives: (offset within the body, bytes). A retried request starts again at
// offset 0, so a sink that writes at the offset needs no reset.
using BodySink = std::function<void(uint64_t offset, std::string_view bytes)>;

struct Exchange {
  std::string method;  // GET, HEAD, PUT, POST, DELETE
  std::string url;
  std::vector<std::pair<std::string, std::string>> headers;  // sent as given ("Expect:" is suppressed)
  std::string_view payload;                                  // PUT and POST bodies
  std::vector<std::string_view> payload_parts;  // a PUT body in several buffers, sent in order (instead of payload)
  const BodySink* sink = nullptr;               // when set, a 2xx body goes here instead of into the response
  long connect_timeout_s = 10;                  // NOLINT(google-runtime-int): libcurl's type
  long stall_timeout_s = 30;                    // NOLINT(google-runtime-int): abort below 1 KiB/s for this long
};

class HttpPool {
 public:
  HttpPool();
  ~HttpPool();
  HttpPool(const HttpPool&) = delete;
  HttpPool& operator=(const HttpPool&) = delete;
  // Sends `x` once. A transport failure gives status 0 with libcurl's reason in transport_error, and sets
  // `*retryable` when trying again may help (a refused, reset or stalled connection). What the sink throws is
  // rethrown.
  util::HttpResponse perform(const Exchange& x, bool* retryable);

 private:
  struct Idle;
  std::unique_ptr<Idle> idle_;
};

// The retry rules every client shares (util/http.h).
using util::backoff_sleep;
using util::retryable_status;

}  // namespace tessera::storage
