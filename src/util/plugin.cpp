#include "tessera/util/plugin.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <filesystem>

#include "tessera/util/error.h"

namespace tessera::util {

void load_plugin(const std::string& path) {
  // dlopen searches the library path for a bare name; a plug-in is a file the user names.
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw ConfigError("plugin", fmt::format("{}: no such file (--plugin takes the path of a shared library)", path));
  }
  const std::string where = path.find('/') == std::string::npos ? "./" + path : path;
  if (dlopen(where.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    const char* why = dlerror();
    throw ConfigError("plugin", fmt::format("{}: cannot load: {}", path, why != nullptr ? why : "unknown error"));
  }
}

void load_plugins(const std::vector<std::string>& paths) {
  for (const std::string& p : paths) load_plugin(p);
}

}  // namespace tessera::util
