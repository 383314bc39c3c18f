// confined_path: untrusted names joined onto trusted folders, lexically and through existing symlinks.
#include "tessera/util/safe_path.h"

#include <fmt/format.h>

#include <system_error>

#include "tessera/util/error.h"

namespace tessera::util {
namespace fs = std::filesystem;
namespace {

constexpr size_t kMaxName = 4096;

// The name as shown in a message: control bytes escaped, long names cut.
std::string shown(std::string_view name) {
  std::string out;
  for (const char c : name.substr(0, 200)) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\x{:02x}", u);
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else {
      out += c;
    }
  }
  if (name.size() > 200) out += fmt::format("... ({} bytes)", name.size());
  return out;
}

// True if `p` (lexically normal, absolute) is `root` or lies under it.
bool is_within(const fs::path& p, const fs::path& root) {
  auto r = root.begin(), q = p.begin();
  for (; r != root.end(); ++r, ++q) {
    if (r->empty()) continue;  // a trailing separator of root
    if (q == p.end() || *q != *r) return false;
  }
  return true;
}

// `p` (absolute) with every symbolic link along it followed, as the kernel follows them when a file is created there:
// dangling links too (weakly_canonical takes a dangling last link for a plain name, and creating the file would
// follow it). nullopt after 40 links (ELOOP).
std::optional<fs::path> follow_links(const fs::path& p, int& budget) {
  fs::path cur = p.root_path();
  for (const fs::path& seg : p.relative_path()) {
    if (seg.empty() || seg == ".") continue;
    if (seg == "..") {
      cur = cur.parent_path();
      continue;
    }
    fs::path next = cur / seg;
    std::error_code ec;
    if (fs::is_symlink(fs::symlink_status(next, ec))) {
      if (--budget < 0) return std::nullopt;
      const fs::path target = fs::read_symlink(next, ec);
      if (ec) return std::nullopt;
      auto followed = follow_links((target.is_absolute() ? target : cur / target).lexically_normal(), budget);
      if (!followed) return std::nullopt;
      next = *followed;
    }
    cur = std::move(next);
  }
  return cur;
}

}  // namespace

std::optional<std::string> unsafe_name_reason(std::string_view name) {
  if (name.empty()) return "is empty";
  if (name.size() > kMaxName) return fmt::format("is {} bytes long (at most {})", name.size(), kMaxName);
  if (name.find('\0') != std::string_view::npos) return "contains a NUL byte";
  if (name.front() == '/') return "is absolute";
  for (const char c : name) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return "contains a control character";
  }
  size_t begin = 0;
  while (true) {
    const size_t end = name.find('/', begin);
    const std::string_view seg =
        name.substr(begin, end == std::string_view::npos ? std::string_view::npos : end - begin);
    if (seg.empty()) return "has an empty segment";
    if (seg == ".") return "has a \".\" segment";
    if (seg == "..") return "has a \"..\" segment";
    if (end == std::string_view::npos) break;
    begin = end + 1;
  }
  return std::nullopt;
}

fs::path confined_path(const fs::path& folder, std::string_view name, std::string_view source,
                       const std::string& component, std::string_view what, Confine mode) {
  const auto refuse = [&](const std::string& why) {
    return Error(component, fmt::format("{}: {} \"{}\" {}: refusing to use it as a path under {}", source, what,
                                        shown(name), why, folder.string()));
  };
  if (auto why = unsafe_name_reason(name)) throw refuse(*why);
  fs::path joined = folder / fs::path(std::string(name));
  if (mode == Confine::kLexical) return joined;
  std::error_code ec;
  const fs::path absolute_folder = fs::absolute(folder, ec).lexically_normal();
  int budget = 40;
  const auto root = follow_links(absolute_folder, budget);
  if (ec || !root) throw refuse(fmt::format("cannot be checked ({}: too many symbolic links)", folder.string()));
  budget = 40;
  const auto resolved = follow_links(*root / fs::path(std::string(name)), budget);
  if (!resolved) throw refuse("passes through too many symbolic links");
  if (!is_within(*resolved, *root)) {
    throw refuse(fmt::format("leads to {} through a symbolic link", resolved->string()));
  }
  return joined;
}

}  // namespace tessera::util
