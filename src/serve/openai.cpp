// OpenAI's completions and chat completions, read strictly and written as OpenAI writes them (openai.h).
#include "tessera/serve/openai.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <random>
#include <set>
#include <utility>

#include "tessera/util/error.h"

namespace tessera::serve {
namespace {

using Json = nlohmann::json;
using Ordered = nlohmann::ordered_json;

constexpr int64_t kMaxLogprobs = 20;
constexpr size_t kMaxStops = 16;
constexpr size_t kMaxPrompts = 1024;
constexpr int64_t kMaxChoices = 16;  // n

ApiError bad(const std::string& field, const std::string& what) {
  return ApiError(400, fmt::format("'{}' {}", field, what), field);
}

// The body's fields, each looked at once: unknown ones are refused, null ones read as absent.
class Fields {
 public:
  Fields(const Json& body, std::set<std::string> known) : body_(body) {
    if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
    for (const auto& [key, value] : body.items()) {
      if (!known.contains(key)) throw ApiError(400, fmt::format("unknown field '{}'", key), key);
    }
  }
  const Json* get(const std::string& key) const {
    const auto it = body_.find(key);
    return it == body_.end() || it->is_null() ? nullptr : &*it;
  }
  std::optional<double> number(const std::string& key, double lo, double hi) const {
    const Json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) throw bad(key, "must be a number");
    const double x = v->get<double>();
    if (!(x >= lo && x <= hi)) throw bad(key, fmt::format("must lie in [{}, {}], not {}", lo, hi, x));
    return x;
  }
  std::optional<int64_t> integer(const std::string& key, int64_t lo, int64_t hi) const {
    const Json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number_integer()) throw bad(key, "must be an integer");
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi)) {
      throw bad(key, fmt::format("must lie in [{}, {}]", lo, hi));
    }
    const auto x = v->get<int64_t>();
    if (x < lo || x > hi) throw bad(key, fmt::format("must lie in [{}, {}], not {}", lo, hi, x));
    return x;
  }
  std::optional<bool> boolean(const std::string& key) const {
    const Json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) throw bad(key, "must be true or false");
    return v->get<bool>();
  }

 private:
  const Json& body_;
};

const std::set<std::string> kSampling = {"model",
                                         "max_tokens",
                                         "temperature",
                                         "top_p",
                                         "top_k",
                                         "min_p",
                                         "repetition_penalty",
                                         "seed",
                                         "stop",
                                         "n",
                                         "stream",
                                         "stream_options",
                                         "user",
                                         "presence_penalty",
                                         "frequency_penalty",
                                         "logit_bias",
                                         "ignore_eos",
                                         "logprobs"};

std::set<std::string> with(std::set<std::string> base, std::initializer_list<const char*> more) {
  for (const char* k : more) base.insert(k);
  return base;
}

