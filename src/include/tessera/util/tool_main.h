// The shared skeleton of Tessera's commands (`tessera train`, `tessera eval`, ...: tools/tessera.cpp): command-line
// parsing with CLI11 and the mapping of exceptions to exit codes (0 success, 1 runtime failure, 2 usage or
// configuration error), with "error: <message>" on stderr.
//
//   int tessera::cli::train_main(int argc, char** argv) {
//     return tessera::util::tool_main([&] { return run(argc, argv); });
//   }
#pragma once

#include <CLI/CLI.hpp>

#include <exception>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "tessera/util/error.h"
#include "tessera/util/plugin.h"
#include "tessera/version.h"

namespace tessera::util {

template <class Body>
int tool_main(Body&& body) {
  try {
    return body();
  } catch (const Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return e.exit_code();
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kExitRuntimeError;
  }
}

// --plugin PATH (repeatable): shared libraries that register components by name (util/plugin.h), loaded as the
// command line is parsed, before the tool reads a recipe or builds a model.
inline void add_plugin_option(CLI::App& app) {
  app.add_option_function<std::vector<std::string>>(
      "--plugin", [](const std::vector<std::string>& paths) { load_plugins(paths); },
      "A shared library registering components (models and their HF model_types, losses, metrics, ...) by name; "
      "repeatable (docs/api.md#plug-ins)");
}

// How the running command is invoked: "tessera train" (set by the dispatcher), the command's own name otherwise.
inline std::string& command_name() {
  static std::string name;
  return name;
}

// Set by `tessera completion`: parse_command_line() hands it the command's finished definitions instead of parsing.
inline std::function<void(const CLI::App&)>& command_inspector() {
  static std::function<void(const CLI::App&)> inspect;
  return inspect;
}

// The command line that runs `command` again in this program (the launcher's ranks): the multi-call binary through
// /proc/self/exe, then the command.
inline std::vector<std::string> self_command(const std::string& command) {
  return {"/proc/self/exe", command};
}

// "<name> (Tessera <version>, built with LibTorch <version>)".
inline std::string version_line(const std::string& name) {
  return name + " (Tessera " + version() + ", built with LibTorch " TESSERA_TORCH_VERSION ")";
}

// Parses the command line; returns the exit code to stop with (help or --version printed, or a usage error), else
// nullopt. The app is named as the command was invoked (command_name()) in its usage line and --version.
inline std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
  if (!command_name().empty()) app.name(command_name());
  app.set_version_flag("--version", version_line(app.get_name()));
  if (command_inspector()) {
    command_inspector()(app);
    return kExitOk;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitUsageError;
  }
  return std::nullopt;
}

}  // namespace tessera::util
