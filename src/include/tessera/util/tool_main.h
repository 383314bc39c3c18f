// The shared skeleton of Tessera's command-line tools: command-line parsing with CLI11 and the mapping of exceptions
// to exit codes (0 success, 1 runtime failure, 2 usage or configuration error), with "error: <message>" on stderr.
//
//   int main(int argc, char** argv) { return tessera::util::tool_main([&] { return run(argc, argv); }); }
#pragma once

#include <CLI/CLI.hpp>

#include <exception>
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

// Parses the command line; returns the exit code to stop with (help or --version printed, or a usage error), else
// nullopt.
inline std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
  app.set_version_flag("--version", std::string(app.get_name()) + " (Tessera " + version() +
                                        ", built with LibTorch " TESSERA_TORCH_VERSION ")");
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
