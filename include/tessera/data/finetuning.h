// LLM Foundry's `finetuning` data loader (llmfoundry/data/finetuning/): prompt/response and chat examples from local
// JSONL / JSON files (or MDS streams in LLM Foundry's fine-tuning layouts), tokenized as LLM Foundry tokenizes them
// (chat turns rendered with the tokenizer's chat template), examples that keep no loss-generating token after
// truncation dropped, then ordered by Composer's distributed sampler (torch's DistributedSampler) and collated by
// Seq2SeqFinetuningCollator, optionally packed by BinPackCollator. Batches equal those of LLM Foundry's
// build_finetuning_dataloader token for token (tests/composer/ test_finetuning_vs_llmfoundry.py).
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/data/loader.h"
#include "tessera/data/streaming_dataset.h"
#include "tessera/data/tokenizer.h"

namespace tessera::data {

// train_loader.dataset for `name: finetuning`, in LLM Foundry's keys.
struct FinetuningOptions {
  // A local folder of data files (JSONL/JSON, Parquet, Arrow, CSV; .gz/.zst too), a hub dataset id whose snapshot is
  // in the local Hugging Face cache, or a `datasets` builder name (json, parquet, csv, arrow) with data_files.
  std::string hf_name;
  std::string split = "train";
  std::map<std::string, std::vector<std::string>> data_files;  // hf_kwargs.data_files, by split
  std::string data_dir;                                        // hf_kwargs.data_dir: a subfolder of hf_name
  // preprocessing_fn's dict form: the columns that hold the prompt and the response.
  std::optional<std::pair<std::string, std::string>> columns;
  // preprocessing_fn as a name LLM Foundry registers (e.g. "tatsu-lab/alpaca"); empty: the one registered for
  // hf_name, if any (as LLM Foundry picks it).
  std::string preprocessor;
  int64_t max_seq_len = 2048;
  std::string target_prompts = "none";    // none | all | length>=N
  std::string target_responses = "last";  // last | all
  bool allow_pad_trimming = false;
  std::optional<double> packing_ratio;  // unset: no packing
  bool auto_packing_ratio = false;      // packing_ratio: auto
  std::optional<int64_t> max_leftover_bins_to_keep;
  bool shuffle = false;
  int64_t shuffle_seed = 0;  // Composer's dist.get_sampler seed (dataset.shuffle_seed, default 0)
  std::string date_string;   // given to chat templates; empty: today's date as "%d %b %Y" (LLM Foundry's)
  // `local` / `streams` instead of hf_name: MDS samples (LLM Foundry's convert_finetuning_dataset layouts: `turns`
  // json, `prompt`/`response` str, `messages` json, or legacy `input_ids`/`labels` bytes or ndarrays) in Streaming's
  // order, as LLM Foundry's StreamingFinetuningDataset reads them (not filtered: an example left without loss tokens
  // after truncation is an error).
  std::optional<StreamingOptions> streams;
  std::string token_encoding_type = "int64";  // of legacy bytes columns
};

// Checks target_prompts / target_responses as LLM Foundry's validate_target_settings does; throws ConfigError-style
// tessera::Error naming `where` otherwise.
void validate_target_settings(const std::string& target_prompts, const std::string& target_responses,
                              const std::string& where);

// One prompt -> response turn of a tokenized example.
struct FinetuningTurn {
  std::vector<int32_t> prompt;    // input_ids
  std::vector<int32_t> response;  // labels
};

// A tokenized example (LLM Foundry's {"turns": [...]}).
struct FinetuningExample {
  std::vector<FinetuningTurn> turns;
};

// The tokenizer a fine-tuning run uses, with what LLM Foundry takes from its folder: the chat template (its own, or
// LLM Foundry's ChatML fallback), the special tokens given to the template, the pad id (eos when there is no pad
// token) and the padding side.
class ChatTokenizer {
 public:
  ChatTokenizer(Tokenizer tokenizer, const std::string& date_string);
  const Tokenizer& tokenizer() const { return tok_; }
  // The pad token's id, else the eos token's (LLM Foundry pads with eos); unset when the tokenizer has neither.
  std::optional<int32_t> pad_token_id() const { return pad_id_; }
  std::optional<int32_t> eos_token_id() const { return tok_.eos_token_id(); }
  bool pad_left() const { return tok_.padding_side() == "left"; }
  // transformers' apply_chat_template(messages, tokenize=False, add_generation_prompt=...) with this tokenizer's
  // special tokens and LLM Foundry's date_string.
  std::string apply_chat_template(const nlohmann::ordered_json& messages, bool add_generation_prompt) const;

