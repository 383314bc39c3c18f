// The integrity check of an MDS shard (hashes.h).
#include "hashes.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <mutex>
#include <set>

#include "tessera/util/hashing.h"

namespace tessera::data::mds::detail {

std::optional<std::string> hash_problem(const std::vector<std::pair<std::string, std::string>>& expected,
                                        std::string_view data) {
  std::vector<std::string> unknown;
  for (const auto& [algo, digest] : expected) {
    if (!util::hash_supported(algo)) {
      unknown.push_back(algo);
      continue;
    }
    const std::string actual = util::hex_digest(algo, data);
    if (actual != digest) {
      return fmt::format("{} mismatch (index.json says {}, the file hashes to {}): the shard is corrupt", algo, digest,
                         actual);
    }
  }
  if (!unknown.empty() && unknown.size() == expected.size()) {
    return fmt::format(
        "index.json lists only hashes Tessera cannot compute ({}; it computes {}): set "
        "verify_hashes to false to read it unchecked",
        fmt::join(unknown, ", "), fmt::join(util::supported_hashes(), ", "));
  }
  static std::mutex mu;
  static std::set<std::string> warned;
  const std::lock_guard<std::mutex> lock(mu);
  for (const std::string& algo : unknown) {
    if (warned.insert(algo).second) {
      spdlog::warn("MDS: index.json lists a {} digest, which Tessera cannot compute; the others are checked", algo);
    }
  }
  return std::nullopt;
}

}  // namespace tessera::data::mds::detail
