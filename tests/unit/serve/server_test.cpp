// `tessera serve`'s HTTP server in-process on a free loopback port, through Tessera's own HTTP client (libcurl):
// completions and chat equal models::generate, echo + logprobs equal a plain forward's log-softmax (what
// lm-evaluation-harness reads), streaming gives the same text, bad requests get OpenAI's error objects with 4xx and
// the server goes on, concurrent clients all get their own answers.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tessera/data/tokenizer.h"
#include "tessera/models/generate.h"
#include "tessera/serve/server.h"
#include "tessera/util/http.h"

namespace tessera::serve {
namespace {

using nlohmann::json;

data::Tokenizer tiny_tokenizer() {
  return data::train_bpe_tokenizer({"the cat sat on the mat. the dog sat on the log. a cat and a dog ran far away.",
                                    "once upon a time there was a small model that could count: one two three four"},
                                   {.vocab_size = 300, .special_tokens = {"<|endoftext|>"}});
}

struct LiveServer {
  std::shared_ptr<models::CausalLM> model;
  ServedModel served;
  std::shared_ptr<Engine> engine;
  std::unique_ptr<Server> server;
  std::thread runner;
  std::string base;

  explicit LiveServer(ServerOptions options = {}) {
    model = models::build_from_hf_config(json{{"model_type", "llama"},
                                              {"hidden_size", 32},
                                              {"intermediate_size", 64},
                                              {"num_hidden_layers", 2},
                                              {"num_attention_heads", 4},
                                              {"num_key_value_heads", 2},
                                              {"vocab_size", 320},
                                              {"max_position_embeddings", 128}},
                                         "tiny/config.json", "cpu", 11);
    served.name = "tiny";
    served.tokenizer = std::make_shared<const data::ChatTokenizer>(tiny_tokenizer(), "");
    served.max_seq_len = model->max_seq_len();
    served.vocab_size = model->vocab_size();
    engine = std::make_shared<Engine>(model, EngineOptions{.max_batch = 8});
    options.port = 0;
    server = std::make_unique<Server>(options, engine, served);
    base = "http://127.0.0.1:" + std::to_string(server->port());
    runner = std::thread([this] { server->run(); });
  }
  ~LiveServer() {
    server->stop();
    runner.join();
  }

  util::HttpResponse post(const std::string& path, const std::string& body,
                          std::vector<std::pair<std::string, std::string>> headers = {}) const {
    util::HttpRequest r;
    r.method = "POST";
    r.url = base + path;
    r.body = body;
    headers.emplace_back("Content-Type", "application/json");
    r.headers = headers;
    return util::http_request(r);
  }
  util::HttpResponse get(const std::string& path) const {
    util::HttpRequest r;
    r.url = base + path;
    return util::http_request(r);
  }
  std::vector<int64_t> encode(const std::string& text) const {
    const auto ids = served.tokenizer->tokenizer().encode(text, true);
    return {ids.begin(), ids.end()};
  }
  std::string decode(const std::vector<int64_t>& ids) const {
    return served.tokenizer->tokenizer().decode(std::vector<int32_t>(ids.begin(), ids.end()), true);
  }
  std::vector<int64_t> greedy(const std::vector<int64_t>& prompt, int64_t n) const {
    models::GenerationOptions g;
    g.max_new_tokens = n;
    return models::generate(*model, {prompt}, g)[0];
  }
};

// The "data: ..." events of a server-sent-events body.
std::vector<std::string> events(const std::string& body) {
  std::vector<std::string> out;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const size_t end = body.find("\n\n", at);
    out.push_back(body.substr(at + 6, end - at - 6));
    at = end;
  }
  return out;
}

TEST(ServeHttp, CompletionsAndChatEqualGenerate) {
  const LiveServer s;
  const std::string prompt = "the cat sat on";
  const auto r = s.post("/v1/completions",
                        json{{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], s.decode(s.greedy(s.encode(prompt), 8)));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], s.encode(prompt).size());
  EXPECT_EQ(j["usage"]["completion_tokens"], 8);

  const json messages = json::array({{{"role", "user"}, {"content", "a dog ran"}}});
  const auto c = s.post("/v1/chat/completions",
                        json{{"messages", messages}, {"max_tokens", 6}, {"temperature", 0}, {"seed", 3}}.dump());
  ASSERT_EQ(c.status, 200) << c.body;
  const std::string rendered = s.served.tokenizer->apply_chat_template(messages, true);
  const auto ids = s.served.tokenizer->tokenizer().encode(rendered, false);
  EXPECT_EQ(json::parse(c.body)["choices"][0]["message"]["content"], s.decode(s.greedy({ids.begin(), ids.end()}, 6)));
  EXPECT_EQ(json::parse(c.body)["object"], "chat.completion");

