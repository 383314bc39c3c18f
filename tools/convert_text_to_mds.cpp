// `convert_text_to_mds`: text documents (fortune files, plain text files, JSONL) -> MDS, with LLM Foundry's
// semantics (scripts/data_prep/convert_text_to_mds.py, ConcatTokensDataset):
//
//   convert_text_to_mds --input /usr/share/games/fortunes --format fortunes --tokenizer tok.json
//       --output data/fortunes --concat-tokens 128 --eos-text '<|endoftext|>' --val-fraction 0.05
//
// With --concat-tokens N every document is encoded (the tokenizer's post-processor applied, as Foundry's
// `tokenizer(text)` does), appended to a running buffer as bos + ids + eos, and every full N tokens become one sample
// {"tokens": ndarray:int32}; the remainder wraps into the next sample (or is dropped with --no-wrap); the final partial
// buffer is dropped. Without it, each document becomes a sample {"text": str}. Documents go to `train` or `val` by a
// seeded shuffle of their indices (--val-fraction, --seed) and keep their order within a split. Tokenization runs on
// --workers threads (default: all cores); the output does not depend on the number of workers.
//
// Exit codes: 0 success, 1 runtime failure, 2 usage error. Output directories must not exist or be empty (unless
// --overwrite); each shard and index.json is written atomically.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include "tessera/data/documents.h"
#include "tessera/data/mds.h"
#include "tessera/data/tokenizer.h"
#include "tessera/storage/storage.h"
#include "tessera/util/device.h"
#include "tessera/util/error.h"
#include "tessera/util/hf_hub.h"
#include "tessera/util/logging.h"
#include "tessera/util/tool_main.h"

