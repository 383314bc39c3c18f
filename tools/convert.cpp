// `convert`: exports a Tessera checkpoint (any world size or sharding) as a Hugging Face folder, streaming one tensor
// at a time, so the whole model is never held in memory. By default the folder is one that transformers'
// AutoModelForCausalLM loads as the same function (an MPT with learned positions becomes GPT-2; a model no
// transformers architecture represents is refused with the reason); --layout llm-foundry writes the family's own
// layout instead (LLM Foundry's MPT class loads it).
//
//   convert --checkpoint runs/x/checkpoints/ep0-ba1000 --hf-out runs/x/hf [--dtype bfloat16] [--max-shard-size 5GB]
//           [--transformers-version 4]   (config.json as transformers 4 writes it; default: as transformers 5 does)
//   convert --checkpoint runs/x/checkpoints --hf-out runs/x/hf      (a save folder: its newest valid checkpoint)
//   convert --checkpoint s3://bucket/run/checkpoints --hf-out s3://bucket/run/hf       (either side in object storage)
//
// The folder also gets generation_config.json and the tokenizer's files: --tokenizer (a tokenizer.json, a folder or a
// hub id in the local HF cache), by default the recipe's tokenizer.name recorded in the checkpoint (skipped with a
// warning when it does not resolve here); --tokenizer none copies none.
//
// Exit codes: 0 success, 1 runtime failure (missing or corrupt checkpoint), 2 usage error.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <cctype>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "commands.h"
#include "tessera/checkpoint/checkpoint.h"
#include "tessera/checkpoint/hf.h"
#include "tessera/storage/storage.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"
#include "tessera/util/hf_hub.h"
#include "tessera/util/logging.h"
#include "tessera/util/tool_main.h"

namespace {

// "5GB", "200MB", "1024" -> bytes (decimal units, as transformers' save_pretrained reads them).
uint64_t parse_size(const std::string& text) {
  size_t end = 0;
  double value = 0;
  try {
    value = std::stod(text, &end);
  } catch (const std::exception&) {
    end = 0;
  }
  std::string unit = text.substr(end);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const std::map<std::string, double> units = {{"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}};
  if (end == 0 || !units.count(unit) || value <= 0) {
    throw tessera::ConfigError("convert",
                               fmt::format("--max-shard-size {}: expected a size such as 5GB or 200MB", text));
  }
  return static_cast<uint64_t>(value * units.at(unit));
}

int run(int argc, char** argv) {
  CLI::App app{"Export a Tessera checkpoint as a Hugging Face folder (config.json + safetensors).", "convert"};
  tessera::util::add_plugin_option(app);
  std::string checkpoint_dir, out_dir, dtype = "float32", latest = "latest", layout = "transformers",
                                       shard_size = "5GB";
  app.add_option("--checkpoint", checkpoint_dir,
                 "A checkpoint directory, or a save folder (its newest valid checkpoint is used)")
      ->required();
  app.add_option("--hf-out", out_dir, "Output folder (created; its model.safetensors and config.json are replaced)")
      ->required();
  app.add_option("--dtype", dtype, "float32, bfloat16 or float16 (default float32)")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
  app.add_option("--latest-filename", latest, "The save folder's latest symlink (default latest)");
  app.add_option("--layout", layout,
                 "transformers (default: a folder AutoModelForCausalLM loads as the same function) or llm-foundry "
                 "(the family's own layout, for LLM Foundry's MPT class)")
      ->check(CLI::IsMember({"transformers", "llm-foundry"}));
  app.add_option("--max-shard-size", shard_size,
                 "Split the weights into shards of at most this size, with an index (default 5GB; units B, KB, MB, "
                 "GB, as in save_pretrained)");
  int transformers_version = 5;
  app.add_option("--transformers-version", transformers_version,
                 "The transformers major version that loads the folder: 5 (default; the rotary settings in "
                 "rope_parameters) or 4 (rope_theta, rope_scaling: transformers 5 reads it too)")
      ->check(CLI::IsMember({4, 5}));
  std::string tokenizer;
  app.add_option("--tokenizer", tokenizer,
                 "Tokenizer files to copy: a tokenizer.json, a folder or a hub id (default: the recipe's "
                 "tokenizer.name from the checkpoint; none: copy none)");
  if (auto code = tessera::util::parse_command_line(app, argc, argv)) return *code;
  tessera::util::init_logging("info");
  namespace fs = std::filesystem;
  namespace storage = tessera::storage;
  std::string dir = checkpoint_dir;
  const bool remote_in = storage::is_remote(dir);
  if (remote_in ? !storage::stat(storage::join(dir, "metadata.json")).has_value()
                : !fs::exists(fs::path(dir) / "metadata.json") && fs::is_directory(dir)) {
    // Remote: sizes only here; the reader verifies each file's checksum as it downloads it.
    const auto found = tessera::checkpoint::find_latest_valid_checkpoint(dir, latest, /*verify_checksums=*/!remote_in);
    if (!found) throw tessera::Error("convert", fmt::format("{}: no valid checkpoint in this folder", dir));
    dir = *found;
  }
  const at::ScalarType t = dtype == "bfloat16" ? at::kBFloat16 : dtype == "float16" ? at::kHalf : at::kFloat;
  const uint64_t max_shard_bytes = parse_size(shard_size);
  std::optional<fs::path> tokenizer_path;
  if (tokenizer.empty()) {
    if (const auto recorded = tessera::checkpoint::checkpoint_tokenizer_name(dir)) {
      try {
        tokenizer_path = tessera::util::resolve_hf_tokenizer(*recorded);
      } catch (const tessera::Error& e) {
        spdlog::warn("convert: the recipe's tokenizer is not copied: {} (pass --tokenizer)", e.message());
      }
    }
  } else if (tokenizer != "none") {
    tokenizer_path = tessera::util::resolve_hf_tokenizer(tokenizer);
  }
  // An object-store destination gets the folder written complete in $TMPDIR first, then uploaded (config.json last).
  std::optional<tessera::util::TempFolder> staging;
  if (storage::is_remote(out_dir)) staging.emplace("tessera-convert");
  tessera::checkpoint::export_checkpoint_to_hf(
      dir, staging ? staging->path : out_dir, t,
      layout == "llm-foundry" ? tessera::checkpoint::HfLayout::kFamily : tessera::checkpoint::HfLayout::kTransformers,
      max_shard_bytes, tokenizer_path, transformers_version);
  if (staging) storage::upload_tree(staging->path, out_dir, {"config.json"});
  spdlog::info("exported {} to {} ({})", dir, out_dir, dtype);
  return 0;
}

}  // namespace

int tessera::cli::export_main(int argc, char** argv) {
  return tessera::util::tool_main([&] { return run(argc, argv); });
}