  const auto m = s.get("/v1/models");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(json::parse(m.body)["data"][0]["id"], "tiny");
  EXPECT_EQ(json::parse(m.body)["data"][0]["max_model_len"], 128);
}

TEST(ServeHttp, NChoicesPerPromptAreTheSeededSamplesOfSeedSeedPlusOneAndSoOn) {
  const LiveServer s;
  auto completions = [&](const json& body) {
    const auto r = s.post("/v1/completions", body.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body);
  };
  const json prompts = {"the cat sat on", "a dog"};
  const json all = completions({{"prompt", prompts}, {"max_tokens", 6}, {"n", 3}, {"seed", 40}, {"temperature", 1}});
  ASSERT_EQ(all["choices"].size(), 6U);
  std::set<std::string> texts;
  for (size_t i = 0; i < 6; ++i) {
    // Choice i answers prompt i / 3 with seed 40 + i % 3, as a request of its own would.
    const json alone = completions({{"prompt", prompts[i / 3]}, {"max_tokens", 6}, {"seed", 40 + i % 3}});
    EXPECT_EQ(all["choices"][i]["index"], i);
    EXPECT_EQ(all["choices"][i]["text"], alone["choices"][0]["text"]) << i;
    texts.insert(all["choices"][i]["text"].get<std::string>());
  }
  EXPECT_GT(texts.size(), 3U);  // samples, not copies
  // The prompts' tokens are counted once, the choices' tokens each.
  EXPECT_EQ(all["usage"]["prompt_tokens"], s.encode("the cat sat on").size() + s.encode("a dog").size());
  EXPECT_EQ(all["usage"]["completion_tokens"], 36);
  EXPECT_EQ(s.post("/v1/completions", R"({"prompt": "a", "n": 2, "stream": true})").status, 400);
}

TEST(ServeHttp, EchoLogprobsAreThePromptsLogSoftmaxAsLmEvalReadsThem) {
  const LiveServer s;
  const std::vector<std::vector<int64_t>> prompts = {{10, 20, 30, 40, 50}, {7, 8}};
  const auto r = s.post(
      "/v1/completions",
      json{{"prompt", prompts}, {"max_tokens", 1}, {"echo", true}, {"logprobs", 1}, {"temperature", 0}, {"seed", 1234}}
          .dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  ASSERT_EQ(j["choices"].size(), 2U);
  at::NoGradGuard no_grad;
  s.model->eval();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const json& lp = j["choices"][i]["logprobs"];
    const auto& p = prompts[i];
    ASSERT_EQ(lp["token_logprobs"].size(), p.size() + 1);  // the prompt, then the one generated token
    EXPECT_TRUE(lp["token_logprobs"][0].is_null());
    EXPECT_TRUE(lp["top_logprobs"][0].is_null());
    const at::Tensor logsm = s.model->forward(at::tensor(p, at::kLong).view({1, -1}))[0].log_softmax(-1);
    for (size_t t = 1; t < p.size(); ++t) {
      EXPECT_NEAR(lp["token_logprobs"][t].get<double>(), logsm[static_cast<int64_t>(t) - 1][p[t]].item<double>(), 1e-5);
      // lm-eval's is_greedy: the token's logprob against the best of top_logprobs.
      double best = -1e30;
      for (const auto& [k, v] : lp["top_logprobs"][t].items()) best = std::max(best, v.get<double>());
      EXPECT_NEAR(best, logsm[static_cast<int64_t>(t) - 1].max().item<double>(), 1e-5);
    }
  }
}

TEST(ServeHttp, BadRequestsGetOpenAiErrorsAndTheServerGoesOn) {
  ServerOptions o;
  o.max_body_bytes = 4096;
  const LiveServer s(o);
  auto expect = [&](const util::HttpResponse& r, long status, const std::string& words) {
    EXPECT_EQ(r.status, status) << r.body;
    const json j = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(words), std::string::npos) << r.body;
  };
  expect(s.post("/v1/completions", "{\"prompt\": \"a\","), 400, "not valid JSON");
  expect(s.post("/v1/completions", "[1, 2]"), 400, "must be a JSON object");
  expect(s.post("/v1/completions", R"({"prompt": "a", "colour": "red"})"), 400, "unknown field 'colour'");
  expect(s.post("/v1/completions", R"({"prompt": "a", "max_tokens": -1})"), 400, "'max_tokens' must lie in");
  expect(s.post("/v1/completions", R"({"prompt": "a", "max_tokens": "5"})"), 400, "'max_tokens' must be an integer");
  expect(s.post("/v1/completions", R"({"prompt": "a", "n": 17})"), 400, "'n' must lie in [1, 16]");
  expect(s.post("/v1/completions", R"({"prompt": "a", "temperature": 3})"), 400, "'temperature' must lie in");
  expect(s.post("/v1/completions", R"({"prompt": [[1, 2], []]})"), 400, "'prompt' must be");
  expect(s.post("/v1/completions", R"({"prompt": [1, 999]})"), 400, "token 999, outside the vocabulary of 320");
  expect(s.post("/v1/completions", R"({"prompt": "a", "max_tokens": 500})"), 400, "maximum context length is 128");
  expect(s.post("/v1/completions", R"({"model": "gpt-9", "prompt": "a"})"), 404, "'gpt-9' does not exist");
  expect(s.post("/v1/chat/completions", R"({"messages": [{"content": "hi"}]})"), 400, "'messages[0]' must be");
  expect(s.post("/v1/completions", R"({"prompt": ")" + std::string(5000, 'a') + "\"}"), 413, "larger than 4096 bytes");
  expect(s.get("/v2/engines"), 404, "no route GET /v2/engines");
  const auto ok = s.post("/v1/completions", R"({"prompt": "the", "max_tokens": 2, "temperature": 0})");
  EXPECT_EQ(ok.status, 200) << ok.body;
}

