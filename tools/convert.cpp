// `convert`: exports a Tessera checkpoint (any world size or sharding) as a Hugging Face MPT folder, streaming one
// tensor at a time, so the whole model is never held in memory.
//
//   convert --checkpoint runs/x/checkpoints/ep0-ba1000 --hf-out runs/x/hf [--dtype bfloat16]
//   convert --checkpoint runs/x/checkpoints --hf-out runs/x/hf      (a save folder: its newest valid checkpoint)
//
// Exit codes: 0 success, 1 runtime failure (missing or corrupt checkpoint), 2 usage error.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <filesystem>
#include <string>

#include "tessera/checkpoint/checkpoint.h"
#include "tessera/checkpoint/hf.h"
#include "tessera/util/error.h"
#include "tessera/util/logging.h"
#include "tessera/util/tool_main.h"

namespace {

int run(int argc, char** argv) {
  CLI::App app{"Export a Tessera checkpoint as a Hugging Face MPT folder (config.json + model.safetensors).",
               "convert"};
  std::string checkpoint_dir, out_dir, dtype = "float32", latest = "latest";
  app.add_option("--checkpoint", checkpoint_dir,
                 "A checkpoint directory, or a save folder (its newest valid checkpoint is used)")
      ->required();
  app.add_option("--hf-out", out_dir, "Output folder (created; its model.safetensors and config.json are replaced)")
      ->required();
  app.add_option("--dtype", dtype, "float32, bfloat16 or float16 (default float32)")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
  app.add_option("--latest-filename", latest, "The save folder's latest symlink (default latest)");
  if (auto code = tessera::util::parse_command_line(app, argc, argv)) return *code;
  tessera::util::init_logging("info");
  namespace fs = std::filesystem;
  std::string dir = checkpoint_dir;
  if (!fs::exists(fs::path(dir) / "metadata.json") && fs::is_directory(dir)) {
    const auto found = tessera::checkpoint::find_latest_valid_checkpoint(dir, latest);
    if (!found) throw tessera::Error("convert", fmt::format("{}: no valid checkpoint in this folder", dir));
    dir = *found;
  }
  const at::ScalarType t = dtype == "bfloat16" ? at::kBFloat16 : dtype == "float16" ? at::kHalf : at::kFloat;
  tessera::checkpoint::export_checkpoint_to_hf(dir, out_dir, t);
  spdlog::info("exported {} to {} ({})", dir, out_dir, dtype);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::util::tool_main([&] { return run(argc, argv); });
}
