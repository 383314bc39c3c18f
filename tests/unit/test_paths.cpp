// The paths the build compiled into the tests (test_util.h): this file alone is built with them (tests/CMakeLists.txt),
// so every other test file compiles to the same object in any checkout and ccache serves a fresh clone's build.
#include "test_util.h"

namespace tessera::testing {

const char* built_source_dir() {
  return TESSERA_BUILT_SOURCE_DIR;
}
const char* built_train_bin() {
  return TESSERA_BUILT_TRAIN_BIN;
}

}  // namespace tessera::testing
