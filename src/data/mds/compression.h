// Compression of MDS shards: zstd (levels 1-22, default 3) and gz (levels 0-9, default 9), by Streaming's spec strings.
#pragma once

#include <string>
#include <string_view>

namespace tessera::data::mds::detail {

// "zstd" / "zstd:7" / "gz" / "gz:6" -> file extension ("zstd", "gz"); throws for other families or levels.
std::string compression_extension(const std::string& spec);
std::string compress(const std::string& spec, std::string_view raw);
// `what` names the file in errors.
std::string decompress(const std::string& spec, std::string_view data, const std::string& what);

}  // namespace tessera::data::mds::detail
