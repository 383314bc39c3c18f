// The byte-level BPE model: vocabulary, merge ranks, and Hugging Face's merge procedure for one word.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tessera::data::detail {

// Hash for heterogeneous std::unordered_map<std::string, ...> lookups by std::string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// Open-addressing map (left id, right id) -> (rank, merged id); read-only after build.
class PairMap {
 public:
  struct Value {
    int32_t rank;
    int32_t id;
  };
  void reserve(size_t n);
  // Inserts or overwrites (a later merge of the same pair wins, as in Hugging Face's HashMap collect).
  void put(int32_t a, int32_t b, Value v);
  const Value* find(int32_t a, int32_t b) const {
    if (keys_.empty()) return nullptr;
    const uint64_t key = pack(a, b);
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return &values_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t pack(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  size_t slot(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ULL) >> shift_) & mask_; }
  void grow();
  std::vector<uint64_t> keys_;
  std::vector<Value> values_;
  size_t mask_ = 0, size_ = 0;
  int shift_ = 64;
};

struct BpeModel {
  StringMap<int32_t> vocab;  // token (as written in tokenizer.json) -> id
  // Byte-level tokenizers (a ByteLevel pre-tokenizer): words are raw bytes, each byte one initial symbol.
  bool byte_level = true;
  std::array<int32_t, 256> byte_ids{};  // id of each single-byte token, -1 if the vocab lacks it
  StringMap<int32_t> byte_vocab;        // raw bytes -> id, for every token made only of byte-level characters
  // Otherwise (SentencePiece style): words are UTF-8, each character one initial symbol; a character not in the vocab
  // becomes its bytes' <0xXX> tokens (byte_fallback, when all exist), else the unknown token.
  bool byte_fallback = false;
  std::array<int32_t, 256> fallback_ids{};  // id of "<0xXX>" for each byte, -1 if the vocab lacks it
  int32_t unk_id = -1;                      // -1: no unknown token (unknown symbols are dropped)
  bool fuse_unk = false;                    // consecutive unknown symbols become one unknown token
  PairMap merges;
  bool ignore_merges = false;

  // Appends the ids of `word` (one pre-token: raw bytes when byte_level, else UTF-8).
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
};

}  // namespace tessera::data::detail