  // A row of the data (prompt/response or chat) -> its turns, as LLM Foundry's tokenize_formatted_example. `where`
  // ("file:line") names the row in errors.
  FinetuningExample tokenize(const nlohmann::ordered_json& row, const std::string& where) const;

 private:
  struct Impl;
  Tokenizer tok_;
  std::optional<int32_t> pad_id_;
  std::shared_ptr<const Impl> impl_;
};

// An example's input_ids and labels (kIgnoreLabel where no loss) before truncation, as stitch_turns_decoder_only (with
// the eos appended to the last response when it does not end with it, if `eos` is given).
std::pair<std::vector<int32_t>, std::vector<int32_t>> stitch_turns(const FinetuningExample& example,
                                                                   const std::string& target_prompts,
                                                                   const std::string& target_responses,
                                                                   std::optional<int32_t> eos);

// Appends the rows of a data file (records.h: JSONL, a JSON array, Parquet, Arrow, CSV, by its name; plain, .gz or
// .zst), each with where it is ("file:line", or "file[index]" for arrays and columnar files); a malformed line or a
// non-object is an error naming it.
void append_json_rows(const std::string& path, std::vector<std::pair<nlohmann::ordered_json, std::string>>& rows);

// LLM Foundry's preprocessing functions registered by dataset name in llmfoundry/data/finetuning/tasks.py
// (tatsu-lab/alpaca, HuggingFaceH4/databricks_dolly_15k, bigscience/P3, Muennighoff/P3, Muennighoff/flan,
// teknium/OpenHermes-2.5, math-ai/StackMathQA, AI-MO/NuminaMath-CoT): whether `name` is one, and a row reformatted by
// it (prompt/response or messages); a row it cannot process is an error naming `where`.
bool is_registered_preprocessor(const std::string& name);
nlohmann::ordered_json apply_registered_preprocessor(const std::string& name, const nlohmann::ordered_json& row,
                                                     const std::string& where);

// The rows of the split `options` select: each object with its "file:line" (JSONL) or "file[index]" (JSON array).
// Errors name the file and line: a malformed line, a row that is not an object, no file for the split.
std::vector<std::pair<nlohmann::ordered_json, std::string>> read_finetuning_rows(const FinetuningOptions& options);
// The data files read_finetuning_rows reads (hf_name's split files, or hf_kwargs.data_files'), each checked to exist;
// throws tessera::Error naming the folder, file or key otherwise. Reads none of them.
std::vector<std::string> finetuning_data_files(const FinetuningOptions& options);

// A fine-tuning batch: input_ids (B, T) int64, labels (B, T) with kIgnoreLabel where no loss, attention_mask (B, T)
// int64, sequence_id (B, T) int64 (-1 on padding; packed examples numbered 0, 1, ... within a row).
struct FinetuningBatch {
  at::Tensor input_ids, labels, attention_mask, sequence_id;
  int64_t examples = 0;  // raw examples collated into it
};

// Packing statistics of an epoch so far (BinPackCollator's): tokens of the examples given to the packer, tokens in
// the rows it emitted, and rows emitted (each max_seq_len long).
struct PackingStats {
  int64_t total_tokens = 0, packed_tokens = 0, rows = 0;
};

// The tokenized, filtered examples of a split and how they are batched.
class FinetuningDataset {
 public:
  // Reads, tokenizes and filters the split (examples that keep no loss token within max_seq_len are dropped, counted
  // and logged). `device_batch_size`: rows per batch; with packing, int(device_batch_size * packing_ratio) examples
  // are packed into them. `world_size`: ranks (packing_ratio auto agrees on the smallest ratio over all of them).
  FinetuningDataset(const FinetuningOptions& options, const ChatTokenizer& tokenizer, int64_t device_batch_size,
                    int64_t world_size = 1, int64_t ranks_per_node = 0);

