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

// Worth retrying by its status alone, whatever the body: 429, and every 5xx but 501 Not Implemented (a feature the
// server lacks, as permanent as a 4xx). An overloaded server, or a proxy in front of it, answers with any body.
bool retryable_status(long status);  // NOLINT(google-runtime-int)

// The pause before retry `attempt` (1, 2, ...): uniform(0, min(max_s, base_s * 2^(attempt - 1))), "full jitter".
void backoff_sleep(int attempt, double base_s, double max_s);

}  // namespace tessera::storage
