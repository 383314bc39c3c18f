// Streaming's partitioning (streaming/base/partition/{orig,relaxed}.py) and per-shard sampling (sampling.py).
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "tessera/data/streaming.h"
#include "tessera/util/error.h"
#include "tessera/util/numpy_random.h"

namespace tessera::data::streaming {
namespace {

constexpr const char* kComponent = "streaming";

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

Partition partition_orig(int64_t n, int64_t c, int64_t p, int64_t r, int64_t w, int64_t b, int64_t drop_first) {
  if (n <= drop_first) {
    throw Error(kComponent, fmt::format("resuming at sample {} of an epoch of {} samples", drop_first, n));
  }
  if ((c < p && p % c != 0) || (p < c && c % p != 0)) {
    throw Error(kComponent, fmt::format("num_canonical_nodes ({}) and the number of physical nodes ({}) must divide "
                                        "one another",
                                        c, p));
  }
  b = std::max<int64_t>(b, 1);
  drop_first = p * (drop_first / p);
  const int64_t spc = ceil_div(n, c);
  int64_t ratio = 0, padding = 0;
  if (c < p) {
    ratio = p / c;
    if (spc % ratio) padding = ratio - spc % ratio;
  }
  const int64_t width = spc + padding;
  // ids: (c, width). Row k covers big ids [k*n//c, (k+1)*n//c); short rows repeat their last id at column spc-1;
  // padding columns copy earlier columns.
  std::vector<int64_t> ids(static_cast<size_t>(c * width));
  if (!(n > c || (n == c && c >= p))) {
    // Fewer samples than canonical nodes: Streaming tiles the sample range (many repeats; it warns).
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i) % n;
  }
  for (int64_t k = 0; k < c && (n > c || (n == c && c >= p)); ++k) {
    const int64_t start = k * n / c, stop = (k + 1) * n / c;
    int64_t* row = ids.data() + k * width;
    for (int64_t j = 0; j < width; ++j) row[j] = start + j;
    if (stop - start < spc) row[spc - 1] -= 1;
    if (padding) {
      for (int64_t j = 0; j < padding; ++j) row[width - padding + j] = row[width - padding - ratio + 1 - padding + j];
    }
  }
  // Column-major flatten (interleaves canonical nodes), drop consumed samples, deal out to physical nodes.
  std::vector<int64_t> flat;
  flat.reserve(ids.size());
  for (int64_t j = 0; j < width; ++j) {
    for (int64_t k = 0; k < c; ++k) flat.push_back(ids[static_cast<size_t>(k * width + j)]);
  }
  flat.erase(flat.begin(), flat.begin() + drop_first);
  const int64_t per_node = static_cast<int64_t>(flat.size()) / p;
  std::vector<std::vector<int64_t>> nodes(static_cast<size_t>(p));
  for (int64_t node = 0; node < p; ++node) {
    for (int64_t j = 0; j < per_node; ++j)
      nodes[static_cast<size_t>(node)].push_back(flat[static_cast<size_t>(j * p + node)]);
  }
  // Pad each node's list to a multiple of r with samples from near its end.
  int64_t len = per_node;
  if (len % r) {
    const int64_t underflow = r - len % r;
    for (auto& list : nodes) {
      std::vector<int64_t> last;
      if (r + underflow - 1 <= len) {  // repeat samples from near the end
        last.assign(list.end() - r - underflow + 1, list.end() - r + 1);
      } else {  // fewer samples than ranks: tile them (Streaming warns about the repeats)
        for (int64_t i = 0; i < underflow; ++i) last.push_back(list[static_cast<size_t>(i % len)]);
      }
      list.insert(list.end(), last.begin(), last.end());
    }
    len += underflow;
  }
  const int64_t per_rank = len / r;
  const int64_t rounded = ceil_div(per_rank, w * b) * (w * b);
  Partition out;
  out.shape = {p, r, w, rounded / (w * b), b};
  out.ids.assign(static_cast<size_t>(p * r * rounded), -1);
  for (int64_t node = 0; node < p; ++node) {
    for (int64_t rank = 0; rank < r; ++rank) {
      for (int64_t s = 0; s < per_rank; ++s) {  // rank takes every r-th sample of its node
        const int64_t v = nodes[static_cast<size_t>(node)][static_cast<size_t>(s * r + rank)];
        // s-th sample of this rank -> batch s / b overall; worker = batch % w, batch of worker = batch / w.
        const int64_t batch = s / b, worker = batch % w, wb = batch / w;
        out.ids[static_cast<size_t>((((node * r + rank) * w + worker) * out.shape[3] + wb) * b + s % b)] = v;
      }
    }
  }
  return out;
}

}  // namespace

int64_t Partition::at(int64_t node, int64_t rank, int64_t worker, int64_t batch, int64_t element) const {
  return ids[static_cast<size_t>((((node * shape[1] + rank) * shape[2] + worker) * shape[3] + batch) * shape[4] +
                                 element)];
}

