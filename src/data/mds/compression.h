// Compression of MDS shards: zstd (levels 1-22, default 3) and gz (levels 0-9, default 9), by Streaming's spec strings.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::data::mds::detail {

// The largest raw MDS shard: its sample offsets are uint32, and the last one is the file's size.
inline constexpr uint64_t kMaxRawShardBytes = 0xFFFFFFFFull;

// "zstd" / "zstd:7" / "gz" / "gz:6" -> file extension ("zstd", "gz"); throws for other families or levels.
std::string compression_extension(const std::string& spec);
std::string compress(const std::string& spec, std::string_view raw);
// The decompressed bytes of `data`, which must be exactly `expected_bytes` long (an MDS index's raw_bytes): a frame
// that declares another size is refused before anything is allocated, and a frame without a declared size (zstd
// streaming frames, gzip) is decompressed a block at a time and refused as soon as it passes `expected_bytes`, so a
// small crafted file cannot make the reader allocate more than the index promised. `what` names the file in errors.
std::string decompress(const std::string& spec, std::string_view data, uint64_t expected_bytes,
                       const std::string& what);

}  // namespace tessera::data::mds::detail
