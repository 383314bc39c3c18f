// Python-compatible random draws and set ordering for few-shot selection (see fewshot.h).
#include "tessera/eval/fewshot.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

namespace tessera::eval {

namespace {

constexpr int kN = 624;
constexpr int kM = 397;

// CPython's set of small non-negative ints: hash(i) == i, table of 8 slots growing 4x past 60% fill, 9 linear
// probes then perturbed probing; a removed key leaves a dummy that a later insertion may reuse.
class PySetEmulation {
 public:
  void add(int64_t key) {
    size_t mask = table_.size() - 1;
    size_t i = static_cast<size_t>(key) & mask;
    size_t perturb = static_cast<size_t>(key);
    int64_t freeslot = -1;
    while (true) {
      size_t e = i;
      int probes = (i + kLinearProbes <= mask) ? kLinearProbes : 0;
      while (true) {
        if (table_[e] == kEmpty) {
          if (freeslot >= 0) {
            table_[static_cast<size_t>(freeslot)] = key;
            ++used_;
            return;
          }
          table_[e] = key;
          ++fill_;
          ++used_;
          if (fill_ * 5 >= mask * 3) resize(used_ * 4);
          return;
        }
        if (table_[e] == key) return;
        if (table_[e] == kDummy && freeslot < 0) freeslot = static_cast<int64_t>(e);
        ++e;
        if (probes-- == 0) break;
      }
      perturb >>= 5;
      i = (i * 5 + 1 + perturb) & mask;
    }
  }
  bool contains(int64_t key) const { return std::find(table_.begin(), table_.end(), key) != table_.end(); }
  void remove(int64_t key) {
    auto it = std::find(table_.begin(), table_.end(), key);
    if (it == table_.end()) return;
    *it = kDummy;
    --used_;
  }
  size_t size() const { return used_; }
  std::vector<int64_t> items() const {
    std::vector<int64_t> out;
    for (int64_t k : table_) {
      if (k >= 0) out.push_back(k);
    }
    return out;
  }

 private:
  static constexpr int64_t kEmpty = -1;
  static constexpr int64_t kDummy = -2;
  static constexpr size_t kLinearProbes = 9;

  void resize(size_t minused) {
    size_t n = 8;
    while (n <= minused) n <<= 1;
    std::vector<int64_t> old = std::move(table_);
    table_.assign(n, kEmpty);
    for (int64_t k : old) {
      if (k >= 0) insert_clean(k);
    }
    fill_ = used_;
  }
  void insert_clean(int64_t key) {
    size_t mask = table_.size() - 1;
    size_t i = static_cast<size_t>(key) & mask;
    size_t perturb = static_cast<size_t>(key);
    while (true) {
      if (table_[i] == kEmpty) {
        table_[i] = key;
        return;
      }
      if (i + kLinearProbes <= mask) {
        for (size_t j = 1; j <= kLinearProbes; ++j) {
          if (table_[i + j] == kEmpty) {
            table_[i + j] = key;
            return;
          }
        }
      }
      perturb >>= 5;
      i = (i * 5 + 1 + perturb) & mask;
    }
  }

  std::vector<int64_t> table_ = std::vector<int64_t>(8, kEmpty);
  size_t fill_ = 0;
  size_t used_ = 0;
};

}  // namespace

PythonRandom::PythonRandom(uint64_t seed) {
  // random.seed(int): init_by_array over the 32-bit words of |seed|, least significant first.
  std::vector<uint32_t> key;
  do {
    key.push_back(static_cast<uint32_t>(seed & 0xffffffffu));
    seed >>= 32;
  } while (seed != 0);
  mt_[0] = 19650218u;
  for (int i = 1; i < kN; ++i) {
    mt_[i] = 1812433253u * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + static_cast<uint32_t>(i);
  }
  int i = 1;
  size_t j = 0;
  for (size_t k = std::max<size_t>(kN, key.size()); k > 0; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525u)) + key[j] + static_cast<uint32_t>(j);
    ++i;
    ++j;
    if (i >= kN) {
      mt_[0] = mt_[kN - 1];
      i = 1;
    }
    if (j >= key.size()) j = 0;
  }
  for (int k = kN - 1; k > 0; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941u)) - static_cast<uint32_t>(i);
    ++i;
    if (i >= kN) {
      mt_[0] = mt_[kN - 1];
      i = 1;
    }
  }
  mt_[0] = 0x80000000u;
  index_ = kN;
}

uint32_t PythonRandom::next_uint32() {
  if (index_ >= kN) {
    for (int k = 0; k < kN; ++k) {
      uint32_t y = (mt_[k] & 0x80000000u) | (mt_[(k + 1) % kN] & 0x7fffffffu);
      mt_[k] = mt_[(k + kM) % kN] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    }
    index_ = 0;
  }
  uint32_t y = mt_[index_++];
  y ^= (y >> 11);
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= (y >> 18);
  return y;
}

uint32_t PythonRandom::getrandbits(int k) {
  if (k == 0) return 0;
  return next_uint32() >> (32 - k);
}

int64_t PythonRandom::randbelow(int64_t n) {
  int bits = 0;
  while ((int64_t{1} << bits) <= n) ++bits;  // n.bit_length()
  int64_t r = getrandbits(bits);
  while (r >= n) r = getrandbits(bits);
  return r;
}

std::vector<int64_t> PythonRandom::sample(int64_t n, int64_t k) {
  std::vector<int64_t> result(static_cast<size_t>(k));
  int64_t setsize = 21;
  if (k > 5)
    setsize += static_cast<int64_t>(std::pow(4.0, std::ceil(std::log(static_cast<double>(k * 3)) / std::log(4.0))));
  if (n <= setsize) {
    std::vector<int64_t> pool(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pool[static_cast<size_t>(i)] = i;
    for (int64_t i = 0; i < k; ++i) {
      int64_t j = randbelow(n - i);
      result[static_cast<size_t>(i)] = pool[static_cast<size_t>(j)];
      pool[static_cast<size_t>(j)] = pool[static_cast<size_t>(n - i - 1)];
    }
  } else {
    std::unordered_set<int64_t> selected;
    for (int64_t i = 0; i < k; ++i) {
      int64_t j = randbelow(n);
      while (selected.count(j) != 0) j = randbelow(n);
      selected.insert(j);
      result[static_cast<size_t>(i)] = j;
    }
  }
  return result;
}

std::vector<int64_t> fewshot_sample_idxs(int64_t dataset_size, int64_t num_fewshot, int64_t example_idx,
                                         PythonRandom& rng) {
  const int64_t k = std::min(dataset_size - 1, num_fewshot);
  PySetEmulation idxs;
  for (int64_t i : rng.sample(dataset_size, std::max<int64_t>(k, 0))) idxs.add(i);
  if (idxs.contains(example_idx)) {
    idxs.remove(example_idx);
    if (static_cast<int64_t>(idxs.size()) >= dataset_size - 1) return idxs.items();
    int64_t replacement = rng.choice(dataset_size);
    while (idxs.contains(replacement) || replacement == example_idx) replacement = rng.choice(dataset_size);
    idxs.add(replacement);
  }
  return idxs.items();
}

}  // namespace tessera::eval
