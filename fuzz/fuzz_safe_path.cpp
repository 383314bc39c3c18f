// libFuzzer target: util::confined_path and util::unsafe_name_reason on arbitrary names. The scratch folder holds a
// symbolic link out of it ("out" -> the folder's parent) and one inside it ("in" -> "sub"), so the resolved check is
// exercised. Anything but tessera::Error is a finding, and so is an accepted name whose path leaves the folder,
// lexically or (in Confine::kResolved) through a link.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include "tessera/util/error.h"
#include "tessera/util/safe_path.h"

namespace {

namespace fs = std::filesystem;

const fs::path& scratch() {
  static const fs::path dir = [] {
    const fs::path d = fs::temp_directory_path() / ("tessera_fuzz_safe_path_" + std::to_string(getpid())) / "root";
    fs::create_directories(d / "sub");
    std::error_code ec;
    fs::create_directory_symlink(d.parent_path(), d / "out", ec);
    fs::create_directory_symlink("sub", d / "in", ec);
    return fs::canonical(d);
  }();
  return dir;
}

bool lexically_within(const fs::path& p, const fs::path& root) {
  const fs::path n = p.lexically_normal();
  auto r = root.begin();
  auto q = n.begin();
  for (; r != root.end(); ++r, ++q) {
    if (q == n.end() || *q != *r) return false;
  }
  return true;
}

void finding(const char* what, std::string_view name) {
  std::fprintf(stderr, "%s: \"%.*s\"\n", what, static_cast<int>(name.size()), name.data());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tessera::util::Confine;
  const std::string_view name(reinterpret_cast<const char*>(data), size);
  const fs::path& root = scratch();
  const bool safe = !tessera::util::unsafe_name_reason(name).has_value();
  for (const Confine mode : {Confine::kLexical, Confine::kResolved}) {
    try {
      const fs::path p = tessera::util::confined_path(root, name, "fuzz", "fuzz", "name", mode);
      if (!safe) finding("accepted a name unsafe_name_reason refuses", name);
      if (!lexically_within(p, root)) finding("accepted a name that leaves the folder", name);
      std::error_code ec;  // e.g. a segment longer than NAME_MAX: the OS refuses the path, nothing to compare
      const fs::path resolved = fs::weakly_canonical(p, ec);
      if (mode == Confine::kResolved && !ec && !lexically_within(resolved, root)) {
        finding("accepted a name that leaves the folder through a link", name);
      }
    } catch (const tessera::Error&) {
      if (mode == Confine::kLexical && safe) finding("refused a name unsafe_name_reason accepts", name);
    }
  }
  return 0;
}