TEST(ServeHttp, AnApiKeyIsRequiredWhenSet) {
  ServerOptions o;
  o.api_key = "s3cret-key";
  const LiveServer s(o);
  const std::string body = R"({"prompt": "the", "max_tokens": 1})";
  EXPECT_EQ(s.post("/v1/completions", body).status, 401);
  EXPECT_EQ(s.post("/v1/completions", body, {{"Authorization", "Bearer wrong-key!"}}).status, 401);
  EXPECT_EQ(s.post("/v1/completions", body, {{"Authorization", "Bearer s3cret-key"}}).status, 200);
}

TEST(ServeHttp, StreamingGivesTheSameTextAndStopsAtAStopString) {
  const LiveServer s;
  const std::string prompt = "once upon a";
  const std::string full = s.decode(s.greedy(s.encode(prompt), 12));
  ASSERT_GE(full.size(), 6U);
  // Cut the text where its first two ASCII characters after the first byte occur (a stop string is valid UTF-8).
  size_t at = 1;
  while (at + 1 < full.size() &&
         !(static_cast<unsigned char>(full[at]) < 0x80 && static_cast<unsigned char>(full[at + 1]) < 0x80)) {
    ++at;
  }
  ASSERT_LT(at + 1, full.size()) << full;
  const std::string stop = full.substr(at, 2);
  const std::string cut = full.substr(0, full.find(stop));
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream);
    const auto r = s.post(
        "/v1/completions",
        json{{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}, {"stop", {stop}}, {"stream", stream}}.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    if (!stream) {
      EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], cut);
      EXPECT_EQ(json::parse(r.body)["choices"][0]["finish_reason"], "stop");
      continue;
    }
    const std::vector<std::string> ev = events(r.body);
    ASSERT_GE(ev.size(), 2U) << r.body;
    EXPECT_EQ(ev.back(), "[DONE]");
    std::string text;
    for (size_t i = 0; i + 1 < ev.size(); ++i) text += json::parse(ev[i])["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(text, cut) << r.body;
    EXPECT_EQ(json::parse(ev[ev.size() - 2])["choices"][0]["finish_reason"], "stop");
  }
  // Chat streaming: a role chunk, content deltas, the finish reason.
  const auto c = s.post("/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", "count"}}}},
                                                     {"max_tokens", 5},
                                                     {"temperature", 0},
                                                     {"stream", true}}
                                                    .dump());
  ASSERT_EQ(c.status, 200);
  const std::vector<std::string> ev = events(c.body);
  ASSERT_GE(ev.size(), 3U);
  EXPECT_EQ(json::parse(ev[0])["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(json::parse(ev[ev.size() - 2])["choices"][0]["finish_reason"], "length");
}

TEST(ServeHttp, ConcurrentClientsEachGetTheirOwnAnswer) {
  const LiveServer s;
  constexpr int kClients = 24;
  std::vector<std::vector<int64_t>> prompts;
  std::vector<std::string> expected;
  for (int i = 0; i < kClients; ++i) {
    std::vector<int64_t> p;
    for (int t = 0; t < 1 + i % 9; ++t) p.push_back((i * 13 + t * 29) % 320);
    prompts.push_back(p);
    expected.push_back(s.decode(s.greedy(p, 3 + i % 5)));
  }
  std::vector<util::HttpResponse> got(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      got[static_cast<size_t>(i)] = s.post(
          "/v1/completions",
          json{{"prompt", prompts[static_cast<size_t>(i)]}, {"max_tokens", 3 + i % 5}, {"temperature", 0}}.dump());
    });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < kClients; ++i) {
    const auto& r = got[static_cast<size_t>(i)];
    ASSERT_EQ(r.status, 200) << i << ": " << r.body << r.transport_error;
    EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], expected[static_cast<size_t>(i)]) << i;
  }
  EXPECT_EQ(json::parse(s.get("/health").body)["requests"], kClients);
}

}  // namespace
}  // namespace tessera::serve
