// Batched KV-cache decoding with greedy and nucleus/top-k sampling.
#include "tessera/models/generate.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "tessera/util/error.h"

namespace tessera::models {
namespace {

// Filters (B, V) logits of top-k, top-p and min-p, as HF's TopK, TopP and MinP warpers do, in that order.
at::Tensor filter_logits(at::Tensor logits, int64_t top_k, double top_p, double min_p) {
  const float kMasked = -std::numeric_limits<float>::infinity();
  if (top_k > 0 && top_k < logits.size(-1)) {
    const at::Tensor kth = std::get<0>(logits.topk(top_k, -1)).narrow(-1, top_k - 1, 1);
    logits = logits.masked_fill(logits < kth, kMasked);
  }
  if (top_p < 1.0) {
    auto [sorted, idx] = logits.sort(-1, /*descending=*/false);
    const at::Tensor cumulative = sorted.softmax(-1).cumsum(-1);
    at::Tensor remove = cumulative <= (1.0 - top_p);
    remove.narrow(-1, remove.size(-1) - 1, 1).fill_(false);  // always keep the most likely token
    logits = logits.masked_fill(remove.scatter(-1, idx, remove), kMasked);
  }
  if (min_p > 0.0) {
    const at::Tensor probs = logits.softmax(-1);
    at::Tensor remove = probs < std::get<0>(probs.max(-1, /*keepdim=*/true)) * min_p;
    remove.scatter_(-1, logits.argmax(-1, /*keepdim=*/true), false);  // always keep the most likely token
    logits = logits.masked_fill(remove, kMasked);
  }
  return logits;
}

bool ends_with(const std::vector<int64_t>& seq, const std::vector<int64_t>& tail) {
  return !tail.empty() && seq.size() >= tail.size() && std::equal(tail.rbegin(), tail.rend(), seq.rbegin());
}

}  // namespace

std::vector<std::vector<int64_t>> generate(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerationOptions& g) {
  if (prompts.empty()) return {};
  check_generation_options(g);
  const bool was_training = model.is_training();
  model.eval();
  at::NoGradGuard no_grad;
  const at::Device device = model.parameters().front().device();
  const int64_t batch = static_cast<int64_t>(prompts.size());
  int64_t longest = 0;
  for (const auto& p : prompts) {
    if (p.empty()) throw ConfigError("generate", "every prompt needs at least one token");
    longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()));
  }
  // Left-pad to a common length; the mask hides the padding and shifts learned positions.
  at::Tensor ids = at::full({batch, longest}, g.pad_token_id, at::kLong);
  at::Tensor mask = at::zeros({batch, longest}, at::kBool);
  bool padded = false;
  for (int64_t b = 0; b < batch; ++b) {
    const auto& p = prompts[static_cast<size_t>(b)];
    const int64_t offset = longest - static_cast<int64_t>(p.size());
    padded = padded || offset > 0;
    for (size_t t = 0; t < p.size(); ++t) ids[b][offset + static_cast<int64_t>(t)] = p[t];
    mask[b].narrow(0, offset, longest - offset).fill_(true);
  }
  ids = ids.to(device);
  // With a repetition penalty: which tokens each sequence holds so far (its prompt without the padding, then what it
  // generates), on the CPU where the logits are processed.
  at::Tensor seen;
  if (g.repetition_penalty != 1.0) {
    seen = at::zeros({batch, model.vocab_size()}, at::kBool);
    for (int64_t b = 0; b < batch; ++b) {
      const auto& p = prompts[static_cast<size_t>(b)];
      for (int64_t t : p) {
        if (t < 0 || t >= seen.size(1)) {
          throw ConfigError("generate", fmt::format("prompt {} holds token {}, outside the model's vocabulary of {}", b,
                                                    t, seen.size(1)));
        }
      }
      seen[b].index_fill_(0, at::tensor(p, at::kLong), true);
    }
  }
  for (const auto& [token, bias] : g.logit_bias) {
    if (token < 0 || token >= model.vocab_size()) {
      throw ConfigError("generate", fmt::format("logit_bias names token {}, outside the model's vocabulary of {}",
                                                token, model.vocab_size()));
    }
  }
  // With a presence or frequency penalty: how often each sequence has generated each token.
  at::Tensor counts;
  if (counts_generated_tokens(g)) counts = at::zeros({batch, model.vocab_size()}, at::kFloat);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(g.seed);
  KVCache cache;
  ForwardOptions fo;
  fo.cache = &cache;
  if (padded) fo.attention_mask = mask.to(device);
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(batch));
  std::vector<bool> done(static_cast<size_t>(batch), false);
  at::Tensor input = ids;
  at::Tensor all_ids = ids, all_mask = mask.to(device);  // the whole sequences so far, for a recomputed cache
  for (int64_t step = 0; step < g.max_new_tokens; ++step) {
    if (cache.length > 0 && model.kv_cache_stale(cache.length, cache.length + input.size(1))) {
      cache = KVCache{};
      input = all_ids;
      if (padded) fo.attention_mask = all_mask;
    }
    const at::Tensor logits = model.forward(input, fo).select(1, -1).to(at::kFloat).cpu();  // (B, V)
    const at::Tensor next = choose_next_tokens(logits, seen, g, gen, counts);
    bool all_done = true;
    for (int64_t b = 0; b < batch; ++b) {
      auto& seq = out[static_cast<size_t>(b)];
      if (done[static_cast<size_t>(b)]) {
        next[b] = g.pad_token_id;
        continue;
      }
      const int64_t token = next[b].item<int64_t>();
      seq.push_back(token);
      if (g.on_token) g.on_token(static_cast<size_t>(b), token);
      bool stop = g.eos_token_id && token == *g.eos_token_id;
      for (const auto& s : g.stop_sequences) stop = stop || ends_with(seq, s);
      done[static_cast<size_t>(b)] = stop;
      all_done = all_done && stop;
    }
    // The tokens just chosen join their sequences for the penalty (a finished sequence's padding too: it is never
    // read).
    if (seen.defined()) seen.scatter_(1, next.view({batch, 1}), true);
    if (counts.defined()) counts.scatter_add_(1, next.view({batch, 1}), at::ones({batch, 1}, at::kFloat));
    if (all_done && !g.fixed_steps) break;
    input = next.view({batch, 1}).to(device);
    all_ids = at::cat({all_ids, input}, 1);
    all_mask = at::cat({all_mask, at::ones({batch, 1}, all_mask.options())}, 1);
    if (fo.attention_mask) fo.attention_mask = at::ones({batch, 1}, at::TensorOptions(at::kBool).device(device));
  }
  model.train(was_training);
  return out;
}

