// LLM Foundry's fine-tuning batches: the dataset of tokenized, filtered examples (or MDS samples, as its
// StreamingFinetuningDataset), Composer's distributed sampler order, Seq2SeqFinetuningCollator and BinPackCollator
// (llmfoundry/data/finetuning/collator.py, llmfoundry/data/packing.py) and auto_packing_ratio's profile. The examples
// themselves are read and tokenized in finetuning_examples.cpp.
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>

#include "tessera/data/finetuning.h"
#include "tessera/data/mds.h"
#include "tessera/util/error.h"

namespace tessera::data {
namespace {

using Json = nlohmann::ordered_json;
constexpr const char* kFinetuningComponent = "finetuning";

[[noreturn]] void fail_finetuning(const std::string& where, const std::string& what) {
  throw Error(kFinetuningComponent, fmt::format("{}: {}", where, what));
}

bool has_loss(const std::vector<int32_t>& labels, size_t limit) {
  const size_t n = std::min(limit, labels.size());
  return std::any_of(labels.begin(), labels.begin() + static_cast<std::ptrdiff_t>(n),
                     [](int32_t l) { return l != kIgnoreLabel; });
}

// BinPackCollator._first_fit_bin_packing: the items (largest first, stable) go into the bins left over from the
// previous batch, each into the first bin it fits (which then moves to the end), or a bin of its own; when only as
// many items remain as bins are missing, each gets its own. The `num_bins` largest bins are returned; the rest are
// kept in `leftovers` (at most `keep` of them). Items have a `size`; combine(bin, item) merges item into bin.
template <class Item, class Combine>
std::vector<Item> first_fit(std::vector<Item> items, std::vector<Item>& leftovers, size_t num_bins, int64_t max_size,
                            std::optional<int64_t> keep, Combine combine) {
  const auto by_size = [](const Item& a, const Item& b) { return a.size > b.size; };
  std::stable_sort(items.begin(), items.end(), by_size);
  std::vector<Item> bins = std::move(leftovers);
  leftovers.clear();
  const size_t count = items.size();
  const auto missing = [&] { return num_bins > bins.size() ? num_bins - bins.size() : 0; };
  if (count < missing()) {
    for (Item& e : items) bins.push_back(std::move(e));
  } else {
    for (size_t i = 0; i < count; ++i) {
      Item& e = items[i];
      if (count - i == missing()) {
        bins.push_back(std::move(e));
        continue;
      }
      auto fits = std::find_if(bins.begin(), bins.end(), [&](const Item& b) { return b.size + e.size <= max_size; });
      if (fits == bins.end()) {
        bins.push_back(std::move(e));
        continue;
      }
      Item bin = std::move(*fits);
      bins.erase(fits);
      combine(bin, e);
      bins.push_back(std::move(bin));
    }
  }
  std::stable_sort(bins.begin(), bins.end(), by_size);
  std::vector<Item> out;
  for (size_t k = 0; k < bins.size(); ++k) {
    if (k < num_bins) {
      out.push_back(std::move(bins[k]));
    } else if (!keep || static_cast<int64_t>(leftovers.size()) < *keep) {
      leftovers.push_back(std::move(bins[k]));
    }
  }
  return out;
}

// A packed row's length only, for profiling.
struct Length {
  int64_t size = 0;
};

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// The dataset, the sampler and the collators.

FinetuningDataset::FinetuningDataset(const FinetuningOptions& options, const ChatTokenizer& tokenizer,
                                     int64_t device_batch_size, int64_t world_size, int64_t ranks_per_node)
    : o_(options),
      device_batch_size_(device_batch_size),
      pad_id_(tokenizer.pad_token_id().value_or(0)),
      pad_left_(tokenizer.pad_left()),
      eos_(tokenizer.eos_token_id()),
      examples_per_batch_(device_batch_size) {
  validate_target_settings(o_.target_prompts, o_.target_responses, "train_loader.dataset");
  if (!tokenizer.pad_token_id()) {
    throw Error(kFinetuningComponent,
                "the tokenizer has neither a pad token nor an eos token to pad with (set pad_token or "
                "eos_token in its tokenizer_config.json)");
  }
  if (o_.streams) {
    if (o_.auto_packing_ratio)
      fail_finetuning("train_loader.dataset.packing_ratio", "auto needs hf_name data, not MDS streams");
    packing_ratio_ = o_.packing_ratio.value_or(1);
    if (packing_ratio_ < 1) fail_finetuning("train_loader.dataset.packing_ratio", "must be at least 1");
    examples_per_batch_ = packing_ratio_ == 1
                              ? device_batch_size_
                              : static_cast<int64_t>(static_cast<double>(device_batch_size_) * packing_ratio_);
    ranks_per_node_ = ranks_per_node > 0 ? ranks_per_node : world_size;
    StreamingOptions so = *o_.streams;
    so.batch_size = examples_per_batch_;  // the DataLoader's batch: the examples packed into one batch
    mds_ = std::make_unique<StreamingDataset>(so, World{world_size / ranks_per_node_, ranks_per_node_, 1});
    tokenizer_ = tokenizer;
    return;
  }
  const std::string source = o_.hf_name == "json" ? "hf_kwargs.data_files" : o_.hf_name;
  for (const auto& [row, where] : read_finetuning_rows(o_)) {
    const FinetuningExample ex = tokenizer.tokenize(row, where);
    // is_valid_ift_example: no empty turn, and some loss token left after truncation (stitched without the eos).
    bool valid = std::all_of(ex.turns.begin(), ex.turns.end(),
                             [](const FinetuningTurn& t) { return !t.prompt.empty() && !t.response.empty(); });
    if (valid) {
      const auto [ids, labels] = stitch_turns(ex, o_.target_prompts, o_.target_responses, std::nullopt);
      valid = !ids.empty() && has_loss(labels, static_cast<size_t>(o_.max_seq_len));
    }
    if (!valid) {
      ++dropped_;
      continue;
    }
    examples_.push_back(stitch_turns(ex, o_.target_prompts, o_.target_responses, eos_));
  }
  if (dropped_ > 0) {
    spdlog::warn(
        "{} split '{}': dropped {} examples where the prompt was longer than max_seq_len {}, the prompt or "
        "response was empty, or no loss-generating token was left",
        source, o_.split, dropped_, o_.max_seq_len);
  }
  if (examples_.empty()) {
    fail_finetuning(source,
                    fmt::format("split '{}': no valid examples after dropping {} (prompts longer than max_seq_len {}, "
                                "empty prompts or responses, or no loss-generating tokens)",
                                o_.split, dropped_, o_.max_seq_len));
  }
  if (o_.auto_packing_ratio) {
    // Every rank profiles every rank's share, so all agree on the smallest ratio without communicating (LLM Foundry
    // all-reduces the MIN).
    double ratio = std::numeric_limits<double>::infinity();
    const std::vector<int64_t> order = sampler_order(0, world_size, false);
    for (int64_t r = 0; r < world_size; ++r) {
      std::vector<int64_t> sizes;
      for (int64_t i : rank_slice(order, world_size, r)) {
        sizes.push_back(
            std::min<int64_t>(static_cast<int64_t>(examples_[static_cast<size_t>(i)].first.size()), o_.max_seq_len));
      }
      ratio = std::min(ratio, profile_auto_packing_ratio(sizes, device_batch_size_, o_.max_seq_len, std::nullopt));
    }
    packing_ratio_ = ratio;
    spdlog::info("packing_ratio auto: profiled {}", packing_ratio_);
  } else if (o_.packing_ratio) {
    packing_ratio_ = *o_.packing_ratio;
  }
  if (packing_ratio_ < 1) fail_finetuning("train_loader.dataset.packing_ratio", "must be at least 1");
  examples_per_batch_ = packing_ratio_ == 1
                            ? device_batch_size_
                            : static_cast<int64_t>(static_cast<double>(device_batch_size_) * packing_ratio_);
}

int64_t FinetuningDataset::per_rank(int64_t world_size, bool drop_last) const {
  // DistributedSampler's num_samples: ceil(n / W), or floor(n / W) when the tail is dropped.
  const int64_t n = size();
  return drop_last ? n / world_size : (n + world_size - 1) / world_size;
}

std::vector<int64_t> FinetuningDataset::sampler_order(int64_t epoch, int64_t world_size, bool drop_last) const {
  const int64_t n = size();
  const int64_t total = per_rank(world_size, drop_last) * world_size;
  std::vector<int64_t> indices(static_cast<size_t>(n));
  if (o_.shuffle) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(o_.shuffle_seed + epoch));
    const at::Tensor perm = at::randperm(n, gen, at::TensorOptions().dtype(at::kLong));
    std::copy(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + n, indices.begin());
  } else {
    for (int64_t i = 0; i < n; ++i) indices[static_cast<size_t>(i)] = i;
  }
  // The tail: padded by repeating from the start, or cut.
  for (int64_t k = 0; static_cast<int64_t>(indices.size()) < total; ++k) indices.push_back(indices[k % n]);
  indices.resize(static_cast<size_t>(total));
  return indices;
}

