// Continuous batching of concurrent decoding requests over one model (what `tessera serve` runs on): requests from
// any thread join the running batch between decoding steps, and leave it as soon as they finish, instead of waiting
// for a whole batch to end.
//
// One scheduler thread owns the model. Each iteration it admits waiting requests (up to max_batch rows in all): their
// prompts run as one left-padded forward (the prefill), whose logits give the prompt's log-probabilities when asked
// and each row's first new token; their KV cache joins the running batch's (models::concat_cache_rows). Then one
// decoding step runs for every running row, and rows that stopped leave (models::select_cache_rows). Each row decodes
// as models::generate would decode its prompt alone: its own options (greedy or sampled with its own seed, penalty,
// stop sequences), so a greedy row's tokens are the same whatever else is in the batch, up to floating-point
// rounding in padded batches.
//
//   serve::Engine engine(model, {.max_batch = 32});
//   serve::Request r;
//   r.prompt = {1, 2, 3};
//   r.options.max_new_tokens = 16;
//   serve::Result out = engine.submit(std::move(r)).get();
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tessera/core/precision.h"
#include "tessera/models/causal_lm.h"
#include "tessera/models/generate.h"
#include "tessera/util/error.h"

namespace tessera::serve {

// A token and its log-probability under the model's distribution at its position (the raw logits: before the
// penalty, temperature and warpers), with the likeliest tokens there when asked.
struct TokenLogprob {
  int64_t token = 0;
  double logprob = 0;                           // NaN for a prompt's first token (nothing predicts it)
  std::vector<std::pair<int64_t, double>> top;  // the most likely tokens at this position, likeliest first
};

struct Request {
  std::vector<int64_t> prompt;        // at least one token, each in the model's vocabulary
  models::GenerationOptions options;  // max_new_tokens (0: score the prompt only), sampling, eos, stop sequences
  bool prompt_logprobs = false;       // log-probabilities of the prompt's tokens (OpenAI's echo with logprobs)
  bool logprobs = false;              // log-probabilities of the generated tokens
  int64_t top_logprobs = 0;           // alternatives per position, with prompt_logprobs or logprobs
  // Called on the scheduler thread after each new token with the tokens generated so far; true stops the sequence
  // there (stop strings, which need the tokenizer). May be empty.
  std::function<bool(const std::vector<int64_t>&)> stop;
  // Called on the scheduler thread with each new token, in order (streaming). May be empty.
  std::function<void(int64_t)> on_token;
  // Set by the caller (a client gone, a timeout): the row leaves the batch at the next step, its future then holds
  // an Error.
  std::shared_ptr<std::atomic<bool>> cancelled;
};

struct Result {
  std::vector<int64_t> tokens;                // generated, the token that stopped the sequence included
  std::vector<TokenLogprob> prompt_logprobs;  // one per prompt token, when asked
  std::vector<TokenLogprob> token_logprobs;   // one per generated token, when asked
  std::string finish_reason;                  // "stop" (end-of-sequence, a stop sequence, stop()) or "length"
};

// submit() refuses a request when max_waiting requests already wait: the caller answers "busy" (HTTP 503).
class Busy : public Error {
 public:
  using Error::Error;
};

struct EngineOptions {
  int64_t max_batch = 32;             // rows decoded together
  int64_t max_prefill_tokens = 8192;  // padded prompt tokens per prefill (at least one request per iteration)
  int64_t max_waiting = 1024;         // requests waiting to be admitted
  core::Precision precision = core::Precision::kFp32;  // autocast on the scheduler thread
};

// What the engine is doing, for logs and /metrics-like reports.
struct EngineStats {
  int64_t running = 0;    // rows in the batch
  int64_t waiting = 0;    // requests not admitted yet
  int64_t requests = 0;   // finished, since start
  int64_t generated = 0;  // tokens generated, since start
  int64_t prompt_tokens = 0;
  int64_t steps = 0;     // decoding steps (forwards of the running batch)
  int64_t prefills = 0;  // prefill forwards (each admits one or more waiting requests together)
};

class Engine {
 public:
  // Starts the scheduler thread; the model moves to eval mode and stays there. The scheduler runs LibTorch's
  // parallel regions with an OpenMP team of its own: a caller that loaded the model on a thread that lives on keeps a
  // second team, which on a small CPU halves the decoding speed (tools/serve.cpp loads on a thread that ends first).
  Engine(std::shared_ptr<models::CausalLM> model, EngineOptions options);
  // Fails waiting and running requests with an Error ("the engine stopped") and joins the thread.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Thread-safe. Throws ConfigError for a request the model cannot run (an empty prompt, a token outside the
  // vocabulary, prompt + max_new_tokens beyond max_seq_len, an option out of range), Busy when too many wait. The
  // future holds the result, or the Error that ended the request (cancelled, a failed forward).
  std::future<Result> submit(Request request);

  EngineStats stats() const;
  const models::CausalLM& model() const { return *model_; }

 private:
  struct Row;
  void loop();
  void admit(std::vector<std::unique_ptr<Row>>& fresh);
  void step();
  void finish(std::unique_ptr<Row>& row, std::string reason);    // its result; the row leaves
  void fail(std::unique_ptr<Row>& row, const std::string& why);  // an Error instead; the row leaves
  void fail_all(const std::string& why);
  bool choose(Row& row, const at::Tensor& logits);  // one new token from (1, V) logits; true when the row stops

  std::shared_ptr<models::CausalLM> model_;
  EngineOptions options_;
  at::Device device_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Row>> waiting_;  // guarded by mu_
  bool stopping_ = false;                     // guarded by mu_
  EngineStats stats_;                         // guarded by mu_
  // The scheduler thread's own state.
  std::vector<std::unique_ptr<Row>> running_;
  models::KVCache cache_;  // the running rows' caches, in running_'s order
  std::thread thread_;
};

}  // namespace tessera::serve
