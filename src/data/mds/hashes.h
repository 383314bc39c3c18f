// The integrity check of an MDS shard against the digests its index.json lists (verify_hashes).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::data::mds::detail {

// What is wrong with `data` against the (algorithm, hex digest) pairs an index lists, for a message: the first
// mismatch ("sha1 mismatch (index.json says ..., the file hashes to ...): the shard is corrupt"), or, when the index
// lists digests and none of them is one util::hex_digest computes, that none can be checked. nullopt when every digest
// it can compute matches (a name it cannot compute beside one it can is skipped, with a warning once per name).
std::optional<std::string> hash_problem(const std::vector<std::pair<std::string, std::string>>& expected,
                                        std::string_view data);

}  // namespace tessera::data::mds::detail
