// What the checkpoint format's two halves share: checkpoint.cpp (rank files, receipts, publication, the folder's
// listing and validation) and checkpoint_reader.cpp (CheckpointReader's resharding reads). Private to src/checkpoint/.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace tessera::checkpoint::detail {

inline constexpr const char* kCheckpointComponent = "checkpoint";
inline constexpr const char* kMetadata = "metadata.json";

// Throws tessera::Error("checkpoint") "<path>: <message>".
[[noreturn]] void fail_checkpoint(const std::string& path, const std::string& message);
// Whether `location` is an object-store URI rather than a local path.
bool remote(const std::string& location);
// A checkpoint's metadata.json, local or remote, its file names checked (each a safe relative name).
nlohmann::json read_metadata(const std::string& dir);
// The path of a file metadata.json lists (its name checked by read_metadata): folder/name, URIs as they are.
std::string listed_file(const std::string& dir, const std::string& name);
// xxh64 (hex) of a mapped file, faulting its pages in ahead of the hash.
std::string mapped_xxh64(std::string_view bytes);

}  // namespace tessera::checkpoint::detail