// The fields both endpoints share: the model's name, sampling, penalties, logit bias, stop strings, n.
void read_common(const Fields& f, const ServedModel& model, ApiCall& call, models::GenerationOptions& g) {
  if (const Json* m = f.get("model")) {
    if (!m->is_string()) throw bad("model", "must be a string");
    if (m->get<std::string>() != model.name) {
      throw ApiError(
          404, fmt::format("The model '{}' does not exist; this server serves '{}'", m->get<std::string>(), model.name),
          "model", "not_found_error");
    }
  }
  call.n = f.integer("n", 1, kMaxChoices).value_or(1);
  g.presence_penalty = f.number("presence_penalty", -2, 2).value_or(0.0);
  g.frequency_penalty = f.number("frequency_penalty", -2, 2).value_or(0.0);
  if (const Json* b = f.get("logit_bias")) {
    if (!b->is_object()) throw bad("logit_bias", "must be an object of token ids to biases");
    if (b->size() > static_cast<size_t>(model.vocab_size)) throw bad("logit_bias", "names more tokens than exist");
    for (const auto& [key, bias] : b->items()) {
      int64_t token = -1;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), token);
      if (ec != std::errc() || end != key.data() + key.size() || token < 0 || token >= model.vocab_size) {
        throw bad("logit_bias", fmt::format("names \"{}\", not a token id of the vocabulary of {}", key.substr(0, 40),
                                            model.vocab_size));
      }
      if (!bias.is_number() || !(std::abs(bias.get<double>()) <= 100)) {
        throw bad("logit_bias", fmt::format("gives token {} a bias outside [-100, 100]", token));
      }
      g.logit_bias.emplace_back(token, bias.get<double>());
    }
  }
  if (const Json* u = f.get("user"); u && !u->is_string()) throw bad("user", "must be a string");
  call.stream = f.boolean("stream").value_or(false);
  if (const Json* o = f.get("stream_options"); o && !o->is_object()) throw bad("stream_options", "must be an object");
  const double temperature = f.number("temperature", 0, 2).value_or(1.0);
  g.do_sample = temperature > 0;
  g.temperature = temperature > 0 ? temperature : 1.0;
  g.top_p = f.number("top_p", 0, 1).value_or(1.0);
  if (g.top_p <= 0) throw bad("top_p", "must be above 0");
  g.top_k = std::max<int64_t>(0, f.integer("top_k", -1, 1 << 30).value_or(0));  // -1 (vLLM) or 0: all
  g.min_p = f.number("min_p", 0, 1).value_or(0.0);
  g.repetition_penalty = f.number("repetition_penalty", 0, 100).value_or(1.0);
  if (g.repetition_penalty <= 0) throw bad("repetition_penalty", "must be above 0");
  if (auto seed = f.integer("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max())) {
    g.seed = static_cast<uint64_t>(*seed);
  } else {
    g.seed = std::random_device{}();
  }
  if (const Json* s = f.get("stop")) {
    if (s->is_string()) {
      call.stop.push_back(s->get<std::string>());
    } else if (s->is_array() && s->size() <= kMaxStops) {
      for (const Json& x : *s) {
        if (!x.is_string()) throw bad("stop", "must be a string or a list of strings");
        call.stop.push_back(x.get<std::string>());
      }
    } else {
      throw bad("stop", fmt::format("must be a string or a list of at most {} strings", kMaxStops));
    }
    for (const std::string& text : call.stop) {
      if (text.empty()) throw bad("stop", "must not hold an empty string");
    }
  }
  const data::ChatTokenizer& tok = *model.tokenizer;
  if (auto eos = tok.eos_token_id(); eos && !f.boolean("ignore_eos").value_or(false)) g.eos_token_id = *eos;
  g.pad_token_id = tok.pad_token_id().value_or(0);
}

// The requests of the call's prompts (call.prompts set, `ids` their tokens), with the options and stop strings.
void make_requests(ApiCall& call, std::vector<std::vector<int64_t>> ids, const models::GenerationOptions& g,
                   std::optional<int64_t> max_tokens, const ServedModel& model, bool prompt_logprobs) {
  const std::shared_ptr<const data::ChatTokenizer> tok = model.tokenizer;
  const std::vector<std::string> stops = call.stop;
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto n = static_cast<int64_t>(ids[i].size());
    if (n == 0) throw bad(call.chat ? "messages" : "prompt", "gives no tokens");
    for (int64_t t : ids[i]) {
      if (t < 0 || t >= model.vocab_size) {
        throw bad("prompt", fmt::format("holds token {}, outside the vocabulary of {}", t, model.vocab_size));
      }
    }
    Request r;
    r.options = g;
    r.options.max_new_tokens = max_tokens.value_or(std::max<int64_t>(0, model.max_seq_len - n));
    if (n + r.options.max_new_tokens > model.max_seq_len) {
      throw ApiError(400,
                     fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens "
                                 "({} in the prompt, {} for the completion). Please reduce the prompt or max_tokens.",
                                 model.max_seq_len, n + r.options.max_new_tokens, n, r.options.max_new_tokens),
                     call.chat ? "messages" : "prompt");
    }
    r.prompt = std::move(ids[i]);
    r.prompt_logprobs = prompt_logprobs;
    r.logprobs = call.logprobs.has_value();
    r.top_logprobs = call.logprobs.value_or(0);
    if (!stops.empty()) {
      r.stop = [tok, stops](const std::vector<int64_t>& tokens) {
        const std::string text =
            tok->tokenizer().decode(std::vector<int32_t>(tokens.begin(), tokens.end()), /*skip_special_tokens=*/true);
        for (const std::string& s : stops) {
          if (text.find(s) != std::string::npos) return true;
        }
        return false;
      };
    }
    call.requests.push_back(std::move(r));
  }
  if (call.n == 1) return;
  // n choices per prompt, in OpenAI's order (a prompt's choices together), each with its own sampling seed.
  if (call.stream) throw bad("n", "must be 1 with stream");
  if (call.requests.size() * static_cast<size_t>(call.n) > kMaxPrompts) {
    throw bad("n", fmt::format("asks for more than {} choices in all", kMaxPrompts));
  }
  std::vector<Request> requests;
  std::vector<std::string> prompts;
  for (size_t i = 0; i < call.requests.size(); ++i) {
    for (int64_t j = 0; j < call.n; ++j) {
      Request r = call.requests[i];
      r.options.seed += static_cast<uint64_t>(j);
      requests.push_back(std::move(r));
      if (i < call.prompts.size()) prompts.push_back(call.prompts[i]);
    }
  }
  call.requests = std::move(requests);
  call.prompts = std::move(prompts);
}