void check_generation_options(const GenerationOptions& g) {
  if (!(g.temperature > 0)) throw ConfigError("generate", "temperature must be positive");
  if (!(g.top_p > 0 && g.top_p <= 1)) throw ConfigError("generate", "top_p must lie in (0, 1]");
  if (!(g.min_p >= 0 && g.min_p <= 1)) throw ConfigError("generate", "min_p must lie in [0, 1]");
  if (!(g.repetition_penalty > 0)) throw ConfigError("generate", "repetition_penalty must be positive");
  if (!(std::abs(g.presence_penalty) <= 2)) throw ConfigError("generate", "presence_penalty must lie in [-2, 2]");
  if (!(std::abs(g.frequency_penalty) <= 2)) throw ConfigError("generate", "frequency_penalty must lie in [-2, 2]");
  for (const auto& [token, bias] : g.logit_bias) {
    if (!(std::abs(bias) <= 100)) {
      throw ConfigError("generate", fmt::format("logit_bias of token {} must lie in [-100, 100]", token));
    }
  }
  if (g.top_k < 0) throw ConfigError("generate", "top_k must not be negative");
  if (g.max_new_tokens < 0) throw ConfigError("generate", "max_new_tokens must not be negative");
}

bool counts_generated_tokens(const GenerationOptions& g) {
  return g.presence_penalty != 0 || g.frequency_penalty != 0;
}

at::Tensor choose_next_tokens(at::Tensor logits, const at::Tensor& seen, const GenerationOptions& g,
                              at::Generator& generator, const at::Tensor& counts) {
  if (!g.logit_bias.empty()) {
    std::vector<int64_t> tokens;
    std::vector<float> biases;
    for (const auto& [token, bias] : g.logit_bias) {
      tokens.push_back(token);
      biases.push_back(static_cast<float>(bias));
    }
    logits = logits.index_add(1, at::tensor(tokens, at::kLong),
                              at::tensor(biases, at::kFloat).expand({logits.size(0), -1}).to(logits.scalar_type()));
  }
  if (seen.defined() && g.repetition_penalty != 1.0) {
    const at::Tensor penalized = at::where(logits < 0, logits * g.repetition_penalty, logits / g.repetition_penalty);
    logits = at::where(seen, penalized, logits);  // the protocol's logits are (B, S, vocab_size())
  }
  if (counts.defined() && counts_generated_tokens(g)) {
    logits = logits - counts * g.frequency_penalty - (counts > 0).to(logits.scalar_type()) * g.presence_penalty;
  }
  if (!g.do_sample) return logits.argmax(-1);
  const at::Tensor filtered = filter_logits(logits / g.temperature, g.top_k, g.top_p, g.min_p);
  return at::multinomial(filtered.softmax(-1), 1, /*replacement=*/false, generator).squeeze(1);
}

