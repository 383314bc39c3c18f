// The built-in data loaders behind the DataLoader interface (`text`: Streaming datasets through TokenBatchLoader;
// `finetuning`: LLM Foundry's fine-tuning data through FinetuningBatches), and the loader registry.
#include "tessera/data/data_loader.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "tessera/data/finetuning.h"
#include "tessera/data/streaming_dataset.h"
#include "tessera/storage/probe.h"
#include "tessera/storage/storage.h"
#include "tessera/util/error.h"

namespace tessera::data {
namespace {

// `name: text`: this rank's share of Streaming's sample order, read by num_workers threads (at least one).
class TextLoader : public DataLoader {
 public:
  TextLoader(const LoaderOptions& o, const LoaderContext& ctx)
      : o_(o), ctx_(ctx), workers_(std::max<int64_t>(1, o.num_workers)) {
    StreamingOptions streaming = o.dataset;
    streaming.batch_size = ctx.device_batch_size;
    dataset_ = std::make_unique<StreamingDataset>(streaming, World{ctx.num_nodes, ctx.local_world_size, workers_});
    batches_ = batches_in_epoch(*dataset_, 0, 0, ctx.node_rank, ctx.local_rank, o.tokens.drop_last);
    if (ctx.split == "train_loader" && batches_ == 0) {
      throw Error("train", fmt::format("the training data has fewer samples ({}) than one device batch ({})",
                                       dataset_->epoch_size(), ctx.device_batch_size));
    }
  }

  std::optional<int64_t> batches_per_epoch() const override { return batches_; }

  std::unique_ptr<BatchIterator> open(const config::Timestamp& at) override {
    return std::make_unique<TokenBatchLoader>(*dataset_, workers_, at.epoch, at.sample_in_epoch, ctx_.node_rank,
                                              ctx_.local_rank, o_.tokens);
  }

  nlohmann::json state(const config::Timestamp& at) const override {
    return dataset_->state(at.epoch, at.sample_in_epoch).to_json();
  }

  void load_state(const nlohmann::json& state, const config::Timestamp& at, const std::string& where) override {
    if (!state.is_object() || !state.contains("sample_in_epoch")) {  // another loader's (finetuning: {"finetuning":..})
      throw Error("checkpoint", fmt::format("{}: the checkpoint's data loader state {} is not a text loader's, and "
                                            "this run's {} is text",
                                            where, state.dump(), ctx_.split));
    }
    const auto [epoch, sample] = dataset_->load_state(ResumeState::from_json(state));
    if (epoch != at.epoch || sample != at.sample_in_epoch) {
      throw Error("checkpoint", fmt::format("{}: the data loader state (epoch {}, sample {}) does not match the "
                                            "timestamp (epoch {}, sample {})",
                                            where, epoch, sample, at.epoch, at.sample_in_epoch));
    }
  }

 private:
  LoaderOptions o_;
  LoaderContext ctx_;
  int64_t workers_;
  std::unique_ptr<StreamingDataset> dataset_;
  int64_t batches_ = 0;
};

// `name: finetuning`: examples in torch's DistributedSampler order, collated or packed.
class FinetuningLoader : public DataLoader {
 public:
  FinetuningLoader(const LoaderOptions& o, const LoaderContext& ctx) : o_(o), ctx_(ctx) {
    const ChatTokenizer tok(ctx.tokenizer(), "");
    dataset_ = std::make_unique<FinetuningDataset>(*o.finetuning, tok, ctx.device_batch_size, ctx.world_size,
                                                   ctx.local_world_size);
    batches_ = dataset_->batches_in_epoch(ctx.world_size, o.tokens.drop_last);
    if (ctx.split == "train_loader" && batches_ == 0) {
      throw Error("train", fmt::format("the fine-tuning data has fewer examples ({}) than one device batch ({})",
                                       dataset_->size(), dataset_->examples_per_batch()));
    }
  }

  std::optional<int64_t> batches_per_epoch() const override { return batches_; }

  std::unique_ptr<BatchIterator> open(const config::Timestamp& at) override {
    // The epoch's order is the sampler's for that epoch; the batches already trained are skipped.
    return std::make_unique<FinetuningBatches>(*dataset_, at.epoch, ctx_.world_size, ctx_.rank, o_.tokens.drop_last,
                                               at.batch_in_epoch);
  }

