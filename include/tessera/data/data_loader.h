// The data loader of one split as the trainer sees it (DataLoader), and the registry that parses and builds loaders
// by the recipe's `train_loader.name` / `eval_loader.name`. Built in: `text` (Streaming's MDS datasets, LLM Foundry's
// pretraining loader) and `finetuning` (LLM Foundry's fine-tuning loader). Research code registers its own loader
// the same way, and names it in its recipe: the trainer holds one DataLoader per split and knows no loader kinds.
// A DataLoader is used from the training thread only.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "tessera/config/registry.h"
#include "tessera/config/time.h"
#include "tessera/data/loader.h"
#include "tessera/data/options.h"
#include "tessera/data/tokenizer.h"

namespace tessera::data {

// What a loader is built for: its split, this rank's batch size and place in the job, and the recipe's tokenizer.
struct LoaderContext {
  std::string split = "train_loader";  // the recipe key (train_loader | eval_loader), for messages
  int64_t device_batch_size = 1;       // rows per batch on this rank
  int64_t world_size = 1;
  int64_t rank = 0;
  int64_t num_nodes = 1;
  int64_t node_rank = 0;
  int64_t local_world_size = 1;
  int64_t local_rank = 0;
  // The recipe's `tokenizer:`, loaded on first call; throws ConfigError naming the recipe and the loader.
  std::function<Tokenizer()> tokenizer;
};

class DataLoader {
 public:
  virtual ~DataLoader() = default;
  // Batches per epoch on this rank (the dataloader length), or nullopt when the loader cannot say.
  virtual std::optional<int64_t> batches_per_epoch() const = 0;
  // This rank's batches of the epoch `at` is in, starting where `at` stands (the training loop resumes mid-epoch);
  // evaluation opens at a zero Timestamp.
  virtual std::unique_ptr<BatchIterator> open(const config::Timestamp& at) = 0;
  // The loader's position at `at`, as checkpoints store it (metadata `dataset.train`), and its restore: throws
  // tessera::Error naming `where` (the checkpoint) when the state is another loader's or does not match `at`.
  virtual nlohmann::json state(const config::Timestamp& at) const = 0;
  virtual void load_state(const nlohmann::json& state, const config::Timestamp& at, const std::string& where) = 0;
};

// `name` -> parse the loader section into LoaderOptions (a research loader keeps its own options in `extra`), and
// build it for a split. The builder may throw tessera::Error (no data, a corrupt shard) naming the split.
using LoaderRegistry = config::Registry<LoaderOptions, std::unique_ptr<DataLoader>, const LoaderContext&>;
LoaderRegistry& loader_registry();

}  // namespace tessera::data