std::vector<int64_t> FinetuningDataset::rank_slice(const std::vector<int64_t>& order, int64_t world_size,
                                                   int64_t rank) {
  std::vector<int64_t> mine;
  for (auto i = static_cast<size_t>(rank); i < order.size(); i += static_cast<size_t>(world_size)) {
    mine.push_back(order[i]);
  }
  return mine;
}

std::vector<int64_t> FinetuningDataset::sampler_indices(int64_t epoch, int64_t world_size, int64_t rank,
                                                        bool drop_last) const {
  return rank_slice(sampler_order(epoch, world_size, drop_last), world_size, rank);
}

int64_t FinetuningDataset::batches_in_epoch(int64_t world_size, bool drop_last) const {
  if (mds_) return static_cast<int64_t>(worker_batches(mds_->epoch_ids(0, 0), 0, 0, drop_last)[0].size());
  const int64_t n = per_rank(world_size, drop_last);
  return drop_last ? n / examples_per_batch_ : (n + examples_per_batch_ - 1) / examples_per_batch_;
}

FinetuningDataset::Epoch::Epoch(const FinetuningDataset& ds, int64_t epoch, int64_t world_size, int64_t rank,
                                bool drop_last)
    : ds_(ds), drop_last_(drop_last) {
  if (ds.mds_) {
    // Streaming's order: this rank's (only) worker's batches, as LLM Foundry's DataLoader over the dataset reads them.
    mds_ = worker_batches(ds.mds_->epoch_ids(epoch, 0), rank / ds.ranks_per_node_, rank % ds.ranks_per_node_,
                          drop_last)[0];
  } else {
    order_ = ds.sampler_indices(epoch, world_size, rank, drop_last);
  }
}