std::vector<int64_t> to_ids(const Json& list) {
  std::vector<int64_t> out;
  for (const Json& t : list) {
    if (!t.is_number_integer()) throw bad("prompt", "token lists must hold integers");
    out.push_back(t.get<int64_t>());
  }
  return out;
}

std::vector<int64_t> encode(const data::Tokenizer& tok, const std::string& text, bool special) {
  const std::vector<int32_t> ids = tok.encode(text, special);
  return {ids.begin(), ids.end()};
}

std::string token_text(const data::Tokenizer& tok, int64_t id) {
  return tok.decode({static_cast<int32_t>(id)}, /*skip_special_tokens=*/false);
}

// {token text: logprob} of a position's alternatives (and its own token, as OpenAI adds it).
Ordered top_map(const TokenLogprob& lp, const data::Tokenizer& tok) {
  Ordered top = Ordered::object();
  for (const auto& [id, value] : lp.top) top[token_text(tok, id)] = value;
  const std::string own = token_text(tok, lp.token);
  if (!top.contains(own)) top[own] = lp.logprob;
  return top;
}

Ordered number_or_null(double x) {
  return std::isnan(x) ? Ordered(nullptr) : Ordered(x);
}

}  // namespace

ApiError::ApiError(int status, const std::string& message, std::string param, std::string type)
    : std::runtime_error(message), status_(status), type_(std::move(type)), param_(std::move(param)) {}

nlohmann::ordered_json ApiError::body() const {
  return Ordered{{"error",
                  {{"message", what()},
                   {"type", type_},
                   {"param", param_.empty() ? Ordered(nullptr) : Ordered(param_)},
                   {"code", status_}}}};
}

ApiCall parse_completions(const nlohmann::json& body, const ServedModel& model) {
  const Fields f(body, with(kSampling, {"prompt", "echo", "best_of", "suffix"}));
  ApiCall call;
  models::GenerationOptions g;
  read_common(f, model, call, g);
  if (auto best = f.integer("best_of", 1, 1); best && *best != 1) throw bad("best_of", "must be 1");
  if (const Json* s = f.get("suffix"); s && !(s->is_string() && s->get<std::string>().empty())) {
    throw bad("suffix", "is not supported");
  }
  call.echo = f.boolean("echo").value_or(false);
  call.logprobs = f.integer("logprobs", 0, kMaxLogprobs);
  const std::optional<int64_t> max_tokens = f.integer("max_tokens", 0, 1LL << 30).value_or(16);
  if (*max_tokens == 0 && !call.echo) throw bad("max_tokens", "must be at least 1 (or 0 with echo)");
  if (call.stream && call.echo) throw bad("echo", "cannot be combined with stream");
  const Json* p = f.get("prompt");
  if (!p) throw bad("prompt", "is required");
  const data::Tokenizer& tok = model.tokenizer->tokenizer();
  std::vector<std::vector<int64_t>> ids;
  if (p->is_string()) {
    call.prompts.push_back(p->get<std::string>());
    ids.push_back(encode(tok, call.prompts.back(), true));
  } else if (p->is_array() && !p->empty() && p->size() <= kMaxPrompts) {
    if ((*p)[0].is_number_integer()) {
      ids.push_back(to_ids(*p));
    } else {
      for (const Json& x : *p) {
        if (x.is_string()) {
          call.prompts.push_back(x.get<std::string>());
          ids.push_back(encode(tok, call.prompts.back(), true));
        } else if (x.is_array() && !x.empty()) {
          ids.push_back(to_ids(x));
        } else {
          throw bad("prompt", "must be a string, a list of strings, a list of token ids or a list of such lists");
        }
      }
    }
    if (call.prompts.size() != ids.size()) {  // token prompts: their text for echo
      call.prompts.clear();
      for (const auto& r : ids) {
        call.prompts.push_back(tok.decode(std::vector<int32_t>(r.begin(), r.end()), /*skip_special_tokens=*/false));
      }
    }
  } else {
    throw bad("prompt", fmt::format("must be a string, a list of strings, a list of token ids or a list of such lists "
                                    "(1 to {} prompts)",
                                    kMaxPrompts));
  }
  if (call.stream && ids.size() > 1) throw bad("stream", "takes one prompt");
  make_requests(call, std::move(ids), g, max_tokens, model, call.echo && call.logprobs.has_value());
  return call;
}