KVCache concat_cache_rows(const std::vector<KVCache*>& caches) {
  KVCache out;
  if (caches.empty()) return out;
  int64_t length = 0;
  for (const KVCache* c : caches) length = std::max(length, c->length);
  out.length = length;
  const size_t n_layers = caches.front()->layers.size();
  auto rows_of = [](const KVCache& c) -> int64_t {
    if (c.attention_mask.defined()) return c.attention_mask.size(0);
    for (const LayerCache& l : c.layers) {
      if (l.key.defined()) return l.key.size(0);
      if (l.recurrent_state.defined()) return l.recurrent_state.size(0);
    }
    throw Error("generate", "a KV cache with no rows to join");
  };
  std::vector<at::Tensor> masks;
  for (const KVCache* c : caches) {
    if (c->layers.size() != n_layers) throw Error("generate", "joining KV caches of different models");
    const int64_t rows = rows_of(*c), pad = length - c->length;
    at::Device device = at::kCPU;
    for (const LayerCache& l : c->layers) {
      if (l.key.defined()) device = l.key.device();
    }
    at::Tensor mask = c->attention_mask.defined()
                          ? c->attention_mask.to(at::kBool)
                          : at::ones({rows, c->length}, at::TensorOptions(at::kBool).device(device));
    if (pad > 0) mask = at::cat({at::zeros({rows, pad}, mask.options()), mask}, 1);
    masks.push_back(mask);
  }
  out.attention_mask = at::cat(masks, 0);
  out.layers.resize(n_layers);
  for (size_t i = 0; i < n_layers; ++i) {
    std::vector<at::Tensor> keys, values, convs, states;
    for (const KVCache* c : caches) {
      const LayerCache& l = c->layers[i];
      const int64_t pad = length - c->length;
      if (l.key.defined()) {
        auto left_pad = [pad](const at::Tensor& t) {
          if (pad == 0) return t;
          std::vector<int64_t> shape = t.sizes().vec();
          shape[2] = pad;
          return at::cat({at::zeros(shape, t.options()), t}, 2);
        };
        keys.push_back(left_pad(l.key));
        values.push_back(left_pad(l.value));
      }
      if (l.conv_state.defined()) convs.push_back(l.conv_state);
      if (l.recurrent_state.defined()) states.push_back(l.recurrent_state);
    }
    auto join = [&](std::vector<at::Tensor>& parts, at::Tensor& into) {
      if (parts.empty()) return;
      if (parts.size() != caches.size()) throw Error("generate", "joining KV caches whose layers differ");
      into = at::cat(parts, 0);
    };
    join(keys, out.layers[i].key);
    join(values, out.layers[i].value);
    join(convs, out.layers[i].conv_state);
    join(states, out.layers[i].recurrent_state);
  }
  return out;
}

void select_cache_rows(KVCache& cache, const at::Tensor& rows) {
  auto pick = [&](at::Tensor& t) {
    if (t.defined()) t = t.index_select(0, rows.to(t.device()));
  };
  pick(cache.attention_mask);
  for (LayerCache& l : cache.layers) {
    pick(l.key);
    pick(l.value);
    pick(l.conv_state);
    pick(l.recurrent_state);
  }
  if (!cache.attention_mask.defined() || cache.attention_mask.size(0) == 0) return;
  // The first position any kept row uses: everything before it is padding in every row.
  const at::Tensor used = cache.attention_mask.any(0).cpu();
  const at::Tensor first = used.nonzero();
  const int64_t drop = first.numel() == 0 ? cache.length : first[0][0].item<int64_t>();
  if (drop == 0) return;
  const int64_t keep = cache.length - drop;
  cache.attention_mask = cache.attention_mask.narrow(1, drop, keep);
  for (LayerCache& l : cache.layers) {
    if (l.key.defined()) {
      l.key = l.key.narrow(2, drop, keep);
      l.value = l.value.narrow(2, drop, keep);
    }
  }
  cache.length = keep;
}

}  // namespace tessera::models