namespace {

namespace fs = std::filesystem;
using tessera::ConfigError;

struct Options {
  std::vector<fs::path> inputs;
  std::string format = "text";
  std::string output;
  std::string tokenizer;
  int64_t concat_tokens = 0;
  std::string bos_text;
  std::string eos_text;
  bool no_wrap = false;
  std::string compression = "zstd";
  double val_fraction = 0.0;
  uint64_t seed = 17;
  int workers = 0;
  bool overwrite = false;
  uint64_t size_limit = uint64_t{1} << 26;
};

// Encodes documents[i] for every i on `workers` threads (contiguous chunks; order preserved).
std::vector<std::vector<int32_t>> encode_all(const tessera::data::Tokenizer& tok, const std::vector<std::string>& docs,
                                             const std::vector<size_t>& which, int workers) {
  std::vector<std::vector<int32_t>> out(which.size());
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&] {
    try {
      for (size_t i = next.fetch_add(256); i < which.size(); i = next.fetch_add(256)) {
        for (size_t j = i; j < std::min(which.size(), i + 256); ++j) out[j] = tok.encode(docs[which[j]], true);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) threads.emplace_back(work);
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
  return out;
}

void prepare_dir(const std::string& dir, bool overwrite) {
  if (tessera::storage::is_remote(dir)) {
    const auto existing = tessera::storage::list(tessera::storage::join(dir, ""));
    if (existing.empty()) return;
    if (!overwrite) {
      throw ConfigError(
          "convert",
          fmt::format("{}: output location holds {} objects (pass --overwrite to replace them)", dir, existing.size()));
    }
    for (const auto& obj : existing) tessera::storage::remove(obj.uri);
    return;
  }
  if (fs::exists(dir) && !fs::is_empty(dir)) {
    if (!overwrite) {
      throw ConfigError("convert",
                        fmt::format("{}: output directory is not empty (pass --overwrite to replace it)", dir));
    }
    fs::remove_all(dir);
  }
}

// Writes one split; returns (samples, tokens).
std::pair<int64_t, int64_t> write_split(const Options& o, const std::string& dir, const tessera::data::Tokenizer* tok,
                                        const std::vector<std::string>& docs, const std::vector<size_t>& which,
                                        int workers) {
  prepare_dir(dir, o.overwrite);
  tessera::data::mds::WriterOptions w;
  w.out = dir;
  w.compression = o.compression == "none" ? std::nullopt : std::optional<std::string>(o.compression);
  w.size_limit = o.size_limit;
  w.exist_ok = true;
  int64_t samples = 0, tokens = 0;
  if (tok == nullptr) {
    w.columns = {{"text", "str"}};
    tessera::data::mds::MDSWriter writer(w);
    for (size_t i : which) {
      writer.write({{"text", docs[i]}});
      ++samples;
    }
    writer.finish();
    return {samples, 0};
  }
  w.columns = {{"tokens", "ndarray:int32"}};
  tessera::data::mds::MDSWriter writer(w);
  const std::vector<int32_t> bos = o.bos_text.empty() ? std::vector<int32_t>{} : tok->encode(o.bos_text, false);
  const std::vector<int32_t> eos = o.eos_text.empty() ? std::vector<int32_t>{} : tok->encode(o.eos_text, false);
  const size_t n = static_cast<size_t>(o.concat_tokens);
  std::vector<int32_t> buffer;
  // Encode in blocks so that memory stays bounded for large corpora.
  constexpr size_t kBlock = 1 << 14;
  for (size_t start = 0; start < which.size(); start += kBlock) {
    const std::vector<size_t> block(
        which.begin() + static_cast<std::ptrdiff_t>(start),
        which.begin() + static_cast<std::ptrdiff_t>(std::min(which.size(), start + kBlock)));
    for (const std::vector<int32_t>& ids : encode_all(*tok, docs, block, workers)) {
      buffer.insert(buffer.end(), bos.begin(), bos.end());
      buffer.insert(buffer.end(), ids.begin(), ids.end());
      buffer.insert(buffer.end(), eos.begin(), eos.end());
      size_t taken = 0;
      while (buffer.size() - taken >= n) {
        const at::Tensor t = at::from_blob(buffer.data() + taken, {static_cast<int64_t>(n)}, at::kInt).clone();
        writer.write({{"tokens", t}});
        ++samples;
        tokens += static_cast<int64_t>(n);
        taken = o.no_wrap ? buffer.size() : taken + n;
      }
      buffer.erase(buffer.begin(), buffer.begin() + static_cast<std::ptrdiff_t>(taken));
    }
  }
  writer.finish();
  return {samples, tokens};
}

int run(int argc, char** argv) {
  CLI::App app{"Convert text documents to MDS (LLM Foundry's convert_text_to_mds semantics).", "convert_text_to_mds"};
  Options o;
  std::vector<std::string> inputs;
  std::string log_level = "info";
  app.add_option("--input", inputs, "Files or directories of documents")->required();
  app.add_option("--format", o.format, "fortunes | text | jsonl (the `text` field)");
  app.add_option("--output", o.output,
                 "Output directory or s3://bucket/prefix (gets train/ and, with --val-fraction, val/)")
      ->required();
  app.add_option("--tokenizer", o.tokenizer, "tokenizer.json (required with --concat-tokens)");
  app.add_option("--concat-tokens", o.concat_tokens, "Tokens per sample; omit to write raw text samples")
      ->check(CLI::PositiveNumber);
  app.add_option("--bos-text", o.bos_text, "Text whose tokens start every document (e.g. '<|endoftext|>')");
  app.add_option("--eos-text", o.eos_text, "Text whose tokens end every document (e.g. '<|endoftext|>')");
  app.add_flag("--no-wrap", o.no_wrap, "Drop the tokens left over after each sample instead of carrying them over");
  app.add_option("--compression", o.compression, "zstd, zstd:LEVEL, gz, gz:LEVEL or none");
  app.add_option("--val-fraction", o.val_fraction, "Fraction of documents for the val split")
      ->check(CLI::Range(0.0, 0.5));
  app.add_option("--seed", o.seed, "Seed of the train/val assignment");
  app.add_option("--workers", o.workers, "Tokenization threads (default: all cores)")->check(CLI::NonNegativeNumber);
  app.add_option("--size-limit", o.size_limit, "Uncompressed bytes per shard");
  app.add_flag("--overwrite", o.overwrite, "Replace existing output");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off");
  if (auto code = tessera::util::parse_command_line(app, argc, argv)) return *code;
  tessera::util::init_logging(log_level);
  for (const auto& i : inputs) o.inputs.emplace_back(i);
  if (o.concat_tokens > 0 && o.tokenizer.empty()) throw ConfigError("convert", "--concat-tokens needs --tokenizer");
  if (o.concat_tokens == 0 && (!o.bos_text.empty() || !o.eos_text.empty() || o.no_wrap)) {
    throw ConfigError("convert", "--bos-text, --eos-text and --no-wrap apply only with --concat-tokens");
  }
  const int workers = o.workers > 0 ? o.workers : tessera::util::available_cores();

  const auto format = tessera::data::parse_document_format(o.format);
  const std::vector<std::string> docs = tessera::data::read_documents(o.inputs, format);
  if (docs.empty()) throw tessera::Error("convert", "the inputs hold no documents");
  std::optional<tessera::data::Tokenizer> tok;
  if (o.concat_tokens > 0) {
    tok = tessera::data::Tokenizer::from_file(tessera::util::resolve_hf_tokenizer(o.tokenizer));
    if (!tok->encode("", true).empty() && (!o.bos_text.empty() || !o.eos_text.empty())) {
      spdlog::warn("the tokenizer adds special tokens itself, and --bos-text/--eos-text add more; tokens may repeat");
    }
  }

  // Seeded assignment of documents to splits; each split keeps the original order.
  std::vector<size_t> order(docs.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(o.seed);  // a hand-written Fisher-Yates: std::shuffle's algorithm varies between libraries
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng() % i]);
  const auto n_val = static_cast<size_t>(static_cast<double>(docs.size()) * o.val_fraction);
  std::vector<size_t> val(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n_val));
  std::vector<size_t> train(order.begin() + static_cast<std::ptrdiff_t>(n_val), order.end());
  std::sort(val.begin(), val.end());
  std::sort(train.begin(), train.end());

  const auto [train_samples, train_tokens] =
      write_split(o, tessera::storage::join(o.output, "train"), tok ? &*tok : nullptr, docs, train, workers);
  std::cout << fmt::format("train: {} documents -> {} samples ({} tokens) in {}\n", train.size(), train_samples,
                           train_tokens, tessera::storage::join(o.output, "train"));
  if (n_val > 0) {
    const auto [val_samples, val_tokens] =
        write_split(o, tessera::storage::join(o.output, "val"), tok ? &*tok : nullptr, docs, val, workers);
    std::cout << fmt::format("val: {} documents -> {} samples ({} tokens) in {}\n", val.size(), val_samples, val_tokens,
                             tessera::storage::join(o.output, "val"));
  }
  return tessera::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::util::tool_main([&] { return run(argc, argv); });
}