  nlohmann::json state(const config::Timestamp& at) const override {
    return {{"finetuning", {{"epoch", at.epoch}, {"batch_in_epoch", at.batch_in_epoch}}}};
  }

  void load_state(const nlohmann::json& state, const config::Timestamp& at, const std::string& where) override {
    if (!state.is_object() || !state.contains("finetuning")) {
      throw Error("checkpoint", fmt::format("{}: the checkpoint's data loader state {} is not a finetuning loader's, "
                                            "and this run's {} is finetuning",
                                            where, state.dump(), ctx_.split));
    }
    const nlohmann::json& f = state["finetuning"];
    if (f.value("epoch", int64_t{-1}) != at.epoch || f.value("batch_in_epoch", int64_t{-1}) != at.batch_in_epoch) {
      throw Error("checkpoint", fmt::format("{}: the data loader state ({}) does not match the timestamp (epoch {}, "
                                            "batch {})",
                                            where, f.dump(), at.epoch, at.batch_in_epoch));
    }
  }

 private:
  LoaderOptions o_;
  LoaderContext ctx_;
  std::unique_ptr<FinetuningDataset> dataset_;
  int64_t batches_ = 0;
};

// Pre-flight of MDS streams: a remote's index.json answers (credentials, bucket, endpoint) and its local cache can be
// written; a local dataset's index.json parses and lists shards that are all there. Nothing is fetched or written.
config::Problems check_streams(const StreamingOptions& o) {
  config::Problems problems;
  for (const StreamSpec& st : o.streams) {
    const std::string local = st.split ? storage::join(st.local, *st.split) : st.local;
    if (st.remote) {
      const std::string remote = st.split ? storage::join(*st.remote, *st.split) : *st.remote;
      if (auto why = storage::unreadable(storage::join(remote, "index.json"))) {
        problems.push_back({st.key + ".remote", *why});
      }
      if (!st.local.empty()) {
        if (auto why = storage::unwritable(local, false)) problems.push_back({st.key + ".local", *why});
      }
      continue;
    }
    if (auto why = storage::unreadable(storage::join(local, "index.json"))) {
      problems.push_back({st.key + ".local", fmt::format("{} (no MDS dataset there)", *why)});
      continue;
    }
    try {
      const mds::MDSDataset ds(local);
      std::vector<std::string> missing;
      for (const mds::ShardInfo& shard : ds.shards()) {
        std::error_code ec;
        const bool raw = std::filesystem::exists(storage::join(local, shard.raw_basename), ec);
        const bool zip = shard.zip_basename && std::filesystem::exists(storage::join(local, *shard.zip_basename), ec);
        if (!raw && !zip) missing.push_back(shard.zip_basename.value_or(shard.raw_basename));
      }
      if (!missing.empty()) {
        problems.push_back(
            {st.key + ".local", fmt::format("{}: {} of the {} shards index.json lists are missing (first: {})", local,
                                            missing.size(), ds.shards().size(), missing.front())});
      }
    } catch (const Error& e) {
      problems.push_back({st.key + ".local", e.message()});
    }
  }
  return problems;
}

config::Problems check_finetuning(const LoaderOptions& o) {
  if (!o.finetuning) return {};
  if (o.finetuning->streams) return check_streams(*o.finetuning->streams);
  try {
    (void)finetuning_data_files(*o.finetuning);
  } catch (const Error& e) {
    return {{o.finetuning->data_files.empty() ? "dataset.hf_name" : "dataset.hf_kwargs.data_files", e.message()}};
  }
  return {};
}

}  // namespace

LoaderRegistry& loader_registry() {
  static LoaderRegistry* registry = [] {
    auto* r = new LoaderRegistry("data loader");
    r->add("text", parse_text_section, [](const LoaderOptions& o, const LoaderContext& ctx) {
      return std::unique_ptr<DataLoader>(std::make_unique<TextLoader>(o, ctx));
    });
    r->add("finetuning", parse_finetuning_section, [](const LoaderOptions& o, const LoaderContext& ctx) {
      return std::unique_ptr<DataLoader>(std::make_unique<FinetuningLoader>(o, ctx));
    });
    r->set_check("text", [](const LoaderOptions& o, const config::CheckContext&) { return check_streams(o.dataset); });
    r->set_check("finetuning", [](const LoaderOptions& o, const config::CheckContext&) { return check_finetuning(o); });
    return r;
  }();
  return *registry;
}

}  // namespace tessera::data
