// Exception types with a component tag.
#include "tessera/util/error.h"

namespace tessera {

Error::Error(std::string component, const std::string& message)
    : std::runtime_error("[" + component + "] " + message), component_(std::move(component)), message_(message) {}

}  // namespace tessera
