// The `tessera` program: its commands, help, versions, the old program names as links to it, and the completion
// script generated from the commands' own definitions.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "test_util.h"

// A named namespace: the sanitizer trees' unity batches put this file beside train_cli_test.cpp.
namespace tessera_cli_test {
namespace {

namespace fs = std::filesystem;
using Result = ::tessera::testing::CommandResult;

const std::string kBin = fs::path(::tessera::testing::train_bin()).parent_path().string();
const std::string kTessera = kBin + "/tessera";
const std::string kSource = ::tessera::testing::source_dir();

Result run(const std::string& args) {
  return ::tessera::testing::run_command(kTessera + " " + args);
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Help text less its usage line (which names the program as it was invoked).
std::string without_usage(const std::string& help) {
  std::istringstream in(help);
  std::string out;
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with("Usage:")) out += line + "\n";
  }
  return out;
}

TEST(TesseraCli, HelpListsEveryCommandAndTheExitCodes) {
  const Result r = run("--help");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* command :
       {"train", "eval", "generate", "export", "plan", "tokenizer", "text-to-mds", "completion"}) {
    EXPECT_TRUE(has(r.output, std::string("\n  ") + command + " ")) << command << "\n" << r.output;
  }
  EXPECT_TRUE(has(r.output, "75   stopped by a preemption signal")) << r.output;
  const Result none = run("");
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_TRUE(has(none.output, "Usage: tessera <command>")) << none.output;
}

TEST(TesseraCli, EveryCommandHasHelpAndAVersionUnderItsName) {
  for (const char* command : {"train", "eval", "generate", "export", "plan", "tokenizer", "text-to-mds"}) {
    const Result help = run(std::string(command) + " --help");
    EXPECT_EQ(help.exit_code, 0) << command << "\n" << help.output;
    EXPECT_TRUE(has(help.output, std::string("Usage: tessera ") + command + " ")) << help.output;
  }
  // --version is named as the command was invoked (plan's once printed an empty name).
  for (const char* command : {"train", "plan"}) {
    const Result version = run(std::string(command) + " --version");
    EXPECT_EQ(version.exit_code, 0) << version.output;
    EXPECT_TRUE(version.output.starts_with(std::string("tessera ") + command + " (Tessera ")) << version.output;
    EXPECT_TRUE(has(version.output, "built with LibTorch ")) << version.output;
  }
  EXPECT_TRUE(run("--version").output.starts_with("tessera (Tessera "));
  const Result via_help = run("help export");
  EXPECT_EQ(via_help.exit_code, 0);
  EXPECT_TRUE(has(via_help.output, "Usage: tessera export ")) << via_help.output;
}

TEST(TesseraCli, UnknownCommandsAreRefusedByNameWithTheNewNameOfAnOldOne) {
  const Result r = run("trian --recipe x.yaml");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "error: tessera has no command 'trian'; tessera --help lists them\n");
  const Result old = run("convert --checkpoint c --hf-out h");
  EXPECT_EQ(old.exit_code, 2);
  EXPECT_TRUE(has(old.output, "(`convert` is `tessera export` now)")) << old.output;
  EXPECT_EQ(run("completion fish").exit_code, 2);
  const Result option = run("--recipe x.yaml");
  EXPECT_EQ(option.exit_code, 2);
  EXPECT_EQ(option.output,
            "error: '--recipe' comes after a command: tessera <command> --recipe ... (tessera --help lists "
            "them)\n");
}

// The old program names are links to `tessera` that run their command, named as before (no notice without a
// terminal on stderr); a command it runs through them runs the same code as `tessera <command>`.
TEST(TesseraCli, TheOldProgramNamesRunTheirCommands) {
  for (const auto& [old_name, command] : {std::pair{"train", "train"},
                                          {"eval", "eval"},
                                          {"generate", "generate"},
                                          {"convert", "export"},
                                          {"plan", "plan"},
                                          {"train_tokenizer", "tokenizer"},
                                          {"convert_text_to_mds", "text-to-mds"}}) {
    const fs::path link = fs::path(kBin) / old_name;
    ASSERT_TRUE(fs::is_symlink(link)) << link;
    EXPECT_EQ(fs::read_symlink(link), "tessera");
    const Result version = ::tessera::testing::run_command(link.string() + " --version");
    EXPECT_EQ(version.exit_code, 0) << version.output;
    EXPECT_TRUE(version.output.starts_with(std::string(old_name) + " (Tessera ")) << version.output;
    if (std::string(old_name) != "convert") continue;  // one command's help both ways: the renamed one
    const Result help = ::tessera::testing::run_command(link.string() + " --help");
    const Result same = run(std::string(command) + " --help");
    EXPECT_TRUE(has(help.output, std::string("Usage: ") + old_name + " ")) << help.output;
    EXPECT_EQ(without_usage(help.output), without_usage(same.output)) << old_name;
  }
  const Result dry = run("train --recipe " + kSource + "/recipes/mpt-tiny-cpu.yaml --dry-run --no-preflight");
  EXPECT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_TRUE(has(dry.output, "parameters")) << dry.output;
}

// bash completes the commands, each command's options (from its CLI11 definitions, so a new option is offered without
// editing the script) and file names after an option that takes a value. zsh's script is the same through
// bashcompinit.
TEST(TesseraCli, CompletionScriptsCompleteCommandsOptionsAndFiles) {
  const Result bash = run("completion bash");
  ASSERT_EQ(bash.exit_code, 0) << bash.output;
  const fs::path dir = fs::temp_directory_path() / "tessera_completion";
  fs::create_directories(dir);
  std::ofstream(dir / "tessera.bash") << bash.output;
  std::ofstream(dir / "recipe-one.yaml") << "x: 1\n";
  auto complete = [&](const std::string& words, int cword) {
    std::ofstream(dir / "complete.sh") << "cd " << dir.string() << " && source tessera.bash && COMP_WORDS=(" << words
                                       << ") && COMP_CWORD=" << cword
                                       << " && _tessera_complete && printf '%s\\n' \"${COMPREPLY[@]}\"\n";
    return ::tessera::testing::run_command("bash " + (dir / "complete.sh").string()).output;
  };
  EXPECT_EQ(complete("tessera ex", 1), "export\n");
  EXPECT_EQ(complete("tessera train --rec", 2), "--recipe\n");
  EXPECT_TRUE(has(complete("tessera train --", 2), "--nproc-per-node\n"));
  EXPECT_TRUE(has(complete("tessera export --", 2), "--transformers-version\n"));
  EXPECT_TRUE(has(complete("tessera plan --", 2), "--jobs\n"));
  EXPECT_EQ(complete("tessera train --recipe reci", 3), "recipe-one.yaml\n");
  EXPECT_EQ(complete("tessera completion z", 2), "zsh\n");
  const Result zsh = run("completion zsh");
  EXPECT_EQ(zsh.exit_code, 0);
  EXPECT_TRUE(has(zsh.output, "bashcompinit")) << zsh.output;
  EXPECT_TRUE(has(zsh.output, "complete -o filenames -F _tessera_complete tessera")) << zsh.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera_cli_test
