// Content hashes by the names Python's hashlib / xxhash use, as lowercase hex digests (MDS index.json stores them).
#pragma once

#include <string>
#include <string_view>

namespace tessera::util {

// Supported: "sha1", "sha256", "xxh64", "xxh3_64". Throws tessera::Error for other names.
std::string hex_digest(std::string_view algorithm, std::string_view data);
bool hash_supported(std::string_view algorithm);

}  // namespace tessera::util