std::optional<FinetuningBatch> FinetuningDataset::Epoch::next() {
  std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> from_mds;
  std::vector<const std::pair<std::vector<int32_t>, std::vector<int32_t>>*> examples;
  if (ds_.mds_) {
    if (at_ >= mds_.size()) return std::nullopt;
    for (int64_t id : mds_[at_]) from_mds.push_back(ds_.mds_example(id));
    for (const auto& e : from_mds) examples.push_back(&e);
    ++at_;
  } else {
    const auto per_batch = static_cast<size_t>(ds_.examples_per_batch_);
    const size_t left = order_.size() - at_;
    if (left == 0 || (drop_last_ && left < per_batch)) return std::nullopt;
    for (size_t k = 0; k < std::min(per_batch, left); ++k) {
      examples.push_back(&ds_.examples_[static_cast<size_t>(order_[at_ + k])]);
    }
    at_ += examples.size();
  }
  const size_t n = examples.size();
  const auto T = static_cast<size_t>(ds_.o_.max_seq_len);
  // Seq2SeqFinetuningCollator: truncate to max_seq_len, pad to it.
  std::vector<Bin> rows;
  size_t longest = 0;
  for (size_t k = 0; k < n; ++k) {
    const auto& [ids, labels] = *examples[k];
    if (!has_loss(labels, T)) {
      throw Error(kFinetuningComponent,
                  fmt::format("an example of {} tokens keeps no loss-generating token within max_seq_len "
                              "{} (MDS fine-tuning data is not filtered: prepare it with the same "
                              "max_seq_len and target settings)",
                              ids.size(), T));
    }
    Bin p;
    const size_t len = std::min(ids.size(), T);
    p.ids.assign(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(len));
    p.labels.assign(labels.begin(), labels.begin() + static_cast<std::ptrdiff_t>(len));
    p.sequence_id.assign(len, 0);
    p.size = static_cast<int64_t>(len);
    longest = std::max(longest, len);
    rows.push_back(std::move(p));
  }
  size_t width = T;
  const bool packing = ds_.packing_ratio_ != 1;
  if (!packing && ds_.o_.allow_pad_trimming && seen_first_) {
    width = std::min(T, (longest + 7) / 8 * 8);  // padding trimmed to a multiple of 8 (never the first batch)
  }
  seen_first_ = true;
  if (packing) rows = pack(std::move(rows));
  FinetuningBatch b;
  b.examples = static_cast<int64_t>(n);
  const auto B = static_cast<int64_t>(rows.size());
  const auto W = static_cast<int64_t>(width);
  b.input_ids = at::full({B, W}, ds_.pad_id_, at::kLong);
  b.labels = at::full({B, W}, kIgnoreLabel, at::kLong);
  b.attention_mask = at::zeros({B, W}, at::kLong);
  b.sequence_id = at::full({B, W}, -1, at::kLong);
  for (int64_t r = 0; r < B; ++r) {
    const Bin& p = rows[static_cast<size_t>(r)];
    const int64_t len = std::min<int64_t>(p.size, W);
    const int64_t start = ds_.pad_left_ ? W - len : 0;
    // Left padding trims from the left (LLM Foundry keeps the last `width` columns).
    const int64_t from = ds_.pad_left_ ? p.size - len : 0;
    int64_t* ids = b.input_ids[r].data_ptr<int64_t>();
    int64_t* labels = b.labels[r].data_ptr<int64_t>();
    int64_t* mask = b.attention_mask[r].data_ptr<int64_t>();
    int64_t* seq = b.sequence_id[r].data_ptr<int64_t>();
    for (int64_t t = 0; t < len; ++t) {
      const auto src = static_cast<size_t>(from + t);
      ids[start + t] = p.ids[src];
      labels[start + t] = p.labels[src];
      mask[start + t] = 1;
      seq[start + t] = p.sequence_id[src];
    }
  }
  return b;
}