std::vector<int64_t> Partition::traversal() const {
  std::vector<int64_t> out;
  out.reserve(ids.size());
  for (int64_t bw = 0; bw < shape[3]; ++bw) {
    for (int64_t w = 0; w < shape[2]; ++w) {
      for (int64_t n = 0; n < shape[0]; ++n) {
        for (int64_t r = 0; r < shape[1]; ++r) {
          for (int64_t e = 0; e < shape[4]; ++e) out.push_back(at(n, r, w, bw, e));
        }
      }
    }
  }
  return out;
}

Partition get_partitions(const std::string& algo, int64_t n, int64_t c, int64_t p, int64_t r, int64_t w, int64_t b,
                         int64_t drop_first, int64_t initial_p) {
  if (algo != "orig" && algo != "relaxed") {
    throw Error(kComponent, fmt::format("partition_algo \"{}\" is not supported (orig, relaxed)", algo));
  }
  const bool divides = (p <= c && c % p == 0) || (p > c && p % c == 0);
  if (algo == "orig" || initial_p == 0 || divides) return partition_orig(n, c, p, r, w, b, drop_first);
  b = std::max<int64_t>(b, 1);
  const int64_t global = p * r * b, initial_devices = initial_p * r;
  if (global % initial_devices != 0) {
    throw Error(kComponent, fmt::format("the global batch ({}) must be divisible by the initial number of devices ({})",
                                        global, initial_devices));
  }
  const Partition first = partition_orig(n, c, initial_p, r, w, global / initial_devices, drop_first);
  const std::vector<int64_t> order = first.traversal();
  // Re-cut the traversal as (batches per worker, workers, nodes, ranks, batch) and transpose back.
  const int64_t per_step = w * p * r * b;
  const int64_t bpw = static_cast<int64_t>(order.size()) / per_step;
  Partition out;
  out.shape = {p, r, w, bpw, b};
  out.ids.assign(order.size(), -1);
  size_t i = 0;
  for (int64_t bw = 0; bw < bpw; ++bw) {
    for (int64_t wk = 0; wk < w; ++wk) {
      for (int64_t node = 0; node < p; ++node) {
        for (int64_t rank = 0; rank < r; ++rank) {
          for (int64_t e = 0; e < b; ++e) {
            out.ids[static_cast<size_t>((((node * r + rank) * w + wk) * bpw + bw) * b + e)] = order[i++];
          }
        }
      }
    }
  }
  return out;
}

std::vector<int64_t> get_sampling(const std::vector<int64_t>& samples_per_shard, int64_t choose, int64_t granularity,
                                  uint64_t seed, uint64_t epoch, bool use_epoch) {
  const int64_t total = std::accumulate(samples_per_shard.begin(), samples_per_shard.end(), int64_t{0});
  std::vector<int64_t> out(samples_per_shard.size());
  if (total == 0) return out;
  if (choose % total == 0) {
    for (size_t k = 0; k < out.size(); ++k) out[k] = samples_per_shard[k] * (choose / total);
    return out;
  }
  for (size_t k = 0; k < out.size(); ++k) out[k] = samples_per_shard[k] * (choose / total);
  int64_t remaining = choose % total;
  // Cut every shard into picks of `granularity` samples, the last pick holding the rest, exactly as sampling.py
  // indexes them: the "last pick" of shard k is entry cumsum(picks)[k] - 1, so an empty shard overwrites the size of
  // the previous shard's last pick (or, for a leading empty shard, wraps to the final pick, Python's index -1).
  std::vector<size_t> pick_shard;
  std::vector<int64_t> pick_size;
  int64_t cumulative = 0;
  std::vector<int64_t> last_index, last_size;
  for (size_t k = 0; k < samples_per_shard.size(); ++k) {
    const int64_t picks = (samples_per_shard[k] + granularity - 1) / granularity;
    for (int64_t i = 0; i < picks; ++i) pick_shard.push_back(k), pick_size.push_back(granularity);
    cumulative += picks;
    last_index.push_back(cumulative - 1);
    last_size.push_back(samples_per_shard[k] - (picks - 1) * granularity);
  }
  const auto num_picks = static_cast<int64_t>(pick_size.size());
  for (size_t k = 0; k < last_index.size(); ++k) {
    int64_t idx = last_index[k];
    if (idx < 0) idx += num_picks;
    if (idx >= 0 && idx < num_picks) pick_size[static_cast<size_t>(idx)] = last_size[k];
  }
  util::NumpyGenerator rng(use_epoch ? seed + epoch : seed);
  for (int64_t i : rng.permutation(num_picks)) {
    if (remaining <= 0) break;
    const int64_t take = std::min(remaining, pick_size[static_cast<size_t>(i)]);
    out[pick_shard[static_cast<size_t>(i)]] += take;
    remaining -= take;
  }
  return out;
}

}  // namespace tessera::data::streaming
