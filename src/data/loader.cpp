// Background token-batch loading: one thread per worker, bounded queues, round-robin consumption.
#include "tessera/data/loader.h"

#include <fmt/format.h>

#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>

#include "tessera/util/error.h"

namespace tessera::data {
namespace {

at::ScalarType encoding_dtype(const std::string& name) {
  static const std::vector<std::pair<std::string, at::ScalarType>> table = {
      {"int8", at::kChar},  {"int16", at::kShort},   {"int32", at::kInt},     {"int64", at::kLong},
      {"uint8", at::kByte}, {"uint16", at::kUInt16}, {"uint32", at::kUInt32}, {"uint64", at::kUInt64}};
  for (const auto& [n, t] : table) {
    if (n == name) return t;
  }
  throw Error("loader", fmt::format("token_encoding_type \"{}\" is not an integer type", name));
}

}  // namespace

at::Tensor token_column(const mds::Field& field, const std::string& encoding, const std::string& where) {
  if (const auto* tensor = std::get_if<at::Tensor>(&field)) return tensor->reshape({-1});
  const auto* bytes = std::get_if<std::string>(&field);
  if (bytes == nullptr) throw Error("loader", fmt::format("{} holds neither an array nor bytes", where));
  const at::ScalarType dtype = encoding_dtype(encoding);
  const size_t item = c10::elementSize(dtype);
  if (bytes->size() % item != 0) {
    throw Error("loader",
                fmt::format("{}: {} bytes is not a whole number of {} tokens", where, bytes->size(), encoding));
  }
  at::Tensor t = at::empty({static_cast<int64_t>(bytes->size() / item)}, at::TensorOptions().dtype(dtype));
  std::memcpy(t.data_ptr(), bytes->data(), bytes->size());
  return t;
}

struct TokenBatchLoader::Worker {
  std::vector<std::vector<int64_t>> batches;  // sample ids of each of this worker's batches
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<TokenBatch> ready;
  size_t produced = 0, taken = 0;
  std::exception_ptr error;
  bool stop = false;
  std::thread thread;
  // Remote streams: a second thread fetches shards ahead of `position` (samples collated so far), as Streaming's
  // per-worker prepare thread does.
  std::atomic<int64_t> position{0};
  std::atomic<bool> halt{false};
  std::thread prefetcher;
};

std::vector<std::vector<std::vector<int64_t>>> worker_batches(const streaming::Partition& part, int64_t node,
                                                              int64_t rank_of_node, bool drop_last) {
  std::vector<std::vector<std::vector<int64_t>>> out(static_cast<size_t>(part.shape[2]));
  for (int64_t w = 0; w < part.shape[2]; ++w) {
    for (int64_t b = 0; b < part.shape[3]; ++b) {
      std::vector<int64_t> ids;
      for (int64_t e = 0; e < part.shape[4]; ++e) {
        const int64_t id = part.at(node, rank_of_node, w, b, e);
        if (id >= 0) ids.push_back(id);
      }
      if (ids.empty() || (drop_last && static_cast<int64_t>(ids.size()) < part.shape[4])) continue;
      out[static_cast<size_t>(w)].push_back(std::move(ids));
    }
  }
  return out;
}

int64_t batches_in_epoch(const StreamingDataset& dataset, int64_t epoch, int64_t sample_in_epoch, int64_t node,
                         int64_t rank_of_node, bool drop_last) {
  int64_t n = 0;
  for (const auto& w : worker_batches(dataset.epoch_ids(epoch, sample_in_epoch), node, rank_of_node, drop_last)) {
    n += static_cast<int64_t>(w.size());
  }
  return n;
}

TokenBatchLoader::TokenBatchLoader(StreamingDataset& dataset, int64_t workers, int64_t epoch, int64_t sample_in_epoch,
                                   int64_t node, int64_t rank_of_node, TokenLoaderOptions options)
    : ds_(dataset), o_(std::move(options)) {
  if (workers < 1) throw Error("loader", "at least one worker is needed");
  encoding_dtype(o_.token_encoding_type);  // validate early
  const streaming::Partition part = ds_.epoch_ids(epoch, sample_in_epoch);
  if (part.shape[2] != workers) {
    throw Error("loader", fmt::format("the dataset was partitioned for {} workers per rank, the loader has {}",
                                      part.shape[2], workers));
  }
  batch_size_ = part.shape[4];
  for (auto& batches : worker_batches(part, node, rank_of_node, o_.drop_last)) {
    auto worker = std::make_unique<Worker>();
    worker->batches = std::move(batches);
    workers_.push_back(std::move(worker));
  }
  for (auto& w : workers_) w->thread = std::thread([this, ptr = w.get()] { run(*ptr); });
  if (ds_.has_remote()) {
    for (auto& w : workers_) w->prefetcher = std::thread([this, ptr = w.get()] { prefetch(*ptr); });
  }
}

TokenBatchLoader::~TokenBatchLoader() {
  for (auto& w : workers_) {
    {
      std::lock_guard<std::mutex> lock(w->mutex);
      w->stop = true;
    }
    w->halt = true;
    w->cv.notify_all();
  }
  for (auto& w : workers_) {
    if (w->thread.joinable()) w->thread.join();
    if (w->prefetcher.joinable()) w->prefetcher.join();
  }
}

void TokenBatchLoader::prefetch(Worker& w) {
  const int64_t ahead = ds_.predownload();
  int64_t i = 0;
  for (const auto& ids : w.batches) {
    for (const int64_t id : ids) {
      while (i - w.position.load() > ahead) {
        if (w.halt) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(7));
      }
      if (w.halt) return;
      try {
        ds_.prefetch(id);
      } catch (const std::exception& e) {
        // The worker fetches the shard itself when it reaches it, and reports the failure then.
        spdlog::debug("[loader] prefetching sample {} failed: {}", id, e.what());
      }
      ++i;
    }
  }
}

