// spdlog configuration for the tools and for embedding applications.
#include "tessera/util/logging.h"

#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "tessera/util/error.h"

namespace tessera::util {

void init_logging(const std::string& level, int rank) {
  const auto lvl = spdlog::level::from_str(level);
  // from_str maps anything unknown to "off"; only accept it when asked for literally.
  if (lvl == spdlog::level::off && level != "off") {
    throw ConfigError("logging", fmt::format("unknown log level \"{}\" (trace, debug, info, warn, error, off)", level));
  }
  // Not created through the registry (stderr_color_mt would refuse a second "tessera"); set_default_logger replaces
  // the previous default, so init_logging may be called again. (Dropping the name would also reset the default.)
  auto logger = std::make_shared<spdlog::logger>("tessera", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  spdlog::set_default_logger(logger);
  const std::string prefix = rank >= 0 ? fmt::format("[rank {}] ", rank) : "";
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] " + prefix + "%v");
  spdlog::set_level(lvl);
}

}  // namespace tessera::util
