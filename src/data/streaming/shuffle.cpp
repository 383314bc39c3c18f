// Streaming's shuffle algorithms (streaming/base/shuffle/{naive,py1s,py1br,py1e}.py), call for call.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "tessera/data/streaming.h"
#include "tessera/util/error.h"
#include "tessera/util/numpy_random.h"

namespace tessera::data::streaming {
namespace {

using Span = std::pair<int64_t, int64_t>;  // [begin, end) of sample ids

// py1s.divide_spans: cut the (shuffled) spans at the canonical-node boundaries N*(p+1)//C.
void divide_spans(std::vector<Span>& spans, int64_t num_samples, int64_t num_parts, std::vector<Span>& out,
                  std::vector<std::pair<size_t, size_t>>& super_spans) {
  size_t begin_part = 0, span_index = 0;
  int64_t so_far = 0;
  for (int64_t part = 0; part < num_parts; ++part) {
    const int64_t part_end = num_samples * (part + 1) / num_parts;
    while (span_index < spans.size()) {
      const Span span = spans[span_index];
      const int64_t n = span.second - span.first;
      if (part_end < so_far + n) {
        if (so_far < part_end) {
          const int64_t split = part_end - so_far;
          out.emplace_back(span.first, span.first + split);
          spans[span_index] = {span.first + split, span.second};
          so_far += split;
        }
        break;
      }
      out.push_back(span);
      ++span_index;
      so_far += n;
    }
    super_spans.emplace_back(begin_part, out.size());
    begin_part = out.size();
  }
}

// The common first part of py1s/py1br/py1e: spans shuffled once per run, cut per canonical node, then shuffled per
// node with the epoch generator (which the caller keeps using).
std::vector<Span> node_spans(const std::vector<int64_t>& sizes, int64_t ncn, uint64_t seed,
                             util::NumpyGenerator& epoch_rng, std::vector<std::pair<size_t, size_t>>& super_spans,
                             int64_t& num_samples) {
  std::vector<Span> spans;
  num_samples = 0;
  for (int64_t s : sizes) {
    spans.emplace_back(num_samples, num_samples + s);
    num_samples += s;
  }
  util::NumpyGenerator run_rng(seed);
  run_rng.shuffle(spans);
  std::vector<Span> out;
  divide_spans(spans, num_samples, ncn, out, super_spans);
  for (const auto& [b, e] : super_spans) epoch_rng.shuffle(out.data() + b, e - b);
  return out;
}

}  // namespace

std::vector<int64_t> get_shuffle(const std::string& algo, const std::vector<int64_t>& sizes, int64_t ncn, uint64_t seed,
                                 uint64_t epoch, int64_t block_size) {
  if (ncn < 1) throw Error("streaming", "num_canonical_nodes must be positive");
  util::NumpyGenerator epoch_rng(seed + epoch);
  if (algo == "naive") {
    const int64_t n = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
    return epoch_rng.permutation(n);
  }
  if (algo != "py1s" && algo != "py1br" && algo != "py1e") {
    throw Error("streaming", fmt::format("shuffle_algo \"{}\" is not supported (naive, py1s, py1br, py1e)", algo));
  }
  std::vector<std::pair<size_t, size_t>> supers;
  int64_t n = 0;
  const std::vector<Span> spans = node_spans(sizes, ncn, seed, epoch_rng, supers, n);
  std::vector<int64_t> ids(static_cast<size_t>(n));
  if (algo == "py1s") {
    size_t off = 0;
    for (const auto& [b, e] : spans) {
      for (int64_t i = b; i < e; ++i) ids[off + static_cast<size_t>(i - b)] = i;
      epoch_rng.shuffle(ids.data() + off, static_cast<size_t>(e - b));
      off += static_cast<size_t>(e - b);
    }
    return ids;
  }
  const int64_t lo_block = static_cast<int64_t>(0.75 * static_cast<double>(block_size));
  const int64_t hi_block = static_cast<int64_t>(1.25 * static_cast<double>(block_size));
  if (algo == "py1br") {
    std::vector<int64_t> stagger;
    for (int64_t p = 0; p < ncn; ++p) stagger.push_back(epoch_rng.integers(0, lo_block));
    size_t off = 0;
    for (size_t p = 0; p < supers.size(); ++p) {
      const auto node_start = static_cast<int64_t>(off);
      for (size_t k = supers[p].first; k < supers[p].second; ++k) {
        for (int64_t i = spans[k].first; i < spans[k].second; ++i) ids[off++] = i;
      }
      const auto node_stop = static_cast<int64_t>(off);
      std::vector<Span> blocks;
      int64_t blocks_end = node_start;
      while (blocks_end < node_stop) {
        const int64_t r = epoch_rng.integers(lo_block, hi_block);
        const int64_t start = std::max(blocks_end - stagger[p], node_start);
        const int64_t stop = std::min(blocks_end + r - stagger[p], node_stop);
        blocks.emplace_back(start, stop);
        blocks_end += stop - start;
      }
      for (const auto& [s, e] : blocks) epoch_rng.shuffle(ids.data() + s, static_cast<size_t>(e - s));
    }
    return ids;
  }
  // py1e: shuffle each span's samples, then jitter each span's positions within a window of about r and sort.
  size_t off = 0;
  for (const auto& [first, last] : supers) {
    std::vector<int64_t> samples;
    std::vector<int64_t> span_sizes;
    for (size_t k = first; k < last; ++k) {
      std::vector<int64_t> x;
      for (int64_t i = spans[k].first; i < spans[k].second; ++i) x.push_back(i);
      epoch_rng.shuffle(x);
      samples.insert(samples.end(), x.begin(), x.end());
      span_sizes.push_back(spans[k].second - spans[k].first);
    }
    const auto m = static_cast<int64_t>(samples.size());
    std::vector<double> pos(samples.size());
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<double>(i);
    int64_t o = 0;
    for (int64_t s : span_sizes) {
      const int64_t r = epoch_rng.integers(lo_block, hi_block);
      const double cutoff = std::max(0.0, static_cast<double>(r - s) / 2.0);
      const double lo = std::max(-cutoff, -static_cast<double>(o));
      const double hi = std::min(cutoff, static_cast<double>(m - o - s));
      for (int64_t i = 0; i < s; ++i) pos[static_cast<size_t>(o + i)] += epoch_rng.uniform(lo, hi);
      o += s;
    }
    std::vector<size_t> order(samples.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&pos](size_t a, size_t b) { return pos[a] < pos[b]; });
    for (size_t i : order) ids[off++] = samples[i];
  }
  return ids;
}

}  // namespace tessera::data::streaming
