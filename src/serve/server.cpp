// The HTTP side of `tessera serve` (server.h): cpp-httplib routes onto the engine.
#include "tessera/serve/server.h"

#include <fmt/format.h>
#include <httplib.h>
#include <openssl/crypto.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "tessera/util/error.h"

namespace tessera::serve {
namespace {

using Clock = std::chrono::steady_clock;
using Ordered = nlohmann::ordered_json;

std::string dump(const Ordered& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status();
  res.set_content(dump(e.body()), "application/json");
}

// The text of a streamed choice that is safe to send: without a trailing partial UTF-8 character (decoded as U+FFFD)
// and without a tail that could still become a stop string.
size_t sendable(const std::string& text, const std::vector<std::string>& stops) {
  size_t end = text.size();
  static const std::string kReplacement = "\xEF\xBF\xBD";
  if (end >= kReplacement.size() && text.compare(end - kReplacement.size(), kReplacement.size(), kReplacement) == 0) {
    end -= kReplacement.size();
  }
  for (const std::string& s : stops) {
    for (size_t k = std::min(s.size() - 1, end); k > 0; --k) {
      if (text.compare(end - k, k, s, 0, k) == 0) {
        end -= k;
        break;
      }
    }
  }
  return end;
}

}  // namespace

struct Server::Impl {
  // Tokens of a streamed request as the engine makes them. A member, not in the anonymous namespace: the stream's
  // lambdas capture it, and a unity build (README's command (a)) treats this file as a header, where GCC refuses a
  // type of external linkage holding one of internal linkage (-Wsubobject-linkage).
  struct StreamState {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<int64_t> tokens;
  };

  ServerOptions options;
  std::shared_ptr<Engine> engine;
  ServedModel model;
  httplib::Server http;
  int port = 0;
  std::mutex run_mu;
  bool stopped = false;               // guarded by run_mu
  bool started = false;               // run() began; guarded by run_mu
  std::atomic<bool> returned{false};  // run()'s listen ended
  std::atomic<int64_t> next_id{0};

  bool authorized(const httplib::Request& req) const {
    if (options.api_key.empty()) return true;
    const std::string expected = "Bearer " + options.api_key;
    const std::string got = req.get_header_value("Authorization");
    return got.size() == expected.size() && CRYPTO_memcmp(got.data(), expected.data(), got.size()) == 0;
  }

  std::string new_id(bool chat) { return fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", next_id.fetch_add(1)); }

  // Submits every choice of `call`; on a refusal, cancels those already submitted.
  std::vector<std::future<Result>> submit(ApiCall& call, const std::shared_ptr<std::atomic<bool>>& cancelled) {
    std::vector<std::future<Result>> futures;
    try {
      for (Request& r : call.requests) {
        Request copy = r;
        copy.cancelled = cancelled;
        futures.push_back(engine->submit(std::move(copy)));
      }
    } catch (const Busy& e) {
      cancelled->store(true);
      throw ApiError(503, e.message(), "", "server_busy");
    } catch (const ConfigError& e) {
      cancelled->store(true);
      throw ApiError(400, e.message());
    }
    return futures;
  }

  void complete(const httplib::Request& req, httplib::Response& res, bool chat) {
    const auto started = Clock::now();
    nlohmann::json body;
    try {
      body = nlohmann::json::parse(req.body);
    } catch (const nlohmann::json::parse_error& e) {
      throw ApiError(400, fmt::format("the body is not valid JSON: {}", e.what()));
    }
    ApiCall call = chat ? parse_chat(body, model) : parse_completions(body, model);
    const std::string id = new_id(chat);
    const int64_t created =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    auto cancelled = std::make_shared<std::atomic<bool>>(false);
    if (call.stream) {
      stream(call, res, id, created, cancelled);
      return;
    }
    std::vector<std::future<Result>> futures = submit(call, cancelled);
    const auto deadline =
        started + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.request_timeout_s));
    std::vector<Result> results;
    for (auto& f : futures) {
      if (f.wait_until(deadline) != std::future_status::ready) {
        cancelled->store(true);
        throw ApiError(504, fmt::format("the request took longer than {} s", options.request_timeout_s), "", "timeout");
      }
      try {
        results.push_back(f.get());
      } catch (const Error& e) {
        throw ApiError(500, e.message(), "", "server_error");
      }
    }
    res.set_content(dump(completion_response(call, results, model, id, created)), "application/json");
    int64_t generated = 0;
    for (const Result& r : results) generated += static_cast<int64_t>(r.tokens.size());
    spdlog::debug("serve: {} {} choices, {} tokens generated in {:.3f} s", req.path, results.size(), generated,
                  std::chrono::duration<double>(Clock::now() - started).count());
  }

