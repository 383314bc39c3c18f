// OpenAI's HTTP API as `tessera serve` speaks it: request bodies of /v1/completions and /v1/chat/completions read
// into engine requests (strictly: an unknown field, a wrong type or a value out of range is an ApiError naming the
// field), and the engine's results written as OpenAI's responses and streamed chunks. No HTTP here (server.h).
//
// /v1/completions: model, prompt (a string, strings, token ids, or lists of token ids: one choice each), max_tokens
// (default 16; 0 with echo scores the prompt only), temperature (default 1; 0 = greedy), top_p, seed, stop (a string
// or up to 16), echo, logprobs (0-20: log-probabilities of the tokens and the likeliest alternatives; with echo the
// prompt's too, as lm-evaluation-harness's local-completions reads them), n (1-16 choices per prompt, sampled with
// seeds seed, seed + 1, ...; not with stream), best_of (1), stream, user; beyond
// OpenAI as vLLM names them: top_k, min_p, repetition_penalty, ignore_eos; presence_penalty and frequency_penalty
// ([-2, 2], over the generated tokens) and logit_bias ({"token id": bias in [-100, 100]}) as OpenAI defines them.
// /v1/chat/completions: messages (rendered by the tokenizer's chat template), max_tokens / max_completion_tokens
// (default: the rest of the context), logprobs (true/false) and top_logprobs, and the sampling fields above.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "tessera/data/finetuning.h"
#include "tessera/serve/engine.h"

namespace tessera::serve {

// A request the API refuses: the HTTP status, and OpenAI's error object (message, type, param).
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, const std::string& message, std::string param = "", std::string type = "invalid_request_error");
  int status() const { return status_; }
  // {"error": {"message", "type", "param", "code"}}
  nlohmann::ordered_json body() const;

 private:
  int status_;
  std::string type_;
  std::string param_;
};

// The model a server serves, as the API names and describes it.
struct ServedModel {
  std::string name;  // requests' `model` must be this (or absent); /v1/models lists it
  std::shared_ptr<const data::ChatTokenizer> tokenizer;
  int64_t max_seq_len = 0;  // prompt + max_tokens at most
  int64_t vocab_size = 0;   // token ids in prompts lie below it
  int64_t created = 0;      // Unix seconds (/v1/models)
};

// One request as parsed: the engine requests of its choices and what the answer needs.
struct ApiCall {
  bool chat = false;
  bool stream = false;
  bool echo = false;                 // completions: the prompt's text (and logprobs) before the completion's
  std::optional<int64_t> logprobs;   // alternatives per token; unset = no logprobs
  std::vector<std::string> stop;     // stop strings (the text ends before the first one found)
  int64_t n = 1;                     // choices per prompt: choice i answers prompt i / n
  std::vector<std::string> prompts;  // each choice's prompt as text
  std::vector<Request> requests;     // one per choice
};

// Parse the JSON body of /v1/completions or /v1/chat/completions for `model`. Throws ApiError (400 for a bad field,
// 404 for another model's name).
ApiCall parse_completions(const nlohmann::json& body, const ServedModel& model);
ApiCall parse_chat(const nlohmann::json& body, const ServedModel& model);

// What a choice says: its text (stop string removed, special tokens skipped) and why it ended.
struct ChoiceText {
  std::string text;
  std::string finish_reason;
};
ChoiceText choice_text(const ApiCall& call, const Result& result, const data::Tokenizer& tokenizer);

// The whole response of a call whose choices ended with `results` (in the call's order).
nlohmann::ordered_json completion_response(const ApiCall& call, const std::vector<Result>& results,
                                           const ServedModel& model, const std::string& id, int64_t created);

// One server-sent-events chunk of a streamed choice: `delta` text, and the finish reason with the last one.
nlohmann::ordered_json stream_chunk(const ApiCall& call, size_t index, const std::string& delta,
                                    const std::optional<std::string>& finish_reason, const ServedModel& model,
                                    const std::string& id, int64_t created);

// GET /v1/models.
nlohmann::ordered_json models_response(const ServedModel& model);

}  // namespace tessera::serve