  // Examples: those read from files (after dropping), or the MDS streams' epoch size.
  int64_t size() const { return mds_ ? mds_->epoch_size() : static_cast<int64_t>(examples_.size()); }
  int64_t dropped() const { return dropped_; }
  double packing_ratio() const { return packing_ratio_; }
  // Examples per batch drawn from the sampler (device_batch_size without packing).
  int64_t examples_per_batch() const { return examples_per_batch_; }
  const FinetuningOptions& options() const { return o_; }
  bool pad_left() const { return pad_left_; }

  // This rank's example indices for `epoch`, as torch's DistributedSampler(shuffle, seed=shuffle_seed, drop_last)
  // orders them after set_epoch(epoch).
  std::vector<int64_t> sampler_indices(int64_t epoch, int64_t world_size, int64_t rank, bool drop_last) const;
  // Batches in an epoch for one rank (the DataLoader's length).
  int64_t batches_in_epoch(int64_t world_size, bool drop_last) const;

  // Rows being collated or packed: tokens, labels, packed-example ids and their length.
  struct Bin {
    int64_t size = 0;
    std::vector<int64_t> ids, labels, sequence_id;
  };

  // One epoch's batches for one rank, collated (and packed: leftover bins carry from batch to batch) in order. To
  // resume mid-epoch, call next() and drop the batches already trained on, as Composer does.
  class Epoch {
   public:
    Epoch(const FinetuningDataset& ds, int64_t epoch, int64_t world_size, int64_t rank, bool drop_last);
    std::optional<FinetuningBatch> next();
    const PackingStats& packing_stats() const { return stats_; }

   private:
    std::vector<Bin> pack(std::vector<Bin> examples);
    const FinetuningDataset& ds_;
    std::vector<int64_t> order_;             // example indices (files), or
    std::vector<std::vector<int64_t>> mds_;  // this rank's batches of MDS sample ids
    size_t at_ = 0;
    bool drop_last_;
    bool seen_first_ = false;
    std::vector<Bin> leftovers_;
    PackingStats stats_;
  };

 private:
  FinetuningOptions o_;
  int64_t device_batch_size_;
  int32_t pad_id_;
  bool pad_left_;
  std::optional<int32_t> eos_;
  std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> examples_;  // stitched (ids, labels)
  // MDS samples: the dataset, the tokenizer for untokenized layouts, this process's place.
  std::unique_ptr<StreamingDataset> mds_;
  std::optional<ChatTokenizer> tokenizer_;
  int64_t ranks_per_node_ = 1;
  std::pair<std::vector<int32_t>, std::vector<int32_t>> mds_example(int64_t sample) const;
  // torch's DistributedSampler: examples per rank, the whole epoch's order (shuffled from shuffle_seed + epoch; the
  // tail padded by repeating or cut), and a rank's share of it (every world_size-th from `rank`).
  int64_t per_rank(int64_t world_size, bool drop_last) const;
  std::vector<int64_t> sampler_order(int64_t epoch, int64_t world_size, bool drop_last) const;
  static std::vector<int64_t> rank_slice(const std::vector<int64_t>& order, int64_t world_size, int64_t rank);
  int64_t dropped_ = 0;
  double packing_ratio_ = 1;
  int64_t examples_per_batch_;
};

// A trainer's view of one epoch of a FinetuningDataset: TokenBatches with the attention mask when padding is on the
// left and the packed-example ids when packing; the first `skip` batches are collated and dropped (resuming).
class FinetuningBatches : public BatchIterator {
 public:
  FinetuningBatches(const FinetuningDataset& ds, int64_t epoch, int64_t world_size, int64_t rank, bool drop_last,
                    int64_t skip);
  std::optional<TokenBatch> next() override;

 private:
  FinetuningDataset::Epoch epoch_;
  bool packed_;
  bool pad_left_;
};

// LLM Foundry's auto_packing_ratio: profiles packing ratios 1 .. max_seq_len / 100 on the first examples of the
// epoch-0 order and returns the largest with no waste (1 when max_seq_len <= 100).
double profile_auto_packing_ratio(const std::vector<int64_t>& sizes_in_order, int64_t device_batch_size,
                                  int64_t max_seq_len, std::optional<int64_t> max_leftover_bins_to_keep);

}  // namespace tessera::data