  // Server-sent events: a chunk per piece of new text, the finish reason last, then [DONE].
  void stream(ApiCall& call, httplib::Response& res, const std::string& id, int64_t created,
              const std::shared_ptr<std::atomic<bool>>& cancelled) {
    auto state = std::make_shared<StreamState>();
    call.requests[0].on_token = [state](int64_t token) {
      {
        const std::lock_guard<std::mutex> lock(state->mu);
        state->tokens.push_back(token);
      }
      state->cv.notify_all();
    };
    auto future = std::make_shared<std::future<Result>>(std::move(submit(call, cancelled).at(0)));
    auto shared_call = std::make_shared<ApiCall>(std::move(call));
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(options.request_timeout_s));
    auto sent = std::make_shared<size_t>(0);  // bytes of the text sent
    auto first = std::make_shared<bool>(true);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider("text/event-stream", [this, state, future, shared_call, cancelled, id, created,
                                                           deadline, sent, first](size_t, httplib::DataSink& sink) {
      const ApiCall& c = *shared_call;
      auto send = [&](const Ordered& chunk) {
        const std::string line = "data: " + dump(chunk) + "\n\n";
        return sink.write(line.data(), line.size());
      };
      if (*first && c.chat) {  // OpenAI's first chat chunk names the role
        *first = false;
        Ordered role = stream_chunk(c, 0, "", std::nullopt, model, id, created);
        role["choices"][0]["delta"] = {{"role", "assistant"}, {"content", ""}};
        if (!send(role)) {
          cancelled->store(true);
          return false;
        }
      }
      std::vector<int64_t> tokens;
      {
        std::unique_lock<std::mutex> lock(state->mu);
        state->cv.wait_for(lock, std::chrono::milliseconds(50));
        tokens = state->tokens;
      }
      const bool done = future->wait_for(std::chrono::seconds(0)) == std::future_status::ready;
      if (!done && Clock::now() > deadline) {
        cancelled->store(true);
        return false;
      }
      Result partial;
      std::optional<std::string> finish;
      if (done) {
        try {
          partial = future->get();
        } catch (const std::exception& e) {
          spdlog::warn("serve: a streamed request failed: {}", e.what());
          return false;
        }
      } else {
        partial.tokens = std::move(tokens);
      }
      const ChoiceText text = choice_text(c, partial, model.tokenizer->tokenizer());
      const size_t end = done ? text.text.size() : sendable(text.text, c.stop);
      if (end > *sent) {
        if (!send(stream_chunk(c, 0, text.text.substr(*sent, end - *sent), std::nullopt, model, id, created))) {
          cancelled->store(true);
          return false;
        }
        *sent = end;
      }
      if (done) {
        finish = text.finish_reason;
        send(stream_chunk(c, 0, "", finish, model, id, created));
        const std::string last = "data: [DONE]\n\n";
        sink.write(last.data(), last.size());
        sink.done();
      }
      return true;
    });
  }

  void install() {
    http.new_task_queue = [n = options.threads] { return new httplib::ThreadPool(static_cast<size_t>(n)); };
    http.set_payload_max_length(options.max_body_bytes);
    http.set_read_timeout(30);
    http.set_write_timeout(30);
    http.set_keep_alive_timeout(30);
    http.set_keep_alive_max_count(1000);
    auto guard = [this](bool chat) {
      return [this, chat](const httplib::Request& req, httplib::Response& res) {
        try {
          if (!authorized(req))
            throw ApiError(401, "a valid API key is required (Authorization: Bearer ...)", "", "authentication_error");
          complete(req, res, chat);
        } catch (const ApiError& e) {
          send_error(res, e);
        }
      };
    };
    http.Post("/v1/completions", guard(false));
    http.Post("/v1/chat/completions", guard(true));
    http.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req)) {
        send_error(
            res, ApiError(401, "a valid API key is required (Authorization: Bearer ...)", "", "authentication_error"));
        return;
      }
      res.set_content(dump(models_response(model)), "application/json");
    });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      const EngineStats s = engine->stats();
      res.set_content(dump(Ordered{{"status", "ok"},
                                   {"running", s.running},
                                   {"waiting", s.waiting},
                                   {"requests", s.requests},
                                   {"generated_tokens", s.generated},
                                   {"prefills", s.prefills},
                                   {"decoding_steps", s.steps}}),
                      "application/json");
    });
    // Statuses httplib sets itself (404 no route, 413 body too large, 400 unreadable request) get a JSON body too.
    http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      std::string message;
      switch (res.status) {
        case 404:
          message = fmt::format(
              "no route {} {} (this server has POST /v1/completions, POST /v1/chat/completions, "
              "GET /v1/models and GET /health)",
              req.method, req.path);
          break;
        case 413:
          message = fmt::format("the request body is larger than {} bytes", options.max_body_bytes);
          break;
        default:
          message = fmt::format("HTTP {}", res.status);
      }
      send_error(res, ApiError(res.status, message));
    });
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      spdlog::error("serve: {}", what);
      send_error(res, ApiError(500, what, "", "server_error"));
    });
  }
};

Server::Server(ServerOptions options, std::shared_ptr<Engine> engine, ServedModel model)
    : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  impl_->engine = std::move(engine);
  impl_->model = std::move(model);
  if (!impl_->engine) throw ConfigError("serve", "no engine");
  if (impl_->options.threads < 1) throw ConfigError("serve", "threads must be at least 1");
  impl_->install();
  const ServerOptions& o = impl_->options;
  if (o.port == 0) {
    impl_->port = impl_->http.bind_to_any_port(o.host);
  } else {
    impl_->port = impl_->http.bind_to_port(o.host, o.port) ? o.port : -1;
  }
  if (impl_->port <= 0) {
    throw Error("serve",
                fmt::format("cannot listen on {}:{} (in use, or not an address of this machine)", o.host, o.port));
  }
}

Server::~Server() {
  stop();
}

int Server::port() const {
  return impl_->port;
}

void Server::run() {
  {
    const std::lock_guard<std::mutex> lock(impl_->run_mu);
    if (impl_->stopped) return;
    impl_->started = true;
  }
  impl_->http.listen_after_bind();
  impl_->returned = true;
}

void Server::stop() {
  {
    const std::lock_guard<std::mutex> lock(impl_->run_mu);
    impl_->stopped = true;
    if (!impl_->started) return;
  }
  // run() has begun: once httplib listens, stopping it ends run().
  while (!impl_->http.is_running() && !impl_->returned) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  impl_->http.stop();
}

}  // namespace tessera::serve
