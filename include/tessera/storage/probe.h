// Pre-flight probes of URIs and paths (storage.h's): can a run read this input, write this output, fit this much?
// Each returns why not, in one sentence, or nothing; none throws for what it finds (only for a URI it cannot parse).
//
//   if (auto why = storage::unreadable("s3://bucket/data/index.json")) problems.push_back({"dataset.remote", *why});
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tessera::storage {

// Why `uri` cannot be read: a local path that does not exist or is not readable, or an object that does not exist or
// whose store refuses or does not answer (credentials, bucket, endpoint; the store's own error).
std::optional<std::string> unreadable(const std::string& uri);

// Why a file or folder cannot be created or replaced at `uri`. Local: the path (or, when it does not exist yet, its
// nearest existing ancestor) must be a folder this process may write, or a file it may replace in one; nothing is
// created. Object stores: with `probe`, a small object is written under `uri` and deleted again (the only way to know
// a write is allowed); without, the bucket is only listed.
std::optional<std::string> unwritable(const std::string& uri, bool probe);

// Bytes free to this process on the file system that holds local `path` (or its nearest existing ancestor); nullopt
// for an object store or when it cannot be found.
std::optional<uint64_t> free_bytes(const std::string& path);

}  // namespace tessera::storage
