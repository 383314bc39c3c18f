// Autoregressive decoding from any causal LM (the model protocol) with a KV cache: greedy or sampled (temperature,
// top-k, top-p, min-p), a repetition penalty, stop sequences, end-of-sequence token, max new tokens, and a callback
// per new token (streaming). Used by ICL generation tasks and by users
// trying a model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "tessera/models/causal_lm.h"

namespace tessera::models {

struct GenerationOptions {
  int64_t max_new_tokens = 20;
  bool do_sample = false;    // false: greedy (argmax; the first index on ties)
  double temperature = 1.0;  // > 0; logits are divided by it before sampling
  int64_t top_k = 0;         // keep the k most likely tokens; 0 = all
  double top_p = 1.0;        // keep the smallest set whose probability reaches p; 1 = all
  // Keep the tokens at least min_p times as likely as the likeliest (HF's MinPLogitsWarper); 0 = all.
  double min_p = 0.0;
  // HF's RepetitionPenaltyLogitsProcessor, greedy or sampled: the logit of every token already in the sequence (prompt
  // included) is divided by it where positive and multiplied by it where negative; 1 = off, > 1 discourages repeats.
  double repetition_penalty = 1.0;
  // OpenAI's (and vLLM's) penalties over the tokens generated so far (the prompt not counted), after the repetition
  // penalty: a token's logit loses frequency_penalty times its count and presence_penalty once it has appeared.
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  // OpenAI's logit_bias (transformers' sequence_bias for single tokens): added to a token's logit before anything
  // else; each token must lie in the vocabulary.
  std::vector<std::pair<int64_t, double>> logit_bias;
  std::optional<int64_t> eos_token_id;               // stop a sequence after emitting it
  std::vector<std::vector<int64_t>> stop_sequences;  // stop a sequence once its output ends with one of these
  int64_t pad_token_id = 0;                          // fills prompts on the left to a common length (masked out)
  uint64_t seed = 0;                                 // sampling generator seed
  // Run all max_new_tokens forward passes even after every sequence has stopped (a stopped sequence gets no more
  // tokens, so the outputs are the same). The ranks of a sharded model must all run the same number of passes.
  bool fixed_steps = false;
  // Called with (prompt index, token) for each token as it is generated, in order (streaming output).
  std::function<void(size_t, int64_t)> on_token;
};

// Generates a continuation for each prompt (a batch, left-padded internally). Sampling applies HF's warpers in HF's
// order: temperature, top-k, top-p, min-p; the repetition penalty comes before them. Returns only the new tokens of
// each sequence, including the end-of-sequence token or stop sequence that ended it. Runs in eval mode without
// autograd; the model's training mode is restored afterwards.
std::vector<std::vector<int64_t>> generate(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerationOptions& options);

// ---- The pieces generate() is made of, for decoders that schedule rows themselves (serve::Engine's continuous
// batching).

// Throws ConfigError ("generate: ...") when an option is out of its range (temperature, top_p, min_p, penalty).
void check_generation_options(const GenerationOptions& options);

// One decoding step's next token for each row of `logits` (B, V) (float, on the CPU): the logit bias, the repetition
// penalty over `seen` (B, V) bool when it is defined, the presence and frequency penalties over `counts` (B, V) float
// (each token's count among the generated ones) when it is defined, then the argmax, or with do_sample the warpers
// and a draw from `generator`. Returns (B) int64.
at::Tensor choose_next_tokens(at::Tensor logits, const at::Tensor& seen, const GenerationOptions& options,
                              at::Generator& generator, const at::Tensor& counts = {});
// Whether choose_next_tokens needs `counts` (a presence or frequency penalty is set).
bool counts_generated_tokens(const GenerationOptions& options);

// Rows of several caches in one, in order: each cache (built for left-padded rows, its attention_mask defined or
// all real) is padded on the left to the longest, its missing mask filled in as real tokens. Each row keeps its
// tokens and positions (models compute positions from the mask), so decoding continues as if the rows had been
// batched from the start. Linear-attention states are joined as they are.
KVCache concat_cache_rows(const std::vector<KVCache*>& caches);

// Keeps the rows `rows` (int64 indices) of `cache`, and drops the leading positions no kept row uses.
void select_cache_rows(KVCache& cache, const at::Tensor& rows);

}  // namespace tessera::models
