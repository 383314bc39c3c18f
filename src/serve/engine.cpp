// The continuous-batching scheduler (engine.h).
#include "tessera/serve/engine.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "tessera/trainer/precision_context.h"
#include "tessera/util/error.h"

namespace tessera::serve {

struct Engine::Row {
  Request request;
  std::promise<Result> promise;
  Result result;
  at::Generator generator;
  at::Tensor seen;      // (1, V) bool with a repetition penalty: the tokens of the sequence so far
  at::Tensor counts;    // (1, V) float with a presence or frequency penalty: each token's count among those generated
  int64_t pending = 0;  // the last token chosen, not in the cache yet
};

namespace {

constexpr double kNoLogprob = std::numeric_limits<double>::quiet_NaN();

bool ends_with(const std::vector<int64_t>& seq, const std::vector<int64_t>& tail) {
  return !tail.empty() && seq.size() >= tail.size() && std::equal(tail.rbegin(), tail.rend(), seq.rbegin());
}

// The log-probability of `token` under float logits (V), and the `top` likeliest tokens.
TokenLogprob logprob_of(const at::Tensor& logits, int64_t token, int64_t top) {
  const at::Tensor lse = logits.logsumexp(-1);
  TokenLogprob out;
  out.token = token;
  out.logprob = (logits[token] - lse).item<double>();
  if (top > 0) {
    auto [values, ids] = logits.topk(std::min(top, logits.size(-1)));
    const at::Tensor lp = (values - lse).to(at::kDouble).contiguous();
    const at::Tensor id = ids.to(at::kLong).contiguous();
    for (int64_t i = 0; i < lp.numel(); ++i) out.top.emplace_back(id.data_ptr<int64_t>()[i], lp.data_ptr<double>()[i]);
  }
  return out;
}

// Left-pads token rows to their longest: ids (B, L) and mask (B, L) bool (true = token), on `device`.
std::pair<at::Tensor, at::Tensor> left_padded(const std::vector<const std::vector<int64_t>*>& rows, int64_t pad_id,
                                              const at::Device& device) {
  int64_t longest = 0;
  for (const auto* r : rows) longest = std::max<int64_t>(longest, static_cast<int64_t>(r->size()));
  const auto n = static_cast<int64_t>(rows.size());
  at::Tensor ids = at::full({n, longest}, pad_id, at::kLong);
  at::Tensor mask = at::zeros({n, longest}, at::kBool);
  for (int64_t b = 0; b < n; ++b) {
    const std::vector<int64_t>& r = *rows[static_cast<size_t>(b)];
    const int64_t offset = longest - static_cast<int64_t>(r.size());
    ids[b].narrow(0, offset, static_cast<int64_t>(r.size())).copy_(at::tensor(r, at::kLong));
    mask[b].narrow(0, offset, static_cast<int64_t>(r.size())).fill_(true);
  }
  return {ids.to(device), mask.to(device)};
}

}  // namespace

Engine::Engine(std::shared_ptr<models::CausalLM> model, EngineOptions options)
    : model_(std::move(model)), options_(options), device_(at::kCPU) {
  if (!model_) throw ConfigError("serve", "no model");
  if (options_.max_batch < 1) throw ConfigError("serve", "max_batch must be at least 1");
  if (options_.max_prefill_tokens < 1) throw ConfigError("serve", "max_prefill_tokens must be at least 1");
  device_ = model_->parameters().front().device();
  model_->eval();
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::future<Result> Engine::submit(Request request) {
  models::check_generation_options(request.options);
  const int64_t vocab = model_->vocab_size();
  if (request.prompt.empty()) throw ConfigError("serve", "the prompt has no tokens");
  for (int64_t t : request.prompt) {
    if (t < 0 || t >= vocab) {
      throw ConfigError("serve",
                        fmt::format("the prompt holds token {}, outside the model's vocabulary of {}", t, vocab));
    }
  }
  const auto total = static_cast<int64_t>(request.prompt.size()) + request.options.max_new_tokens;
  if (total > model_->max_seq_len()) {
    throw ConfigError("serve",
                      fmt::format("the prompt's {} tokens and max_tokens {} exceed the model's context of {} "
                                  "tokens",
                                  request.prompt.size(), request.options.max_new_tokens, model_->max_seq_len()));
  }
  if (request.top_logprobs < 0) throw ConfigError("serve", "top_logprobs must not be negative");
  auto row = std::make_unique<Row>();
  row->generator = at::make_generator<at::CPUGeneratorImpl>(request.options.seed);
  if (request.options.repetition_penalty != 1.0) {
    row->seen = at::zeros({1, vocab}, at::kBool);
    row->seen.index_fill_(1, at::tensor(request.prompt, at::kLong), true);
  }
  if (models::counts_generated_tokens(request.options)) row->counts = at::zeros({1, vocab}, at::kFloat);
  for (const auto& [token, bias] : request.options.logit_bias) {
    if (token < 0 || token >= vocab) {
      throw ConfigError("serve",
                        fmt::format("logit_bias names token {}, outside the model's vocabulary of {}", token, vocab));
    }
  }
  row->request = std::move(request);
  std::future<Result> future = row->promise.get_future();
  {
    const std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) throw Error("serve", "the engine is stopping");
    if (static_cast<int64_t>(waiting_.size()) >= options_.max_waiting) {
      throw Busy("serve", fmt::format("{} requests are waiting already; try again later", waiting_.size()));
    }
    waiting_.push_back(std::move(row));
  }
  wake_.notify_one();
  return future;
}

EngineStats Engine::stats() const {
  const std::lock_guard<std::mutex> lock(mu_);
  EngineStats s = stats_;
  s.waiting = static_cast<int64_t>(waiting_.size());
  return s;
}

void Engine::loop() {
  at::NoGradGuard no_grad;
  const trainer::AutocastGuard autocast(options_.precision, device_.type());
  while (true) {
    std::vector<std::unique_ptr<Row>> fresh;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || !waiting_.empty() || !running_.empty(); });
      if (stopping_) break;
      // Admit in arrival order while rows are free and the padded prefill stays within its budget; requests
      // cancelled while they waited leave first, counting against neither.
      int64_t longest = 0;
      while (!waiting_.empty() && static_cast<int64_t>(running_.size() + fresh.size()) < options_.max_batch) {
        if (const auto& c = waiting_.front()->request.cancelled; c && c->load()) {
          waiting_.front()->promise.set_exception(std::make_exception_ptr(Error("serve", "the request was cancelled")));
          waiting_.pop_front();
          continue;
        }
        const auto len = static_cast<int64_t>(waiting_.front()->request.prompt.size());
        const int64_t padded = std::max(longest, len) * static_cast<int64_t>(fresh.size() + 1);
        if (!fresh.empty() && padded > options_.max_prefill_tokens) break;
        longest = std::max(longest, len);
        fresh.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
      }
      stats_.running += static_cast<int64_t>(fresh.size());
    }
    try {
      if (!fresh.empty()) admit(fresh);
      if (!running_.empty()) step();
    } catch (const std::exception& e) {
      spdlog::error("serve: a batch failed: {}", e.what());
      for (auto& row : fresh) fail(row, e.what());
      fail_all(e.what());
    }
  }
  // Stopping: fail what is left.
  fail_all("the engine stopped");
  const std::lock_guard<std::mutex> lock(mu_);
  for (auto& row : waiting_) {
    row->promise.set_exception(std::make_exception_ptr(Error("serve", "the engine stopped")));
  }
  waiting_.clear();
}

