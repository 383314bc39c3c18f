// BPE merges for one word, step for step as Hugging Face's Word::merge_all (lowest rank first, then leftmost).
#include "bpe.h"

#include <algorithm>

namespace tessera::data::detail {
namespace {

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  bool removed;
};

struct Candidate {
  int32_t rank;
  int32_t pos;
  int32_t id;
  // std::push_heap keeps the largest on top: "larger" = lower rank, then lower position.
  bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

void PairMap::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  keys_.assign(cap, kEmpty);
  values_.assign(cap, Value{0, 0});
  mask_ = cap - 1;
  shift_ = 64 - __builtin_ctzll(cap);
  size_ = 0;
}

void PairMap::grow() {
  std::vector<uint64_t> keys = std::move(keys_);
  std::vector<Value> values = std::move(values_);
  reserve(std::max<size_t>(keys.size(), 8));
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i] != kEmpty)
      put(static_cast<int32_t>(keys[i] >> 32), static_cast<int32_t>(keys[i] & 0xFFFFFFFF), values[i]);
  }
}

void PairMap::put(int32_t a, int32_t b, Value v) {
  if (keys_.empty() || (size_ + 1) * 2 > keys_.size()) grow();
  const uint64_t key = pack(a, b);
  for (size_t i = slot(key);; i = (i + 1) & mask_) {
    if (keys_[i] == key) {
      values_[i] = v;
      return;
    }
    if (keys_[i] == kEmpty) {
      keys_[i] = key;
      values_[i] = v;
      ++size_;
      return;
    }
  }
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (ignore_merges) {
    const StringMap<int32_t>& whole = byte_level ? byte_vocab : vocab;
    if (auto it = whole.find(word); it != whole.end()) {
      out.push_back(it->second);
      return;
    }
  }
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> heap;
  symbols.clear();
  heap.clear();
  bool pending_unk = false;  // Hugging Face's merge_word: an unknown symbol is added when the next known one comes
  const auto push = [&](int32_t id) {
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, n + 1, false});
  };
  const auto flush_unk = [&] {
    if (pending_unk) push(unk_id);
    pending_unk = false;
  };
  const auto unknown = [&] {
    if (unk_id < 0) return;  // no unknown token: the symbol is dropped
    if (pending_unk && !fuse_unk) push(unk_id);
    pending_unk = true;
  };
  const auto known = [&](int32_t id) {
    flush_unk();
    push(id);
  };
  if (byte_level) {
    for (char c : word) {
      const int32_t id = byte_ids[static_cast<uint8_t>(c)];
      id >= 0 ? known(id) : unknown();
    }
  } else {
    for (size_t i = 0; i < word.size();) {
      size_t len = 1;
      const auto lead = static_cast<uint8_t>(word[i]);
      if (lead >= 0xF0) {
        len = 4;
      } else if (lead >= 0xE0) {
        len = 3;
      } else if (lead >= 0xC0) {
        len = 2;
      }
      len = std::min(len, word.size() - i);
      const std::string_view ch = word.substr(i, len);
      i += len;
      if (auto it = vocab.find(ch); it != vocab.end()) {
        known(it->second);
        continue;
      }
      if (byte_fallback &&
          std::all_of(ch.begin(), ch.end(), [&](char b) { return fallback_ids[static_cast<uint8_t>(b)] >= 0; })) {
        // Hugging Face adds the byte tokens without flushing a pending unknown token first.
        for (char b : ch) push(fallback_ids[static_cast<uint8_t>(b)]);
        continue;
      }
      unknown();
    }
  }
  flush_unk();
  if (symbols.empty()) return;
  symbols.back().next = -1;
  const auto n = static_cast<int32_t>(symbols.size());
  for (int32_t i = 0; i + 1 < n; ++i) {
    if (const PairMap::Value* m = merges.find(symbols[i].id, symbols[i + 1].id)) heap.push_back({m->rank, i, m->id});
  }
  std::make_heap(heap.begin(), heap.end());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[top.pos];
    if (left.removed || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    // A stale entry: the pair at this position changed since it was queued.
    const PairMap::Value* m = merges.find(left.id, right.id);
    if (m == nullptr || m->id != top.id) continue;
    left.id = top.id;
    right.removed = true;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const PairMap::Value* p = merges.find(symbols[left.prev].id, left.id)) {
        heap.push_back({p->rank, left.prev, p->id});
        std::push_heap(heap.begin(), heap.end());
      }
    }
    if (left.next >= 0) {
      if (const PairMap::Value* p = merges.find(left.id, symbols[left.next].id)) {
        heap.push_back({p->rank, top.pos, p->id});
        std::push_heap(heap.begin(), heap.end());
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (!s.removed) out.push_back(s.id);
  }
}

}  // namespace tessera::data::detail
