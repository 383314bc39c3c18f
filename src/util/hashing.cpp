// Content hashes by hashlib's and xxhash's names (see hashing.h).
#include "tessera/util/hashing.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <openssl/evp.h>
#include <xxhash.h>

#include <array>
#include <cstdint>
#include <memory>
#include <utility>

#include "tessera/util/error.h"

namespace tessera::util {
namespace {

// hashlib's name -> OpenSSL's digest name.
constexpr std::array<std::pair<std::string_view, const char*>, 12> kEvp = {{
    {"blake2b", "BLAKE2B-512"},
    {"blake2s", "BLAKE2S-256"},
    {"md5", "MD5"},
    {"sha1", "SHA1"},
    {"sha224", "SHA224"},
    {"sha256", "SHA256"},
    {"sha384", "SHA384"},
    {"sha3_224", "SHA3-224"},
    {"sha3_256", "SHA3-256"},
    {"sha3_384", "SHA3-384"},
    {"sha3_512", "SHA3-512"},
    {"sha512", "SHA512"},
}};

std::string hex(const unsigned char* bytes, size_t n) {
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) out += fmt::format("{:02x}", bytes[i]);
  return out;
}

std::string evp_digest(const char* name, std::string_view data) {
  const std::unique_ptr<EVP_MD, decltype(&EVP_MD_free)> md(EVP_MD_fetch(nullptr, name, nullptr), &EVP_MD_free);
  if (!md) throw Error("hash", fmt::format("OpenSSL has no {} digest", name));
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int size = 0;
  if (EVP_Digest(data.data(), data.size(), digest.data(), &size, md.get(), nullptr) != 1) {
    throw Error("hash", fmt::format("OpenSSL's {} digest failed", name));
  }
  return hex(digest.data(), size);
}

std::string xxh128_hex(XXH128_hash_t h) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);
  return hex(c.digest, sizeof(c.digest));
}

}  // namespace

const std::vector<std::string>& supported_hashes() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& [name, evp] : kEvp) out.emplace_back(name);
    for (const char* x : {"xxh128", "xxh32", "xxh3_128", "xxh3_64", "xxh64"}) out.emplace_back(x);
    return out;
  }();
  return names;
}

bool hash_supported(std::string_view algorithm) {
  for (const std::string& name : supported_hashes()) {
    if (name == algorithm) return true;
  }
  return false;
}

std::string hex_digest(std::string_view algorithm, std::string_view data) {
  for (const auto& [name, evp] : kEvp) {
    if (name == algorithm) return evp_digest(evp, data);
  }
  if (algorithm == "xxh32") return fmt::format("{:08x}", XXH32(data.data(), data.size(), 0));
  if (algorithm == "xxh64") return fmt::format("{:016x}", XXH64(data.data(), data.size(), 0));
  if (algorithm == "xxh3_64") return fmt::format("{:016x}", XXH3_64bits(data.data(), data.size()));
  // xxhash's xxh128 is xxh3_128.
  if (algorithm == "xxh128" || algorithm == "xxh3_128") return xxh128_hex(XXH3_128bits(data.data(), data.size()));
  throw Error("hash", fmt::format("hash algorithm \"{}\" is not supported ({})", algorithm,
                                  fmt::join(supported_hashes(), ", ")));
}

std::string sha256_hex(const std::vector<std::string_view>& parts) {
  const std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int size = 0;
  bool ok = ctx && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1;
  for (const std::string_view part : parts) ok = ok && EVP_DigestUpdate(ctx.get(), part.data(), part.size()) == 1;
  if (!ok || EVP_DigestFinal_ex(ctx.get(), digest.data(), &size) != 1) {
    throw Error("hash", "OpenSSL's SHA-256 digest failed");
  }
  return hex(digest.data(), size);
}

}  // namespace tessera::util
