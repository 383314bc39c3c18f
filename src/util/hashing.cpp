// SHA-1 (FIPS 180-4), SHA-256 (OpenSSL) and xxHash digests.
#include "tessera/util/hashing.h"

#include <fmt/format.h>
#include <openssl/sha.h>
#include <xxhash.h>

#include <array>
#include <cstdint>
#include <cstring>

#include "tessera/util/error.h"

namespace tessera::util {
namespace {

uint32_t rotl(uint32_t x, int n) {
  return (x << n) | (x >> (32 - n));
}

std::string sha1_hex(std::string_view data) {
  std::array<uint32_t, 5> h = {0x67452301u, 0xEFCDAB89u, 0x98BADCFEu, 0x10325476u, 0xC3D2E1F0u};
  const uint64_t bit_len = static_cast<uint64_t>(data.size()) * 8;
  std::string tail(data.substr(data.size() - data.size() % 64));
  tail += '\x80';
  while (tail.size() % 64 != 56) tail += '\0';
  for (int i = 7; i >= 0; --i) tail += static_cast<char>((bit_len >> (8 * i)) & 0xff);
  auto block = [&h](const unsigned char* p) {
    uint32_t w[80];
    for (int i = 0; i < 16; ++i) {
      w[i] = (uint32_t{p[4 * i]} << 24) | (uint32_t{p[4 * i + 1]} << 16) | (uint32_t{p[4 * i + 2]} << 8) | p[4 * i + 3];
    }
    for (int i = 16; i < 80; ++i) w[i] = rotl(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
    for (int i = 0; i < 80; ++i) {
      uint32_t f, k;
      if (i < 20) {
        f = (b & c) | (~b & d), k = 0x5A827999u;
      } else if (i < 40) {
        f = b ^ c ^ d, k = 0x6ED9EBA1u;
      } else if (i < 60) {
        f = (b & c) | (b & d) | (c & d), k = 0x8F1BBCDCu;
      } else {
        f = b ^ c ^ d, k = 0xCA62C1D6u;
      }
      const uint32_t t = rotl(a, 5) + f + e + k + w[i];
      e = d, d = c, c = rotl(b, 30), b = a, a = t;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e;
  };
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  for (size_t off = 0; off + 64 <= data.size(); off += 64) block(p + off);
  for (size_t off = 0; off < tail.size(); off += 64) block(reinterpret_cast<const unsigned char*>(tail.data()) + off);
  return fmt::format("{:08x}{:08x}{:08x}{:08x}{:08x}", h[0], h[1], h[2], h[3], h[4]);
}

}  // namespace

bool hash_supported(std::string_view a) {
  return a == "sha1" || a == "sha256" || a == "xxh64" || a == "xxh3_64";
}

std::string hex_digest(std::string_view algorithm, std::string_view data) {
  if (algorithm == "sha1") return sha1_hex(data);
  if (algorithm == "sha256") {
    unsigned char digest[SHA256_DIGEST_LENGTH];
    SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
    std::string hex;
    for (unsigned char b : digest) hex += fmt::format("{:02x}", b);
    return hex;
  }
  if (algorithm == "xxh64") return fmt::format("{:016x}", XXH64(data.data(), data.size(), 0));
  if (algorithm == "xxh3_64") return fmt::format("{:016x}", XXH3_64bits(data.data(), data.size()));
  throw Error("hash", fmt::format("hash algorithm \"{}\" is not supported (sha1, sha256, xxh64, xxh3_64)", algorithm));
}

}  // namespace tessera::util