// BinPackCollator._first_fit_bin_packing over this batch's examples and the bins left over from earlier batches.
std::vector<FinetuningDataset::Bin> FinetuningDataset::Epoch::pack(std::vector<Bin> examples) {
  for (const Bin& e : examples) stats_.total_tokens += e.size;
  stats_.rows += ds_.device_batch_size_;
  const auto combine = [](Bin& bin, Bin& add) {
    add.labels[0] = kIgnoreLabel;  // the first token of a packed example predicts nothing from the one before
    const int64_t next =
        bin.sequence_id.empty() ? 0 : *std::max_element(bin.sequence_id.begin(), bin.sequence_id.end()) + 1;
    bin.ids.insert(bin.ids.end(), add.ids.begin(), add.ids.end());
    bin.labels.insert(bin.labels.end(), add.labels.begin(), add.labels.end());
    for (int64_t s : add.sequence_id) bin.sequence_id.push_back(s + next);
    bin.size += add.size;
  };
  std::vector<Bin> out = first_fit(std::move(examples), leftovers_, static_cast<size_t>(ds_.device_batch_size_),
                                   ds_.o_.max_seq_len, ds_.o_.max_leftover_bins_to_keep, combine);
  for (const Bin& b : out) stats_.packed_tokens += b.size;
  return out;
}

