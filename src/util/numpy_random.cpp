// numpy SeedSequence + PCG64 (XSL-RR 128/64) and the Generator methods Streaming uses (numpy/random/_generator.pyx,
// src/distributions/distributions.c, bit_generator.pyx).
#include "tessera/util/numpy_random.h"

#include <algorithm>
#include <array>
#include <stdexcept>

namespace tessera::util {
namespace {

using u128 = uint128;
constexpr u128 kMult = (u128{2549297995355413924ULL} << 64) | 4865540595714422341ULL;

// numpy.random.SeedSequence(seed).generate_state(n_words, uint32), pool size 4.
std::vector<uint32_t> seed_sequence_state(uint64_t seed, size_t n_words) {
  constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875, kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
  constexpr uint32_t kMixL = 0xca01f9dd, kMixR = 0x4973f715;
  std::vector<uint32_t> entropy;
  do {
    entropy.push_back(static_cast<uint32_t>(seed & 0xffffffffu));
    seed >>= 32;
  } while (seed != 0);
  uint32_t hash_const = kInitA;
  auto hashmix = [&hash_const](uint32_t value) {
    value ^= hash_const;
    hash_const *= kMultA;
    value *= hash_const;
    value ^= value >> 16;
    return value;
  };
  auto mix = [](uint32_t x, uint32_t y) {
    uint32_t r = kMixL * x - kMixR * y;
    r ^= r >> 16;
    return r;
  };
  std::array<uint32_t, 4> pool{};
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = hashmix(i < entropy.size() ? entropy[i] : 0);
  for (size_t src = 0; src < pool.size(); ++src) {
    for (size_t dst = 0; dst < pool.size(); ++dst) {
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src]));
    }
  }
  for (size_t src = pool.size(); src < entropy.size(); ++src) {
    for (size_t dst = 0; dst < pool.size(); ++dst) pool[dst] = mix(pool[dst], hashmix(entropy[src]));
  }
  std::vector<uint32_t> state(n_words);
  uint32_t hc = kInitB;
  for (size_t i = 0; i < n_words; ++i) {
    uint32_t v = pool[i % pool.size()];
    v ^= hc;
    hc *= kMultB;
    v *= hc;
    v ^= v >> 16;
    state[i] = v;
  }
  return state;
}

uint64_t gen_mask(uint64_t max) {
  uint64_t mask = max;
  mask |= mask >> 1, mask |= mask >> 2, mask |= mask >> 4, mask |= mask >> 8, mask |= mask >> 16, mask |= mask >> 32;
  return mask;
}

}  // namespace

NumpyGenerator::NumpyGenerator(uint64_t seed) {
  const std::vector<uint32_t> w = seed_sequence_state(seed, 8);  // 4 uint64 words, little-endian pairs
  uint64_t v[4];
  for (int i = 0; i < 4; ++i) v[i] = (uint64_t{w[2 * i + 1]} << 32) | w[2 * i];
  const u128 initstate = (u128{v[0]} << 64) | v[1];
  const u128 initseq = (u128{v[2]} << 64) | v[3];
  state_ = 0;
  inc_ = (initseq << 1) | 1;
  state_ = state_ * kMult + inc_;
  state_ += initstate;
  state_ = state_ * kMult + inc_;
}

std::pair<std::pair<uint64_t, uint64_t>, std::pair<uint64_t, uint64_t>> NumpyGenerator::state() const {
  return {{static_cast<uint64_t>(state_ >> 64), static_cast<uint64_t>(state_)},
          {static_cast<uint64_t>(inc_ >> 64), static_cast<uint64_t>(inc_)}};
}

uint64_t NumpyGenerator::next_uint64() {
  state_ = state_ * kMult + inc_;
  const uint64_t x = static_cast<uint64_t>(state_ >> 64) ^ static_cast<uint64_t>(state_);
  const unsigned rot = static_cast<unsigned>(state_ >> 122);
  return (x >> rot) | (x << ((64 - rot) & 63));
}

