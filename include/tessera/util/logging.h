// Process-wide logging setup on top of spdlog. Tessera code logs through spdlog's default logger
// (spdlog::info(...), spdlog::warn(...)); this header only configures it.
#pragma once

#include <string>

namespace tessera::util {

// Configures the default logger: messages go to stderr as "[time] [level] message", prefixed with "[rank N] " when
// rank >= 0 (set once the process is part of a distributed job). `level` is one of trace, debug, info, warn, error,
// off; an unknown level throws ConfigError. Call once at start-up, before other threads log. Not thread-safe.
void init_logging(const std::string& level = "info", int rank = -1);

}  // namespace tessera::util
