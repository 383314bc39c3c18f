// Helpers shared by the unit tests.
#pragma once

#include <functional>
#include <string>

#include "tessera/util/error.h"

namespace tessera::testing {

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