uint32_t NumpyGenerator::next_uint32() {
  if (has_uint32_) {
    has_uint32_ = false;
    return uint32_;
  }
  const uint64_t next = next_uint64();
  has_uint32_ = true;
  uint32_ = static_cast<uint32_t>(next >> 32);
  return static_cast<uint32_t>(next & 0xffffffffu);
}

double NumpyGenerator::next_double() {
  return static_cast<double>(next_uint64() >> 11) * (1.0 / 9007199254740992.0);
}

uint64_t NumpyGenerator::random_interval(uint64_t max) {
  if (max == 0) return 0;
  const uint64_t mask = gen_mask(max);
  uint64_t value;
  if (max <= 0xffffffffu) {
    while ((value = (next_uint32() & mask)) > max) {
    }
  } else {
    while ((value = (next_uint64() & mask)) > max) {
    }
  }
  return value;
}

uint64_t NumpyGenerator::bounded(uint64_t off, uint64_t rng) {
  if (rng == 0) return off;
  if (rng <= 0xffffffffu) {
    if (rng == 0xffffffffu) return off + next_uint32();
    const uint32_t excl = static_cast<uint32_t>(rng) + 1;
    uint64_t m = uint64_t{next_uint32()} * excl;
    uint32_t leftover = static_cast<uint32_t>(m);
    if (leftover < excl) {
      const uint32_t threshold = (0xffffffffu - static_cast<uint32_t>(rng)) % excl;
      while (leftover < threshold) {
        m = uint64_t{next_uint32()} * excl;
        leftover = static_cast<uint32_t>(m);
      }
    }
    return off + (m >> 32);
  }
  if (rng == ~uint64_t{0}) return off + next_uint64();
  const uint64_t excl = rng + 1;
  u128 m = u128{next_uint64()} * excl;
  uint64_t leftover = static_cast<uint64_t>(m);
  if (leftover < excl) {
    const uint64_t threshold = (~uint64_t{0} - rng) % excl;
    while (leftover < threshold) {
      m = u128{next_uint64()} * excl;
      leftover = static_cast<uint64_t>(m);
    }
  }
  return off + static_cast<uint64_t>(m >> 64);
}

std::vector<int64_t> NumpyGenerator::permutation(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  shuffle(v);
  return v;
}

int64_t NumpyGenerator::integers(int64_t lo, int64_t hi) {
  if (hi <= lo) throw std::invalid_argument("integers: high must be greater than low");
  return lo + static_cast<int64_t>(bounded(0, static_cast<uint64_t>(hi - lo - 1)));
}

std::vector<int64_t> NumpyGenerator::choice_without_replacement(int64_t n, int64_t k) {
  if (k > n || k < 0) throw std::invalid_argument("choice: cannot take a larger sample than the population");
  std::vector<int64_t> idx;
  auto shuffle_int = [this](int64_t* data, int64_t size, int64_t first) {
    for (int64_t i = size - 1; i >= first; --i) {
      const auto j = static_cast<int64_t>(bounded(0, static_cast<uint64_t>(i)));
      std::swap(data[i], data[j]);
    }
  };
  if (n > 10000 && k > n / 50) {  // tail shuffle
    std::vector<int64_t> all(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) all[static_cast<size_t>(i)] = i;
    shuffle_int(all.data(), n, std::max<int64_t>(n - k, 1));
    return {all.end() - k, all.end()};
  }
  // Floyd's algorithm; membership only, then a shuffle of the result.
  idx.resize(static_cast<size_t>(k));
  std::vector<bool> taken(static_cast<size_t>(n), false);
  for (int64_t j = n - k; j < n; ++j) {
    const auto v = static_cast<int64_t>(bounded(0, static_cast<uint64_t>(j)));
    const int64_t pick = taken[static_cast<size_t>(v)] ? j : v;
    taken[static_cast<size_t>(pick)] = true;
    idx[static_cast<size_t>(j - n + k)] = pick;
  }
  shuffle_int(idx.data(), k, 1);
  return idx;
}

}  // namespace tessera::util
