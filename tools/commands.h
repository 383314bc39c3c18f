// Tessera's commands, each a function taking its own command line (argv[0]: the command's name), run by the
// `tessera` program (tools/tessera.cpp) as `tessera <command> ...` or through a link named as the command's old
// program name (build/bin/train ...).
#pragma once

#include <array>
#include <string_view>

namespace tessera::cli {

int train_main(int argc, char** argv);
int eval_main(int argc, char** argv);
int generate_main(int argc, char** argv);
int export_main(int argc, char** argv);
int plan_main(int argc, char** argv);
int tokenizer_main(int argc, char** argv);
int text_to_mds_main(int argc, char** argv);
int serve_main(int argc, char** argv);

struct Command {
  std::string_view name;      // `tessera <name>`
  std::string_view old_name;  // the program it was before `tessera` (a link to `tessera` in bin/); empty: none
  std::string_view summary;
  int (*main)(int argc, char** argv);
};

inline constexpr std::array<Command, 8> kCommands{{
    {"train", "train", "Train a model from a recipe, or check the recipe and print the plan (--dry-run)", train_main},
    {"eval", "eval", "Evaluate a model on in-context-learning tasks and the Eval Gauntlet", eval_main},
    {"generate", "generate", "Generate text from an HF folder, a checkpoint or a save folder", generate_main},
    {"serve", "", "Serve a model over OpenAI's HTTP API (completions, chat, models), batching requests", serve_main},
    {"export", "convert", "Export a checkpoint as a Hugging Face folder (config.json + safetensors)", export_main},
    {"plan", "plan", "Plan several training jobs on one cluster jointly, and run the plan", plan_main},
    {"tokenizer", "train_tokenizer", "Train a byte-level BPE tokenizer and write tokenizer.json", tokenizer_main},
    {"text-to-mds", "convert_text_to_mds", "Convert text corpora (JSONL, Parquet, Arrow, CSV, text) to MDS shards",
     text_to_mds_main},
}};

}  // namespace tessera::cli