void Engine::fail(std::unique_ptr<Row>& row, const std::string& why) {
  if (!row) return;
  {
    const std::lock_guard<std::mutex> lock(mu_);
    stats_.running -= 1;
  }
  row->promise.set_exception(std::make_exception_ptr(Error("serve", why)));
  row.reset();
}

void Engine::fail_all(const std::string& why) {
  for (auto& row : running_) fail(row, why);
  running_.clear();
  cache_ = models::KVCache{};
}

void Engine::finish(std::unique_ptr<Row>& row, std::string reason) {
  row->result.finish_reason = std::move(reason);
  {
    const std::lock_guard<std::mutex> lock(mu_);
    stats_.running -= 1;
    stats_.requests += 1;
    stats_.generated += static_cast<int64_t>(row->result.tokens.size());
    stats_.prompt_tokens += static_cast<int64_t>(row->request.prompt.size());
  }
  row->promise.set_value(std::move(row->result));
  row.reset();
}

bool Engine::choose(Row& row, const at::Tensor& logits) {
  const models::GenerationOptions& g = row.request.options;
  const int64_t token = models::choose_next_tokens(logits, row.seen, g, row.generator, row.counts)[0].item<int64_t>();
  if (row.seen.defined()) row.seen[0][token] = true;
  if (row.counts.defined()) row.counts[0][token] += 1;
  if (row.request.logprobs) row.result.token_logprobs.push_back(logprob_of(logits[0], token, row.request.top_logprobs));
  row.result.tokens.push_back(token);
  row.pending = token;
  if (row.request.on_token) row.request.on_token(token);
  bool stop = g.eos_token_id && token == *g.eos_token_id;
  for (const auto& s : g.stop_sequences) stop = stop || ends_with(row.result.tokens, s);
  if (!stop && row.request.stop) stop = row.request.stop(row.result.tokens);
  return stop;
}

