// Options of the tokenizer and of the text data loaders (`tokenizer:`, `train_loader:`, `eval_loader:`), in LLM
// Foundry's schema. The loader's dataset keys are mosaicml-streaming's StreamingDataset arguments.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/config/registry.h"

namespace tessera::data {

struct TokenizerOptions {
  std::string name;                         // a local directory or tokenizer.json path (no hub downloads)
  std::optional<int64_t> model_max_length;  // kwargs.model_max_length
};

struct StreamOptions {
  std::string local;                 // directory holding index.json and shards
  std::optional<std::string> split;  // sub-directory of `local`
  std::optional<double> proportion;
  std::optional<double> repeat;
  std::optional<int64_t> choose;
};

struct LoaderOptions {
  std::string name = "text";
  // dataset:
  std::vector<StreamOptions> streams;  // `local`/`split` of the dataset form stream 0 when `streams` is absent
  bool shuffle = false;
  int64_t max_seq_len = 0;
  int64_t shuffle_seed = 9176;
  std::string shuffle_algo = "py1e";  // naive | py1s | py1br | py1e
  std::optional<int64_t> shuffle_block_size;
  std::optional<int64_t> num_canonical_nodes;
  std::string partition_algo = "relaxed";     // orig | relaxed
  std::string token_encoding_type = "int64";  // for legacy `bytes` token columns
  std::optional<int64_t> epoch_size;
  // loader:
  bool drop_last = true;
  int64_t num_workers = 0;      // background reader threads (0: read on the training thread)
  int64_t prefetch_factor = 2;  // batches prefetched per worker
};

TokenizerOptions parse_tokenizer_options(config::Section& s);
// Loaders by `name` (text). The parser reads everything except `name`.
config::Registry<LoaderOptions>& loader_registry();

}  // namespace tessera::data
