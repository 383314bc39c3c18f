// numpy's default random generator (np.random.default_rng(seed): SeedSequence -> PCG64), reproduced draw for draw,
// so that Tessera shuffles data exactly as mosaicml-streaming does for the same seed. Covers what Streaming uses:
// shuffle / permutation, integers (Lemire), uniform, choice without replacement (Floyd or tail shuffle).
// Not thread-safe (one generator per thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace tessera::util {

__extension__ typedef unsigned __int128 uint128;  // PCG64's 128-bit state (GCC/Clang extension)

class NumpyGenerator {
 public:
  // np.random.default_rng(seed) for a non-negative integer seed.
  explicit NumpyGenerator(uint64_t seed);

  uint64_t next_uint64();
  uint32_t next_uint32();  // low half of a 64-bit draw first, the high half on the next call
  double next_double();    // (next_uint64 >> 11) * 2^-53; does not touch the 32-bit buffer

  // The PCG64 state as numpy reports it (for tests): {state, inc} as (high, low) 64-bit halves.
  std::pair<std::pair<uint64_t, uint64_t>, std::pair<uint64_t, uint64_t>> state() const;

  // Uniform in [0, max] by masked rejection (numpy's random_interval), as shuffle uses.
  uint64_t random_interval(uint64_t max);
  // Uniform in [off, off + rng] by Lemire's method (numpy's random_bounded_uint64, unmasked).
  uint64_t bounded(uint64_t off, uint64_t rng);

  // Generator.shuffle / permutation (Fisher-Yates from the end).
  template <class T>
  void shuffle(T* data, std::size_t n) {
    for (std::size_t i = n; i-- > 1;) std::swap(data[i], data[random_interval(i)]);
  }
  template <class T>
  void shuffle(std::vector<T>& v) {
    shuffle(v.data(), v.size());
  }
  std::vector<int64_t> permutation(int64_t n);
  // Generator.integers(lo, hi): hi exclusive.
  int64_t integers(int64_t lo, int64_t hi);
  // Generator.uniform(lo, hi).
  double uniform(double lo, double hi) { return lo + (hi - lo) * next_double(); }
  // Generator.choice(n, k, replace=False) (shuffled result).
  std::vector<int64_t> choice_without_replacement(int64_t n, int64_t k);

 private:
  uint128 state_ = 0, inc_ = 0;
  bool has_uint32_ = false;
  uint32_t uint32_ = 0;
};

}  // namespace tessera::util