void Engine::admit(std::vector<std::unique_ptr<Row>>& fresh) {
  std::vector<const std::vector<int64_t>*> prompts;
  for (const auto& row : fresh) prompts.push_back(&row->request.prompt);
  const int64_t pad_id = fresh.front()->request.options.pad_token_id;
  auto [ids, mask] = left_padded(prompts, pad_id, device_);
  models::KVCache cache;
  models::ForwardOptions fo;
  fo.cache = &cache;
  // A mask only where a prompt is padded: as models::generate, so that unpadded rows take the models' unmasked
  // attention (a decoding step with a mask cost 1.6x one without on a small Llama on the CPU).
  const int64_t width = ids.size(1);  // (clang before 16 cannot capture a structured binding)
  const bool padded = std::any_of(prompts.begin(), prompts.end(), [width](const std::vector<int64_t>* p) {
    return static_cast<int64_t>(p->size()) != width;
  });
  if (padded) fo.attention_mask = mask;
  const at::Tensor logits = model_->forward(ids, fo);  // (n, L, V)
  {
    const std::lock_guard<std::mutex> lock(mu_);
    stats_.prefills += 1;
  }
  const int64_t longest = ids.size(1);
  std::vector<int64_t> keep;
  for (size_t b = 0; b < fresh.size(); ++b) {
    Row& row = *fresh[b];
    const auto n = static_cast<int64_t>(row.request.prompt.size());
    const at::Tensor row_logits = logits[static_cast<int64_t>(b)].narrow(0, longest - n, n).to(at::kFloat).cpu();
    if (row.request.prompt_logprobs) {
      // Position t - 1 predicts token t.
      row.result.prompt_logprobs.push_back({row.request.prompt[0], kNoLogprob, {}});
      if (n > 1) {
        const at::Tensor before = row_logits.narrow(0, 0, n - 1);
        const at::Tensor next = at::tensor(row.request.prompt, at::kLong).narrow(0, 1, n - 1);
        const at::Tensor lps =
            (before.gather(1, next.view({n - 1, 1})).squeeze(1) - before.logsumexp(-1)).to(at::kDouble).contiguous();
        for (int64_t t = 1; t < n; ++t) {
          TokenLogprob lp;
          lp.token = row.request.prompt[static_cast<size_t>(t)];
          lp.logprob = lps.data_ptr<double>()[t - 1];
          if (row.request.top_logprobs > 0) lp.top = logprob_of(before[t - 1], lp.token, row.request.top_logprobs).top;
          row.result.prompt_logprobs.push_back(std::move(lp));
        }
      }
    }
    if (row.request.options.max_new_tokens == 0) {
      finish(fresh[b], "length");
      continue;
    }
    if (choose(row, row_logits[n - 1].unsqueeze(0))) {
      finish(fresh[b], "stop");
    } else if (static_cast<int64_t>(row.result.tokens.size()) >= row.request.options.max_new_tokens) {
      finish(fresh[b], "length");
    } else {
      keep.push_back(static_cast<int64_t>(b));
    }
  }
  if (keep.empty()) return;
  if (keep.size() != fresh.size()) models::select_cache_rows(cache, at::tensor(keep, at::kLong));
  cache_ = running_.empty() ? std::move(cache) : models::concat_cache_rows({&cache_, &cache});
  for (int64_t b : keep) running_.push_back(std::move(fresh[static_cast<size_t>(b)]));
}

