// Few-shot example selection exactly as LLM Foundry's `get_fewshot_sample_idxs` draws it in Python: a Mersenne Twister
// seeded like `random.Random(seed)`, `rng.sample` / `rng.choice` (CPython 3.11 algorithms) and the iteration order
// of the Python `set` holding the indices (CPython's open-addressing table, emulated).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace tessera::eval {

// Python's `random.Random(seed)` for a non-negative integer seed below 2^64. Not thread-safe.
class PythonRandom {
 public:
  explicit PythonRandom(uint64_t seed);
  uint32_t next_uint32();
  // random.getrandbits(k) for 0 <= k <= 32.
  uint32_t getrandbits(int k);
  // random._randbelow(n) (getrandbits rejection sampling), n >= 1.
  int64_t randbelow(int64_t n);
  // random.sample(range(n), k), 0 <= k <= n.
  std::vector<int64_t> sample(int64_t n, int64_t k);
  // random.choice(range(n)), n >= 1.
  int64_t choice(int64_t n) { return randbelow(n); }

 private:
  std::array<uint32_t, 624> mt_{};
  int index_ = 624;
};

// The indices of the few-shot examples of example `example_idx` in a dataset of `dataset_size` examples, in the
// order LLM Foundry concatenates them (the iteration order of its Python set). Consumes `rng` as Python does.
std::vector<int64_t> fewshot_sample_idxs(int64_t dataset_size, int64_t num_fewshot, int64_t example_idx,
                                         PythonRandom& rng);

}  // namespace tessera::eval