void TokenBatchLoader::run(Worker& w) {
  try {
    for (const auto& ids : w.batches) {
      {
        std::unique_lock<std::mutex> lock(w.mutex);
        w.cv.wait(lock, [&] { return w.stop || static_cast<int64_t>(w.ready.size()) < o_.prefetch_factor; });
        if (w.stop) return;
      }
      TokenBatch batch = collate(ids);
      w.position += static_cast<int64_t>(ids.size());
      {
        std::lock_guard<std::mutex> lock(w.mutex);
        w.ready.push_back(std::move(batch));
        ++w.produced;
      }
      w.cv.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(w.mutex);
    w.error = std::current_exception();
    w.cv.notify_all();
  }
}

TokenBatch TokenBatchLoader::collate(const std::vector<int64_t>& ids) {
  std::vector<at::Tensor> rows;
  int64_t longest = 0;
  for (int64_t id : ids) {
    mds::Sample s = ds_.get(id);
    auto it = s.find(o_.column);
    if (it == s.end()) throw Error("loader", fmt::format("sample {} has no \"{}\" column", id, o_.column));
    at::Tensor t =
        token_column(it->second, o_.token_encoding_type, fmt::format("sample {}: column \"{}\"", id, o_.column));
    t = t.narrow(0, 0, std::min<int64_t>(t.size(0), o_.max_seq_len)).to(at::kLong);
    longest = std::max(longest, t.size(0));
    rows.push_back(t);
  }
  TokenBatch b;
  b.samples = static_cast<int64_t>(rows.size());
  b.input_ids = at::full({b.samples, longest}, o_.pad_token_id, at::kLong);
  b.labels = at::full({b.samples, longest}, kIgnoreLabel, at::kLong);
  for (int64_t i = 0; i < b.samples; ++i) {
    const at::Tensor& r = rows[static_cast<size_t>(i)];
    b.input_ids[i].narrow(0, 0, r.size(0)).copy_(r);
    b.labels[i].narrow(0, 0, r.size(0)).copy_(r);
  }
  return b;
}

std::optional<TokenBatch> TokenBatchLoader::next() {
  for (size_t tries = 0; tries < workers_.size(); ++tries) {
    Worker& w = *workers_[turn_];
    turn_ = (turn_ + 1) % workers_.size();
    std::unique_lock<std::mutex> lock(w.mutex);
    if (w.taken == w.batches.size()) continue;  // this worker is done; the others may still have batches
    w.cv.wait(lock, [&] { return !w.ready.empty() || w.error; });
    if (w.error) std::rethrow_exception(w.error);
    TokenBatch b = std::move(w.ready.front());
    w.ready.pop_front();
    ++w.taken;
    lock.unlock();
    w.cv.notify_all();
    consumed_ += b.samples;
    return b;
  }
  return std::nullopt;
}

}  // namespace tessera::data
