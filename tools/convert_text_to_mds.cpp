// `convert_text_to_mds`: text corpora -> MDS, with LLM Foundry's semantics (scripts/data_prep/convert_dataset_json.py,
// convert_dataset_hf.py, convert_text_to_mds.py; ConcatTokensDataset / NoConcatDataset), streaming, multi-threaded and
// resumable (tessera/data/convert.h):
//
//   convert_text_to_mds --input corpus/ --tokenizer tok.json --output data/c4 --concat-tokens 2048
//       --eos-text '<|endoftext|>'
//
// Inputs: JSONL/JSON (plain, .gz, .zst), Parquet, Arrow, CSV, text and fortune files, folders of them, or s3://
// prefixes; the document is the --text-column column. With --concat-tokens N every document is encoded and appended
// to a running buffer as bos + ids + eos, and every full N tokens become one sample {"tokens": ndarray:int32};
// without it each document becomes a sample {"text": str}. A progress line (bytes, documents, tokens, rates, ETA)
// goes to stderr. Interrupted? Run the same command again: the finished shards are kept and the conversion continues
// where they end.
//
// Exit codes: 0 success, 1 runtime failure, 2 usage error. Output directories must not exist or be empty (unless
// --overwrite, or resuming the same conversion); each shard and index.json is written atomically.
#include <fmt/format.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>

#include "commands.h"
#include "tessera/data/convert.h"
#include "tessera/data/records.h"
#include "tessera/util/error.h"
#include "tessera/util/logging.h"
#include "tessera/util/tool_main.h"

namespace {

int run(int argc, char** argv) {
  CLI::App app{"Convert text corpora to MDS (LLM Foundry's convert_dataset_json / convert_dataset_hf semantics).",
               "convert_text_to_mds"};
  tessera::data::ConvertOptions o;
  std::string format = "auto", compression = "zstd", progress = "auto", log_level = "info";
  app.add_option("--input", o.inputs, "Files, folders or s3:// prefixes of documents")->required();
  app.add_option("--format", format,
                 "auto (by file name: .jsonl/.json/.parquet/.arrow/.csv/.txt, optionally .gz/.zst), jsonl, parquet, "
                 "arrow, csv, text (one document per file) or fortunes");
  app.add_option("--text-column", o.text_column, "Column holding the document (default: text)");
  app.add_option("--output", o.output,
                 "Output directory or s3://bucket/prefix (gets train/ and, with --val-fraction, val/)")
      ->required();
  app.add_option("--tokenizer", o.tokenizer, "tokenizer.json, its folder or a cached hub id (with --concat-tokens)");
  app.add_option("--concat-tokens", o.concat_tokens, "Tokens per sample; omit to write raw text samples")
      ->check(CLI::PositiveNumber);
  app.add_option("--bos-text", o.bos_text, "Text whose tokens start every document (e.g. '<|endoftext|>')");
  app.add_option("--eos-text", o.eos_text, "Text whose tokens end every document (e.g. '<|endoftext|>')");
  app.add_flag("--no-wrap", o.no_wrap, "Drop the tokens left over after each sample instead of carrying them over");
  app.add_option("--compression", compression, "zstd, zstd:LEVEL, gz, gz:LEVEL or none");
  app.add_option("--val-fraction", o.val_fraction, "Fraction of documents for the val split")
      ->check(CLI::Range(0.0, 0.5));
  app.add_option("--seed", o.seed, "Seed of the train/val assignment");
  app.add_option("--workers", o.workers, "Tokenization threads (default: all cores)")->check(CLI::NonNegativeNumber);
  app.add_option("--size-limit", o.size_limit, "Uncompressed bytes per shard");
  app.add_flag("--overwrite", o.overwrite, "Replace existing output (and forget an interrupted conversion)");
  app.add_option("--progress", progress, "auto (a live line on a terminal, a line every 10 s otherwise), on or off");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off");
  if (auto code = tessera::util::parse_command_line(app, argc, argv)) return *code;
  tessera::util::init_logging(log_level);
  if (format != "auto") o.format = tessera::data::parse_record_format(format);
  if (compression != "none")
    o.compression = compression;
  else
    o.compression.reset();
  if (progress != "auto" && progress != "on" && progress != "off") {
    throw tessera::ConfigError("convert", fmt::format("--progress {}: expected auto, on or off", progress));
  }
  const bool tty = isatty(STDERR_FILENO) != 0;
  if (progress != "off") {
    o.progress_interval = tty ? 0.5 : 10.0;
    o.progress = [tty](const tessera::data::ConvertProgress& p) {
      const std::string line = tessera::data::format_convert_progress(p);
      if (tty) {
        std::fprintf(stderr, "\r[convert] %s\033[K%s", line.c_str(), p.done ? "\n" : "");
      } else {
        std::fprintf(stderr, "[convert] %s\n", line.c_str());
      }
      std::fflush(stderr);
    };
  }
  const tessera::data::ConvertResult r = tessera::data::convert_to_mds(o);
  if (r.resumed) std::cout << fmt::format("resumed at document {}\n", r.resumed_at_document);
  for (const auto& s : r.splits) {
    std::cout << fmt::format("{}: {} documents -> {} samples ({} tokens) in {}\n", s.name, s.documents, s.samples,
                             s.tokens, s.location);
  }
  return tessera::kExitOk;
}

}  // namespace

int tessera::cli::text_to_mds_main(int argc, char** argv) {
  return tessera::util::tool_main([&] { return run(argc, argv); });
}
