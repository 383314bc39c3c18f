// serve::Engine: requests submitted from several threads, joining and leaving a batch smaller than their number,
// decode exactly as models::generate decodes each prompt alone (greedy and seeded sampling), for families with
// rotary, ALiBi and learned positions and with linear-attention layers; prompt log-probabilities equal a plain
// forward's; cancelled requests leave; bad requests are refused before they queue.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tessera/models/generate.h"
#include "tessera/serve/engine.h"
#include "tessera/util/error.h"
#include "test_util.h"

namespace tessera::serve {
namespace {

using nlohmann::json;
using testing::error_of;

// Small models of families whose caches differ: rotary with grouped-query heads, ALiBi, learned positions, and
// linear-attention layers (conv and recurrent states) beside full attention.
std::vector<std::pair<std::string, json>> tiny_configs() {
  return {
      {"llama",
       {{"model_type", "llama"},
        {"hidden_size", 32},
        {"intermediate_size", 64},
        {"num_hidden_layers", 2},
        {"num_attention_heads", 4},
        {"num_key_value_heads", 2},
        {"vocab_size", 97},
        {"max_position_embeddings", 96}}},
      {"mpt",
       {{"model_type", "mpt"},
        {"d_model", 32},
        {"n_heads", 4},
        {"n_layers", 2},
        {"expansion_ratio", 2},
        {"max_seq_len", 96},
        {"vocab_size", 97},
        {"attn_config", {{"alibi", true}}},
        {"no_bias", true}}},
      {"gpt2",
       {{"model_type", "gpt2"},
        {"n_embd", 32},
        {"n_head", 4},
        {"n_layer", 2},
        {"n_positions", 96},
        {"vocab_size", 97}}},
      {"qwen3_5_text",
       {{"model_type", "qwen3_5_text"},
        {"hidden_size", 32},
        {"intermediate_size", 48},
        {"num_hidden_layers", 4},
        {"num_attention_heads", 4},
        {"num_key_value_heads", 2},
        {"head_dim", 8},
        {"linear_num_key_heads", 2},
        {"linear_num_value_heads", 4},
        {"linear_key_head_dim", 8},
        {"linear_value_head_dim", 6},
        {"vocab_size", 97},
        {"max_position_embeddings", 96}}},
  };
}

std::shared_ptr<models::CausalLM> build(const json& config) {
  return models::build_from_hf_config(config, "tiny/config.json", "cpu", 7);
}

// Prompts of many lengths (1 to 19 tokens), and budgets of 1 to 11 new tokens.
std::vector<int64_t> prompt(int i) {
  std::vector<int64_t> p;
  for (int t = 0; t < 1 + (i * 7) % 19; ++t) p.push_back((i * 31 + t * 17) % 97);
  return p;
}

TEST(ServeEngine, ConcurrentRequestsDecodeAsEachPromptAlone) {
  for (const auto& [family, config] : tiny_configs()) {
    SCOPED_TRACE(family);
    const auto model = build(config);
    std::vector<models::GenerationOptions> options;
    std::vector<std::vector<int64_t>> expected;
    for (int i = 0; i < 12; ++i) {
      models::GenerationOptions g;
      g.max_new_tokens = 1 + (i * 5) % 11;
      if (i % 3 == 2) {  // seeded sampling, with the warpers and a penalty
        g.do_sample = true;
        g.temperature = 0.8;
        g.top_k = 20;
        g.top_p = 0.9;
        g.repetition_penalty = 1.3;
        g.seed = 100 + i;
      } else if (i % 3 == 1) {  // greedy with OpenAI's penalties and a logit bias
        g.presence_penalty = 0.5 + 0.1 * i;
        g.frequency_penalty = 0.3;
        g.logit_bias = {{(i * 13) % 97, 2.5}, {(i * 29) % 97, -100.0}};
      }
      options.push_back(g);
      expected.push_back(models::generate(*model, {prompt(i)}, g)[0]);
    }
    // A batch of 4 rows for 12 requests: rows join as others finish, and several prefill together.
    Engine engine(model, {.max_batch = 4});
    std::vector<std::future<Result>> futures(12);
    std::vector<std::thread> clients;
    for (int c = 0; c < 3; ++c) {
      clients.emplace_back([&, c] {
        for (int i = c; i < 12; i += 3) {
          Request r;
          r.prompt = prompt(i);
          r.options = options[static_cast<size_t>(i)];
          futures[static_cast<size_t>(i)] = engine.submit(std::move(r));
        }
      });
    }
    for (auto& t : clients) t.join();
    for (int i = 0; i < 12; ++i) {
      const Result r = futures[static_cast<size_t>(i)].get();
      EXPECT_EQ(r.tokens, expected[static_cast<size_t>(i)]) << "request " << i;
      EXPECT_EQ(r.finish_reason, "length") << i;
    }
    const EngineStats s = engine.stats();
    EXPECT_EQ(s.requests, 12);
    EXPECT_EQ(s.running, 0);
  }
}

TEST(ServeEngine, PromptLogprobsEqualAPlainForward) {
  const auto model = build(tiny_configs()[0].second);
  const std::vector<int64_t> p = {5, 9, 13, 2, 77, 40};
  at::Tensor logits;
  {
    at::NoGradGuard no_grad;
    model->eval();
    logits = model->forward(at::tensor(p, at::kLong).view({1, -1}))[0].log_softmax(-1);
  }
  Engine engine(model, {});
  Request r;
  r.prompt = p;
  r.options.max_new_tokens = 1;
  r.prompt_logprobs = true;
  r.logprobs = true;
  r.top_logprobs = 3;
  const Result out = engine.submit(r).get();
  ASSERT_EQ(out.prompt_logprobs.size(), p.size());
  EXPECT_TRUE(std::isnan(out.prompt_logprobs[0].logprob));
  for (size_t t = 1; t < p.size(); ++t) {
    const at::Tensor row = logits[static_cast<int64_t>(t) - 1];
    EXPECT_NEAR(out.prompt_logprobs[t].logprob, row[p[t]].item<double>(), 1e-5) << t;
    ASSERT_EQ(out.prompt_logprobs[t].top.size(), 3U);
    EXPECT_EQ(out.prompt_logprobs[t].top[0].first, row.argmax().item<int64_t>()) << t;
    EXPECT_NEAR(out.prompt_logprobs[t].top[0].second, row.max().item<double>(), 1e-5) << t;
  }
  // The greedy token's log-probability is the last position's largest.
  ASSERT_EQ(out.token_logprobs.size(), 1U);
  EXPECT_EQ(out.tokens[0], logits[-1].argmax().item<int64_t>());
  EXPECT_NEAR(out.token_logprobs[0].logprob, logits[-1].max().item<double>(), 1e-5);
  // Scoring only: max_new_tokens 0 generates nothing.
  r.options.max_new_tokens = 0;
  const Result scored = engine.submit(r).get();
  EXPECT_TRUE(scored.tokens.empty());
  EXPECT_EQ(scored.prompt_logprobs.size(), p.size());
}

TEST(ServeEngine, StopsOnEosStopSequencesAndTheCallerSay) {
  const auto model = build(tiny_configs()[0].second);
  models::GenerationOptions g;
  g.max_new_tokens = 10;
  const std::vector<int64_t> greedy = models::generate(*model, {{1, 2, 3}}, g)[0];
  Engine engine(model, {});
  Request r;
  r.prompt = {1, 2, 3};
  r.options = g;
  r.stop = [&](const std::vector<int64_t>& so_far) { return so_far.size() == 4; };
  std::vector<int64_t> streamed;
  r.on_token = [&](int64_t t) { streamed.push_back(t); };
  Result out = engine.submit(r).get();
  EXPECT_EQ(out.tokens, std::vector<int64_t>(greedy.begin(), greedy.begin() + 4));
  EXPECT_EQ(out.finish_reason, "stop");
  EXPECT_EQ(streamed, out.tokens);
  r.stop = nullptr;
  r.on_token = nullptr;
  r.options.stop_sequences = {{greedy[1], greedy[2]}};
  out = engine.submit(r).get();
  EXPECT_EQ(out.tokens, std::vector<int64_t>(greedy.begin(), greedy.begin() + 3));
  r.options.stop_sequences.clear();
  r.options.eos_token_id = greedy[0];
  out = engine.submit(r).get();
  EXPECT_EQ(out.tokens, std::vector<int64_t>{greedy[0]});
  EXPECT_EQ(out.finish_reason, "stop");
}

TEST(ServeEngine, CancelledRequestsLeaveAndOthersGoOn) {
  const auto model = build(tiny_configs()[0].second);
  Engine engine(model, {.max_batch = 2});
  auto cancelled = std::make_shared<std::atomic<bool>>(false);
  Request slow;
  slow.prompt = {4, 5, 6};
  slow.options.max_new_tokens = 90;
  slow.cancelled = cancelled;
  std::atomic<int> seen{0};
  slow.on_token = [&](int64_t) { seen += 1; };
  std::future<Result> a = engine.submit(slow);
  while (seen < 2) std::this_thread::yield();
  cancelled->store(true);
  EXPECT_NE(error_of([&] { a.get(); }).find("cancelled"), std::string::npos);
  Request quick;
  quick.prompt = {7, 8};
  quick.options.max_new_tokens = 3;
  EXPECT_EQ(engine.submit(quick).get().tokens.size(), 3U);
}

// A request cancelled while it waited leaves without taking part in the admission: the requests behind it share one
// prefill as if it had never come (its long prompt once counted against the prefill's padded budget).
TEST(ServeEngine, ACancelledWaitingRequestTakesNoPartInTheNextPrefill) {
  const auto model = build(tiny_configs()[0].second);
  Engine engine(model, {.max_batch = 3, .max_prefill_tokens = 8});
  // The first request holds the scheduler in its first token's callback while the others queue.
  std::mutex mu;
  std::condition_variable cv;
  bool holding = false, released = false;
  Request first;
  first.prompt = {1, 2};
  first.options.max_new_tokens = 4;
  first.on_token = [&](int64_t) {
    std::unique_lock<std::mutex> lock(mu);
    if (!holding) {
      holding = true;
      cv.notify_all();
      cv.wait(lock, [&] { return released; });
    }
  };
  std::future<Result> a = engine.submit(first);
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return holding; });
  }
  Request gone;
  gone.prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  gone.options.max_new_tokens = 2;
  gone.cancelled = std::make_shared<std::atomic<bool>>(true);
  std::future<Result> b = engine.submit(gone);
  Request shorter;
  shorter.prompt = {3, 4};
  shorter.options.max_new_tokens = 2;
  std::future<Result> c = engine.submit(shorter);
  std::future<Result> d = engine.submit(shorter);
  EXPECT_EQ(engine.stats().waiting, 3);
  {
    const std::lock_guard<std::mutex> lock(mu);
    released = true;
  }
  cv.notify_all();
  EXPECT_NE(error_of([&] { b.get(); }).find("cancelled"), std::string::npos);
  EXPECT_EQ(c.get().tokens.size(), 2U);
  EXPECT_EQ(d.get().tokens.size(), 2U);
  EXPECT_EQ(a.get().tokens.size(), 4U);
  // The first request's prefill, then one for the two short ones (2 x 2 padded tokens, within the budget of 8).
  EXPECT_EQ(engine.stats().prefills, 2);
}

