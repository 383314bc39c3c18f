// Whole-file reads, and file writes that never leave a partial file under the final name.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::util {

// The bytes of `path`; tessera::Error(component) "<path>: cannot open" or "<path>: read failed" otherwise.
std::string read_file(const std::string& path, const std::string& component = "io");

// Writes the concatenation of `parts` to a temporary file of this call's own (`<path>.tmp.<pid>.<n>`) in the same
// directory, fsyncs it, and renames it over `path`: after a crash at any moment `path` is either its previous content
// (or absent) or the complete new content, also when several processes or threads write `path` at once. On
// failure the temporary file is removed and tessera::Error(component) names `path` and the OS error.
// `observe`, when given, sees every byte just before it is written, in order and in chunks of at most 8 MiB (for a
// checksum computed while the bytes are hot in cache).
void write_file_atomically(const std::string& path, const std::vector<std::string_view>& parts,
                           const std::string& component = "io",
                           const std::function<void(std::string_view)>& observe = nullptr);
inline void write_file_atomically(const std::string& path, std::string_view data, const std::string& component = "io") {
  write_file_atomically(path, std::vector<std::string_view>{data}, component);
}

// A new, empty directory `<$TMPDIR or /tmp>/<prefix>-XXXXXX` (mkdtemp); throws tessera::Error(component) naming it.
std::string make_temp_dir(const std::string& prefix, const std::string& component = "io");

// A make_temp_dir() directory removed, with everything in it, when this goes out of scope.
struct TempFolder {
  explicit TempFolder(const std::string& prefix) : path(make_temp_dir(prefix)) {}
  ~TempFolder();
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;
  std::string path;
};

// `pattern` with every {run_name} and {rank} replaced (file and folder options of loggers, checkpoints, ...).
std::string fill_path_pattern(std::string pattern, const std::string& run_name, int64_t rank);

}  // namespace tessera::util
