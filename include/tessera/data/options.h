// Options of the tokenizer and of the data loaders (`tokenizer:`, `train_loader:`, `eval_loader:`), in LLM
// Foundry's schema. The loader's dataset keys are mosaicml-streaming's StreamingDataset arguments.
#pragma once

#include <any>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/config/registry.h"
#include "tessera/data/finetuning.h"
#include "tessera/data/loader.h"
#include "tessera/data/streaming_dataset.h"

namespace tessera::data {

struct TokenizerOptions {
  std::string name;                         // a tokenizer.json, a folder, or a hub id in the local HF cache
  std::optional<int64_t> model_max_length;  // kwargs.model_max_length
};

// `train_loader` / `eval_loader` with `name: text`: Streaming's dataset options (the `dataset:` keys; the per-device
// batch_size is the trainer's to set) and how samples become token batches; one struct, handed as it is to
// StreamingDataset and TokenBatchLoader.
struct LoaderOptions {
  std::string name = "text";
  StreamingOptions dataset;   // streams (`local`/`split` form stream 0 when `streams` is absent), shuffle, seeds, ...
  TokenLoaderOptions tokens;  // dataset.max_seq_len, dataset.token_encoding_type, drop_last, prefetch_factor
  int64_t num_workers = 0;    // background reader threads (0: read on the training thread)
  // `name: finetuning`: LLM Foundry's fine-tuning dataset keys (dataset/tokens above are unused then, except
  // tokens.max_seq_len and tokens.drop_last, which default to false here as in build_finetuning_dataloader).
  std::optional<FinetuningOptions> finetuning;
  // A registered research loader's own options (its parser's to fill, its builder's to read).
  std::any extra;
};

TokenizerOptions parse_tokenizer_options(config::Section& s);
// The parsers of the built-in loaders (what loader_registry(), data_loader.h, runs for `text` and `finetuning`; they
// read everything except `name`), also for tools that parse one section directly.
LoaderOptions parse_text_section(config::Section& s);
LoaderOptions parse_finetuning_section(config::Section& s);

}  // namespace tessera::data