void Engine::step() {
  // Cancelled rows leave before the forward.
  std::vector<int64_t> keep;
  for (size_t i = 0; i < running_.size(); ++i) {
    const auto& c = running_[i]->request.cancelled;
    if (c && c->load()) {
      fail(running_[i], "the request was cancelled");
    } else {
      keep.push_back(static_cast<int64_t>(i));
    }
  }
  auto compact = [&](const std::vector<int64_t>& rows) {
    if (rows.size() == running_.size()) return;
    if (rows.empty()) {
      cache_ = models::KVCache{};
    } else {
      models::select_cache_rows(cache_, at::tensor(rows, at::kLong));
      // Once the rows left hold no padding (select_cache_rows dropped the columns no row uses), the cache needs no
      // mask. Only rows leaving can end the padding, so this is the one place to look.
      if (cache_.attention_mask.defined() && cache_.attention_mask.all().item<bool>()) {
        cache_.attention_mask = at::Tensor();
      }
    }
    std::vector<std::unique_ptr<Row>> kept;
    for (int64_t i : rows) kept.push_back(std::move(running_[static_cast<size_t>(i)]));
    running_ = std::move(kept);
  };
  compact(keep);
  if (running_.empty()) return;
  const auto batch = static_cast<int64_t>(running_.size());
  at::Tensor logits;
  models::ForwardOptions fo;
  if (model_->kv_cache_stale(cache_.length, cache_.length + 1)) {
    // The cache cannot serve this step (Phi-3's longrope switching factors): run the whole sequences again.
    std::vector<std::vector<int64_t>> seqs;
    for (const auto& row : running_) {
      std::vector<int64_t> s = row->request.prompt;
      s.insert(s.end(), row->result.tokens.begin(), row->result.tokens.end());
      seqs.push_back(std::move(s));
    }
    std::vector<const std::vector<int64_t>*> ptrs;
    for (const auto& s : seqs) ptrs.push_back(&s);
    auto [ids, mask] = left_padded(ptrs, running_.front()->request.options.pad_token_id, device_);
    cache_ = models::KVCache{};
    fo.cache = &cache_;
    fo.attention_mask = mask;
    logits = model_->forward(ids, fo).select(1, -1);
  } else {
    std::vector<int64_t> last;
    for (const auto& row : running_) last.push_back(row->pending);
    fo.cache = &cache_;
    if (cache_.attention_mask.defined()) {
      fo.attention_mask = at::ones({batch, 1}, at::TensorOptions(at::kBool).device(device_));
    }
    logits = model_->forward(at::tensor(last, at::kLong).view({batch, 1}).to(device_), fo).select(1, -1);
  }
  logits = logits.to(at::kFloat).cpu();  // (B, V)
  {
    const std::lock_guard<std::mutex> lock(mu_);
    stats_.steps += 1;
  }
  keep.clear();
  for (size_t i = 0; i < running_.size(); ++i) {
    Row& row = *running_[i];
    if (choose(row, logits.narrow(0, static_cast<int64_t>(i), 1))) {
      finish(running_[i], "stop");
    } else if (static_cast<int64_t>(row.result.tokens.size()) >= row.request.options.max_new_tokens) {
      finish(running_[i], "length");
    } else {
      keep.push_back(static_cast<int64_t>(i));
    }
  }
  compact(keep);
}

}  // namespace tessera::serve
