// Autoregressive decoding from any causal LM (the model protocol) with a KV cache: greedy or sampled (temperature,
// top-k, top-p), stop sequences, end-of-sequence token, max new tokens. Used by ICL generation tasks and by users
// trying a model.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "tessera/models/causal_lm.h"

namespace tessera::models {

struct GenerationOptions {
  int64_t max_new_tokens = 20;
  bool do_sample = false;                            // false: greedy (argmax; the first index on ties)
  double temperature = 1.0;                          // > 0; logits are divided by it before sampling
  int64_t top_k = 0;                                 // keep the k most likely tokens; 0 = all
  double top_p = 1.0;                                // keep the smallest set whose probability reaches p; 1 = all
  std::optional<int64_t> eos_token_id;               // stop a sequence after emitting it
  std::vector<std::vector<int64_t>> stop_sequences;  // stop a sequence once its output ends with one of these
  int64_t pad_token_id = 0;                          // fills prompts on the left to a common length (masked out)
  uint64_t seed = 0;                                 // sampling generator seed
  // Run all max_new_tokens forward passes even after every sequence has stopped (a stopped sequence gets no more
  // tokens, so the outputs are the same). The ranks of a sharded model must all run the same number of passes.
  bool fixed_steps = false;
};

// Generates a continuation for each prompt (a batch, left-padded internally). Returns only the new tokens of each
// sequence, including the end-of-sequence token or stop sequence that ended it. Runs in eval mode without autograd;
// the model's training mode is restored afterwards.
std::vector<std::vector<int64_t>> generate(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerationOptions& options);

}  // namespace tessera::models
