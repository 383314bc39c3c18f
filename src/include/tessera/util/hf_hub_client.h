// Requests to the Hugging Face Hub as huggingface_hub sends them: the endpoint HF_ENDPOINT names (default
// https://huggingface.co), the token HF_TOKEN (or HUGGING_FACE_HUB_TOKEN, or the file `huggingface-cli login` saved:
// HF_TOKEN_PATH, else HF_HOME/token, else ~/.cache/huggingface/token) as a bearer token. Used by the model download
// (hf_hub.cpp) and the storage layer's hf:// backend. Internal (src/include).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessera/util/http.h"

namespace tessera::util {

// True when HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set to 1/on/yes/true (huggingface_hub's reading).
bool hf_hub_offline();

// How often one request to the Hub is tried (TESSERA_HF_MAX_ATTEMPTS, default 5), and how long a request may move
// less than 1 KiB/s before it is given up (TESSERA_HF_STALL_TIMEOUT_S, default 120 for writes, 60 for reads).
int hub_max_attempts();
int hub_stall_timeout_s(int fallback);

class HubClient {
 public:
  // `repo` ("org/name", or "datasets/org/name") names the repository in error messages.
  explicit HubClient(std::string repo);

  // `method` (GET, HEAD) of `path` (starting with '/') under the endpoint, the body to `sink` when set. Tried again
  // with backoff (up to hub_max_attempts()) on 429/5xx and on an interrupted transfer (a reset, a cut or stalled
  // answer) while nothing has reached `sink` yet; a Hub that cannot be reached at all (offline) fails at once. Returns
  // the last answer whatever its status; throws tessera::Error (component "hf_hub") only when none came back.
  HttpResponse send(const std::string& method, const std::string& path,
                    const std::function<void(std::string_view)>& sink, bool follow_redirects,
                    const std::vector<std::pair<std::string, std::string>>& headers = {}) const;
  // `method` (POST) of `body` to `path` under the endpoint (a JSON or NDJSON document of the upload API). Returns the
  // answer whatever its status; throws as send() when none came back.
  // `stall_timeout_s`: give up when less than 1 KiB/s moves for that long (the Hub answers a commit only when done).
  HttpResponse send_body(const std::string& method, const std::string& path, std::string body,
                         const std::vector<std::pair<std::string, std::string>>& headers,
                         long stall_timeout_s) const;  // NOLINT(google-runtime-int): libcurl's type
  // send(), throwing for anything but 2xx (and 3xx when redirects are not followed), naming the repository, the URL
  // and whether a token was sent (never the token).
  HttpResponse call(const std::string& method, const std::string& path,
                    const std::function<void(std::string_view)>& sink, bool follow_redirects,
                    const std::vector<std::pair<std::string, std::string>>& headers = {}) const;
  [[noreturn]] void fail(const std::string& method, const std::string& path, const HttpResponse& r) const;

  const std::string& endpoint() const { return endpoint_; }
  bool has_token() const { return !token_.empty(); }
  // The Authorization header the token gives (none without a token), for a URL of the endpoint's own host that an
  // answer named (an LFS verify URL).
  std::vector<std::pair<std::string, std::string>> authorization() const;

 private:
  HttpResponse exchange(HttpRequest req) const;
  HttpResponse attempt(HttpRequest req) const;  // exchange() without the throw: status 0 comes back
  [[noreturn]] void unreachable(const HttpResponse& r) const;

  std::string repo_, endpoint_, token_;
};

}  // namespace tessera::util