std::pair<std::vector<int32_t>, std::vector<int32_t>> FinetuningDataset::mds_example(int64_t sample) const {
  const mds::Sample s = mds_->get(sample);
  const std::string where = fmt::format("MDS sample {}", sample);
  FinetuningExample ex;
  if (auto it = s.find("turns"); it != s.end()) {
    // convert_finetuning_dataset's tokenized layout: [{"input_ids": [...], "labels": [...]}, ...]
    const auto* turns = std::get_if<Json>(&it->second);
    if (turns == nullptr || !turns->is_array()) fail_finetuning(where, "the turns column must hold a JSON list");
    for (const Json& t : *turns) {
      if (!t.is_object() || !t.contains("input_ids") || !t.contains("labels")) {
        fail_finetuning(where, "each turn must have input_ids and labels");
      }
      ex.turns.push_back({t["input_ids"].get<std::vector<int32_t>>(), t["labels"].get<std::vector<int32_t>>()});
    }
  } else if (s.count("input_ids") != 0U) {
    // The legacy tokenized layout: input_ids (the prompt) and labels (the response), truncated to max_seq_len.
    FinetuningTurn turn;
    for (const char* column : {"input_ids", "labels"}) {
      auto c = s.find(column);
      if (c == s.end()) fail_finetuning(where, fmt::format("input_ids without {}", column));
      at::Tensor t = token_column(c->second, o_.token_encoding_type, where + ": column " + column);
      t = t.narrow(0, 0, std::min<int64_t>(t.size(0), o_.max_seq_len)).to(at::kLong).contiguous();
      std::vector<int32_t> tokens(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
      (std::string(column) == "input_ids" ? turn.prompt : turn.response) = std::move(tokens);
    }
    ex.turns.push_back(std::move(turn));
  } else {
    // Untokenized rows (prompt/response str columns, or messages json): tokenized as rows of files are.
    Json row = Json::object();
    for (const auto& [k, v] : s) {
      if (const auto* str = std::get_if<std::string>(&v)) {
        row[k] = *str;
      } else if (const auto* j = std::get_if<Json>(&v)) {
        row[k] = *j;
      } else if (const auto* i = std::get_if<int64_t>(&v)) {
        row[k] = *i;
      } else if (const auto* d = std::get_if<double>(&v)) {
        row[k] = *d;
      } else {
        fail_finetuning(where,
                        fmt::format("column {} holds an array; expected turns, input_ids/labels, prompt/response or "
                                    "messages",
                                    k));
      }
    }
    ex = tokenizer_->tokenize(row, where);
  }
  return stitch_turns(ex, o_.target_prompts, o_.target_responses, eos_);
}

FinetuningBatches::FinetuningBatches(const FinetuningDataset& ds, int64_t epoch, int64_t world_size, int64_t rank,
                                     bool drop_last, int64_t skip)
    : epoch_(ds, epoch, world_size, rank, drop_last), packed_(ds.packing_ratio() != 1), pad_left_(ds.pad_left()) {
  for (int64_t k = 0; k < skip && epoch_.next(); ++k) {
  }
}

std::optional<TokenBatch> FinetuningBatches::next() {
  std::optional<FinetuningBatch> b = epoch_.next();
  if (!b) return std::nullopt;
  TokenBatch out;
  out.input_ids = std::move(b->input_ids);
  out.labels = std::move(b->labels);
  out.samples = out.input_ids.size(0);
  if (pad_left_) out.attention_mask = std::move(b->attention_mask);
  if (packed_) out.sequence_id = std::move(b->sequence_id);
  return out;
}

double profile_auto_packing_ratio(const std::vector<int64_t>& sizes, int64_t device_batch_size, int64_t max_seq_len,
                                  std::optional<int64_t> max_leftover_bins_to_keep) {
  if (max_seq_len <= 100) return 1;
  // np.linspace(1, max_seq_len / 100, 20), rounded to one decimal (half to even), one ratio per raw batch size.
  const double max_ratio = static_cast<double>(max_seq_len) / 100.0;
  constexpr int kRatios = 20;
  std::vector<double> ratios;
  std::vector<int64_t> raw_sizes;
  const double step = (max_ratio - 1.0) / (kRatios - 1);
  for (int k = 0; k < kRatios; ++k) {
    double r = k == kRatios - 1 ? max_ratio : 1.0 + k * step;
    r = std::nearbyint(10 * r) / 10;
    const auto raw = static_cast<int64_t>(r * static_cast<double>(device_batch_size));
    if (std::find(raw_sizes.begin(), raw_sizes.end(), raw) == raw_sizes.end()) {
      ratios.push_back(r);
      raw_sizes.push_back(raw);
    }
  }
  const int64_t profiled = std::min<int64_t>(static_cast<int64_t>(sizes.size()),
                                             *std::max_element(raw_sizes.begin(), raw_sizes.end()) * 100);
  double chosen = 1;
  for (size_t k = 0; k < ratios.size(); ++k) {
    const int64_t raw = raw_sizes[k];
    // A packer in profiling mode: lengths only.
    std::vector<Length> leftovers;
    int64_t packed = 0, total = 0, batches = 0;
    for (int64_t idx = 0; idx < profiled; idx += raw) {
      const int64_t end = std::min(profiled, idx + raw);
      if (end - idx < device_batch_size) continue;
      std::vector<Length> batch;
      for (int64_t i = idx; i < end; ++i) {
        batch.push_back({sizes[static_cast<size_t>(i)]});
        total += sizes[static_cast<size_t>(i)];
      }
      for (const Length& b :
           first_fit(std::move(batch), leftovers, static_cast<size_t>(device_batch_size), max_seq_len,
                     max_leftover_bins_to_keep, [](Length&bin, const Length&add) { bin.size += add.size; })) {
        packed += b.size;
      }
      ++batches;
    }
    if (batches == 0 || packed != total) break;  // no data to profile, or some waste: keep the previous ratio
    chosen = ratios[k];
  }
  return chosen;
}

}  // namespace tessera::data
