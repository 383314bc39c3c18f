// Helpers shared by the unit tests.
#pragma once

#include <cstdlib>
#include <functional>
#include <string>

#include "tessera/util/error.h"

namespace tessera::testing {

// The source tree and the `train` binary the tests use: where the build put them, unless the environment names
// others (TESSERA_SOURCE_DIR, TESSERA_TRAIN_BIN), as tools/gpu_check.sh does for the unpacked GPU kit.
inline const char* source_dir() {
  const char* env = std::getenv("TESSERA_SOURCE_DIR");
  return env != nullptr && *env != 0 ? env : TESSERA_BUILT_SOURCE_DIR;
}
inline const char* train_bin() {
  const char* env = std::getenv("TESSERA_TRAIN_BIN");
  return env != nullptr && *env != 0 ? env : TESSERA_BUILT_TRAIN_BIN;
}

// The what() of the tessera::Error that `f` throws, or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace tessera::testing