ApiCall parse_chat(const nlohmann::json& body, const ServedModel& model) {
  const Fields f(body, with(kSampling, {"messages", "max_completion_tokens", "top_logprobs"}));
  ApiCall call;
  call.chat = true;
  models::GenerationOptions g;
  read_common(f, model, call, g);
  const bool logprobs = f.boolean("logprobs").value_or(false);
  const std::optional<int64_t> top = f.integer("top_logprobs", 0, kMaxLogprobs);
  if (top && !logprobs) throw bad("top_logprobs", "needs logprobs: true");
  if (logprobs) call.logprobs = top.value_or(0);
  std::optional<int64_t> max_tokens = f.integer("max_completion_tokens", 1, 1LL << 30);
  if (!max_tokens) max_tokens = f.integer("max_tokens", 1, 1LL << 30);
  const Json* m = f.get("messages");
  if (!m || !m->is_array() || m->empty()) throw bad("messages", "must be a non-empty list of messages");
  Ordered messages = Ordered::array();
  for (size_t i = 0; i < m->size(); ++i) {
    const Json& msg = (*m)[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!msg.is_object() || !msg.contains("role") || !msg["role"].is_string()) {
      throw bad(where, "must be an object with a string 'role'");
    }
    Ordered out{{"role", msg["role"]}};
    for (const auto& [key, value] : msg.items()) {
      if (key == "role") continue;
      if (key == "content") {
        if (value.is_string()) {
          out["content"] = value;
        } else if (value.is_array()) {  // [{"type": "text", "text": ...}, ...]
          std::string text;
          for (const Json& part : value) {
            if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
                !part["text"].is_string()) {
              throw bad(where + ".content", "parts must be {\"type\": \"text\", \"text\": ...} (text only)");
            }
            text += part["text"].get<std::string>();
          }
          out["content"] = text;
        } else if (!value.is_null()) {
          throw bad(where + ".content", "must be a string or a list of text parts");
        }
      } else if (key == "name") {
        if (!value.is_string()) throw bad(where + ".name", "must be a string");
        out["name"] = value;
      } else {
        throw bad(where + "." + key, "is not supported");
      }
    }
    messages.push_back(out);
  }
  std::string text;
  try {
    text = model.tokenizer->apply_chat_template(messages, /*add_generation_prompt=*/true);
  } catch (const Error& e) {
    throw ApiError(400, fmt::format("the chat template failed on these messages: {}", e.message()), "messages");
  }
  call.prompts.push_back(text);
  std::vector<std::vector<int64_t>> ids{encode(model.tokenizer->tokenizer(), text, false)};
  make_requests(call, std::move(ids), g, max_tokens, model, false);
  return call;
}

