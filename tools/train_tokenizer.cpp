// `train_tokenizer`: train a byte-level BPE tokenizer with Tessera's trainer and write a Hugging Face tokenizer.json.
//
//   train_tokenizer --input /usr/share/games/fortunes --format fortunes --vocab-size 8192 --output tokenizer.json
//
// Exit codes: 0 success, 1 runtime failure, 2 usage error.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "commands.h"
#include "tessera/data/documents.h"
#include "tessera/data/tokenizer.h"
#include "tessera/util/error.h"
#include "tessera/util/tool_main.h"

namespace {

int run(int argc, char** argv) {
  CLI::App app{"Train a byte-level BPE tokenizer (GPT-2 style) and write tokenizer.json.", "train_tokenizer"};
  std::vector<std::string> inputs;
  std::string format = "text";
  std::string output;
  tessera::data::BpeTrainerOptions o;
  app.add_option("--input", inputs, "Input files or directories")->required();
  app.add_option("--format", format, "fortunes (documents separated by % lines), text (a document per file), jsonl")
      ->check(CLI::IsMember({"fortunes", "text", "jsonl"}));
  app.add_option("--vocab-size", o.vocab_size, "Vocabulary size including special tokens (default 8192)")
      ->check(CLI::Range(int64_t{257}, int64_t{1} << 22));
  app.add_option("--min-frequency", o.min_frequency, "Smallest pair count that is merged (default 2)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--special-tokens", o.special_tokens, "Special tokens, ids 0.. (default <|endoftext|>)");
  app.add_option("--output", output, "Where to write tokenizer.json")->required();
  if (auto code = tessera::util::parse_command_line(app, argc, argv)) return *code;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::filesystem::path> paths(inputs.begin(), inputs.end());
  const auto docs = tessera::data::read_documents(paths, tessera::data::parse_document_format(format));
  if (docs.empty()) throw tessera::ConfigError("train_tokenizer", "no documents in the inputs");
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  const auto tok = tessera::data::train_bpe_tokenizer(docs, o);
  tok.save(output);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << fmt::format("trained on {} documents ({:.1f} MB): vocab {} -> {} ({:.1f} s)\n", docs.size(),
                           static_cast<double>(bytes) / 1e6, tok.vocab_size(), output, seconds);
  return tessera::kExitOk;
}

}  // namespace

int tessera::cli::tokenizer_main(int argc, char** argv) {
  return tessera::util::tool_main([&] { return run(argc, argv); });
}
