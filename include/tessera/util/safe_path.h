// Names read from untrusted input (an MDS index, a checkpoint manifest, an object-store listing, an HF index or hub
// pointer file) joined onto a folder Tessera trusts, so that no such name ever becomes a path outside that folder.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace tessera::util {

// How far confined_path checks a name.
enum class Confine {
  // The name alone: relative, no empty, "." or ".." segment, no NUL. For files Tessera only reads from a folder
  // whose own symlinks are the user's (an HF hub snapshot links every file into ../../blobs).
  kLexical,
  // kLexical, and the joined path must not leave the folder through a symlink that already exists under it (a
  // dangling one included). For every path Tessera creates, replaces or deletes.
  kResolved,
};

// Why `name` is not a safe relative name ("is empty", "is absolute", "has a \"..\" segment", ...), or nullopt when
// it is one: one or more '/'-separated segments, none empty, "." or "..", no NUL or other control character, at most
// 4096 bytes.
std::optional<std::string> unsafe_name_reason(std::string_view name);

// `folder / name`, for a `name` read from `source` (the file or URI it came from, for the message). Throws
// tessera::Error(component) "<source>: <what> \"<name>\" <reason>: refusing to use it as a path under <folder>"
// before anything is fetched, written or deleted. kResolved only reads the filesystem (stat/readlink).
std::filesystem::path confined_path(const std::filesystem::path& folder, std::string_view name, std::string_view source,
                                    const std::string& component, std::string_view what = "name",
                                    Confine mode = Confine::kResolved);

}  // namespace tessera::util