ChoiceText choice_text(const ApiCall& call, const Result& result, const data::Tokenizer& tokenizer) {
  ChoiceText out;
  out.text = tokenizer.decode(std::vector<int32_t>(result.tokens.begin(), result.tokens.end()),
                              /*skip_special_tokens=*/true);
  out.finish_reason = result.finish_reason;
  size_t cut = std::string::npos;
  for (const std::string& s : call.stop) cut = std::min(cut, out.text.find(s));
  if (cut != std::string::npos) {
    out.text.resize(cut);
    out.finish_reason = "stop";
  }
  return out;
}

nlohmann::ordered_json completion_response(const ApiCall& call, const std::vector<Result>& results,
                                           const ServedModel& model, const std::string& id, int64_t created) {
  const data::Tokenizer& tok = model.tokenizer->tokenizer();
  Ordered choices = Ordered::array();
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    const ChoiceText c = choice_text(call, r, tok);
    if (i % static_cast<size_t>(call.n) == 0) prompt_tokens += static_cast<int64_t>(call.requests[i].prompt.size());
    completion_tokens += static_cast<int64_t>(r.tokens.size());
    Ordered choice{{"index", i}};
    if (call.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      if (call.logprobs) {
        Ordered content = Ordered::array();
        for (const TokenLogprob& lp : r.token_logprobs) {
          Ordered alternatives = Ordered::array();
          for (const auto& [tid, value] : lp.top)
            alternatives.push_back({{"token", token_text(tok, tid)}, {"logprob", value}});
          content.push_back(
              {{"token", token_text(tok, lp.token)}, {"logprob", lp.logprob}, {"top_logprobs", alternatives}});
        }
        choice["logprobs"] = {{"content", content}};
      } else {
        choice["logprobs"] = nullptr;
      }
    } else {
      choice["text"] = call.echo ? call.prompts[i] + c.text : c.text;
      if (call.logprobs) {
        Ordered tokens = Ordered::array(), token_logprobs = Ordered::array(), tops = Ordered::array(),
                offsets = Ordered::array();
        size_t offset = call.echo ? 0 : call.prompts[i].size();
        auto add = [&](const TokenLogprob& lp, bool first) {
          const std::string text = token_text(tok, lp.token);
          tokens.push_back(text);
          token_logprobs.push_back(number_or_null(lp.logprob));
          tops.push_back(first ? Ordered(nullptr) : top_map(lp, tok));
          offsets.push_back(offset);
          offset += text.size();
        };
        if (call.echo) {
          for (size_t t = 0; t < r.prompt_logprobs.size(); ++t) add(r.prompt_logprobs[t], t == 0);
        }
        for (const TokenLogprob& lp : r.token_logprobs) add(lp, false);
        choice["logprobs"] = {
            {"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", tops}, {"text_offset", offsets}};
      } else {
        choice["logprobs"] = nullptr;
      }
    }
    choice["finish_reason"] = c.finish_reason;
    choices.push_back(choice);
  }
  return Ordered{{"id", id},
                 {"object", call.chat ? "chat.completion" : "text_completion"},
                 {"created", created},
                 {"model", model.name},
                 {"choices", choices},
                 {"usage",
                  {{"prompt_tokens", prompt_tokens},
                   {"completion_tokens", completion_tokens},
                   {"total_tokens", prompt_tokens + completion_tokens}}}};
}

nlohmann::ordered_json stream_chunk(const ApiCall& call, size_t index, const std::string& delta,
                                    const std::optional<std::string>& finish_reason, const ServedModel& model,
                                    const std::string& id, int64_t created) {
  Ordered choice{{"index", index}};
  if (call.chat) {
    choice["delta"] = delta.empty() && finish_reason ? Ordered::object() : Ordered{{"content", delta}};
  } else {
    choice["text"] = delta;
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finish_reason ? Ordered(*finish_reason) : Ordered(nullptr);
  return Ordered{{"id", id},
                 {"object", call.chat ? "chat.completion.chunk" : "text_completion"},
                 {"created", created},
                 {"model", model.name},
                 {"choices", Ordered::array({choice})}};
}

nlohmann::ordered_json models_response(const ServedModel& model) {
  return Ordered{{"object", "list"},
                 {"data", Ordered::array({Ordered{{"id", model.name},
                                                  {"object", "model"},
                                                  {"created", model.created},
                                                  {"owned_by", "tessera"},
                                                  {"max_model_len", model.max_seq_len}}})}};
}

}  // namespace tessera::serve