TEST(ServeEngine, RefusesRequestsTheModelCannotRun) {
  const auto model = build(tiny_configs()[0].second);
  Engine engine(model, {});
  Request r;
  EXPECT_NE(error_of([&] { engine.submit(r); }).find("no tokens"), std::string::npos);
  r.prompt = {1, 97};
  EXPECT_NE(error_of([&] { engine.submit(r); }).find("token 97, outside the model's vocabulary of 97"),
            std::string::npos);
  r.prompt = {1, 2};
  r.options.max_new_tokens = 95;
  EXPECT_NE(error_of([&] { engine.submit(r); }).find("exceed the model's context of 96"), std::string::npos);
  r.options.max_new_tokens = 4;
  r.options.temperature = 0;
  EXPECT_NE(error_of([&] { engine.submit(r); }).find("temperature must be positive"), std::string::npos);
  r.options.temperature = 1;
  r.options.logit_bias = {{-1, 1.0}};
  EXPECT_NE(error_of([&] { engine.submit(r); }).find("logit_bias names token -1, outside the model's vocabulary of 97"),
            std::string::npos);
  r.options.logit_bias = {{3, 101.0}};
  EXPECT_NE(error_of([&] { engine.submit(r); }).find("logit_bias of token 3 must lie in [-100, 100]"),
            std::string::npos);
  r.options.logit_bias.clear();
  r.options.presence_penalty = -2.5;
  EXPECT_NE(error_of([&] { engine.submit(r); }).find("presence_penalty must lie in [-2, 2]"), std::string::npos);
}

}  // namespace
}  // namespace tessera::serve
