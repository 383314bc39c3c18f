// Streaming conversion of text corpora to MDS, with LLM Foundry's semantics (scripts/data_prep/convert_dataset_json.py,
// convert_dataset_hf.py and convert_text_to_mds.py: NoConcatDataset and ConcatTokensDataset), for corpora of any size:
//
//  - rows come from records.h's readers (JSONL/JSON plain, .gz or .zst; Parquet; Arrow; CSV; text; fortunes), local
//    or s3://, one batch at a time; only the text column is read from columnar files;
//  - tokenization runs on `workers` threads; blocks of documents are written in input order, so the output does not
//    depend on the number of workers;
//  - memory is bounded by a few blocks of documents (2 x workers + 2 blocks of at most 4 MiB of text) plus the open
//    shard of each split, whatever the corpus size;
//  - progress (bytes, documents, tokens, rates and ETA) goes to a callback;
//  - a local conversion is resumable: after every finished shard, index.json lists the shards so far and
//    <output>/.tessera-convert.json says where each split continues (document and token offset); running the same
//    conversion again after a crash keeps those shards and writes the rest, and the result equals an uninterrupted
//    run byte for byte.
//
// With concat_tokens every document is encoded (the tokenizer's post-processor applied, as Foundry's
// `tokenizer(text)`), appended to a running buffer as bos + ids + eos, and every full `concat_tokens` tokens become one
// sample {"tokens": ndarray:int32}; the remainder wraps into the next sample (or is dropped with no_wrap); the final
// partial buffer is dropped. Without it, each document becomes a sample {"text": str}. Every row counts as a document,
// empty ones too (as in LLM Foundry). A document goes to the val split when a hash of (seed, its index) falls below
// val_fraction, else to train; each split keeps input order.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tessera/data/records.h"

namespace tessera::data {

struct ConvertProgress {
  uint64_t bytes_read = 0, total_bytes = 0;  // of the input files (total 0 when unknown, e.g. remote)
  int64_t documents = 0, samples = 0, tokens = 0;
  double seconds = 0;
  bool done = false;
};

struct ConvertOptions {
  std::vector<std::string> inputs;     // files, folders or s3:// prefixes
  std::optional<RecordFormat> format;  // nullopt: each file's name says
  std::string text_column = "text";    // the column holding the document
  std::string output;                  // folder or s3://bucket/prefix; splits go to <output>/<split>
  std::string tokenizer;               // tokenizer.json, its folder or a cached hub id; empty: raw text samples
  int64_t concat_tokens = 0;           // tokens per sample; 0: raw text samples
  std::string bos_text, eos_text;      // texts whose tokens start / end every document
  bool no_wrap = false;                // drop what is left of a document after a sample instead of carrying it
  std::optional<std::string> compression = "zstd";  // zstd, zstd:LEVEL, gz, gz:LEVEL; nullopt: none
  double val_fraction = 0;                          // share of documents for <output>/val
  uint64_t seed = 17;                               // of the train/val assignment
  std::string train_split = "train";                // split folder names
  std::string val_split = "val";
  int workers = 0;                          // tokenization threads; 0: all cores
  int64_t block_documents = 2048;           // documents per block (and at most 4 MiB of text)
  uint64_t size_limit = uint64_t{1} << 26;  // uncompressed bytes per shard
  bool overwrite = false;                   // replace existing output (and forget an interrupted conversion)
  std::function<void(const ConvertProgress&)> progress;  // called about every progress_interval seconds and at the end
  double progress_interval = 1.0;
};

struct ConvertSplitResult {
  std::string name, location;
  int64_t documents = 0, samples = 0, tokens = 0;
};

struct ConvertResult {
  std::vector<ConvertSplitResult> splits;
  bool resumed = false;  // continued an interrupted conversion
  int64_t resumed_at_document = 0;
  ConvertProgress progress;
};

// Runs the conversion. Errors: ConfigError for bad options or output that is not empty (without overwrite) or holds
// an interrupted conversion of other inputs or options; tessera::Error naming the file and line / row for bad input.
ConvertResult convert_to_mds(const ConvertOptions& options);

// The one-line progress report: percent of input bytes, sizes, documents, tokens, rates and ETA.
std::string format_convert_progress(const ConvertProgress& p);

}  // namespace tessera::data
