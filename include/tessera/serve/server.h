// `tessera serve`'s HTTP server: OpenAI's /v1/completions, /v1/chat/completions (both with server-sent-event
// streaming) and /v1/models, plus /health, over an Engine, on cpp-httplib (Debian's libcpp-httplib).
//
// Bound to 127.0.0.1 unless told otherwise. Every error is OpenAI's JSON error object with a 4xx/5xx status: 400 for
// a malformed body or field (openai.h), 401 without the API key when one is set, 404 for an unknown path or model,
// 413 for a body over max_body_bytes, 503 when the engine's queue is full, 504 when a request outlives
// request_timeout_s (its rows leave the batch), 500 when a forward failed. Requests are answered concurrently on
// `threads` connection threads; their rows share the engine's batch.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "tessera/serve/engine.h"
#include "tessera/serve/openai.h"

namespace tessera::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                          // 0: any free port (port() says which)
  size_t max_body_bytes = size_t{8} << 20;  // larger bodies get 413
  double request_timeout_s = 600;           // a request not answered by then gets 504
  int threads = 128;                        // connections served at once (more wait to be accepted)
  std::string api_key;                      // not empty: requests need "Authorization: Bearer <api_key>"
};

class Server {
 public:
  // Binds the port (throws Error naming host:port when it cannot); serves from run().
  Server(ServerOptions options, std::shared_ptr<Engine> engine, ServedModel model);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const;
  // Serves until stop() (from another thread or a signal watcher). Returns at once when stopped before.
  void run();
  // Thread-safe: stops accepting, ends run().
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::serve
