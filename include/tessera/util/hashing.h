// Content hashes by the names Python's hashlib and xxhash give them (the names MosaicML Streaming writes into an MDS
// index.json), as lowercase hex digests: hashlib's through OpenSSL's EVP, xxhash's through libxxhash.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tessera::util {

// Every name hex_digest() computes, sorted: blake2b, blake2s, md5, sha1, sha224, sha256, sha384, sha3_224, sha3_256,
// sha3_384, sha3_512, sha512 (hashlib: blake2b and blake2s at their default sizes, 64 and 32 bytes), xxh128, xxh32,
// xxh3_128, xxh3_64, xxh64 (xxhash, seed 0; digests in its canonical, big-endian order).
const std::vector<std::string>& supported_hashes();
bool hash_supported(std::string_view algorithm);

// `data`'s digest under `algorithm`. Throws tessera::Error naming the algorithm and the supported names for others.
std::string hex_digest(std::string_view algorithm, std::string_view data);
// The SHA-256 of the concatenation of `parts` (a file held in several buffers), as hex: a Git LFS object id.
std::string sha256_hex(const std::vector<std::string_view>& parts);

}  // namespace tessera::util
