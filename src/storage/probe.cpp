// Pre-flight probes: read, write and space checks that report instead of throwing.
#include "tessera/storage/probe.h"

#include <fmt/format.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <filesystem>

#include "backend.h"
#include "tessera/storage/storage.h"
#include "tessera/util/error.h"

namespace tessera::storage {
namespace {

namespace fs = std::filesystem;

// `path` itself when it exists, else its nearest existing ancestor ("." for a relative path with none).
fs::path nearest_existing(const fs::path& path) {
  std::error_code ec;
  fs::path p = path.lexically_normal();
  while (!p.empty() && !fs::exists(fs::symlink_status(p, ec))) p = p.parent_path();
  return p.empty() ? fs::path(".") : p;
}

std::string probe_name() {
  char host[64] = {};
  ::gethostname(host, sizeof(host) - 1);
  return fmt::format(".tessera-preflight-{}-{}", host, ::getpid());
}

}  // namespace

std::optional<std::string> unreadable(const std::string& uri) {
  const Uri u = parse_uri(uri);
  if (u.scheme == Uri::Scheme::kLocal) {
    std::error_code ec;
    if (!fs::exists(u.key, ec)) return fmt::format("{} does not exist", u.key);
    if (::access(u.key.c_str(), R_OK) != 0) return fmt::format("{} is not readable by this user", u.key);
    if (fs::is_directory(u.key, ec) && ::access(u.key.c_str(), X_OK) != 0) {
      return fmt::format("{}: this user may not enter the folder", u.key);
    }
    return std::nullopt;
  }
  try {
    if (!stat(uri)) return fmt::format("{} does not exist", uri);
  } catch (const Error& e) {
    return e.message();
  }
  return std::nullopt;
}

std::optional<std::string> unwritable(const std::string& uri, bool probe) {
  const Uri u = parse_uri(uri);
  if (u.scheme == Uri::Scheme::kLocal) {
    std::error_code ec;
    const fs::path target(u.key);
    const fs::path base = nearest_existing(target);
    const bool exists = base == target.lexically_normal();
    if (fs::is_directory(base, ec)) {
      if (::access(base.c_str(), W_OK | X_OK) != 0) {
        return exists ? fmt::format("{}: this user may not write in the folder", base.string())
                      : fmt::format("{} cannot be created: this user may not write in {}", u.key, base.string());
      }
      return std::nullopt;
    }
    if (!exists) {
      return fmt::format("{} cannot be created: {} is a file, not a folder", u.key, base.string());
    }
    // An existing file, replaced by a new one written beside it and renamed over it.
    const fs::path parent = nearest_existing(target.parent_path().empty() ? fs::path(".") : target.parent_path());
    if (::access(parent.c_str(), W_OK | X_OK) != 0) {
      return fmt::format("{} cannot be replaced: this user may not write in {}", u.key, parent.string());
    }
    return std::nullopt;
  }
  try {
    if (probe) {
      backend_of(u).probe_write(u, probe_name());
    } else {
      (void)list(uri);
    }
  } catch (const Error& e) {
    return e.message();
  }
  return std::nullopt;
}

std::optional<uint64_t> free_bytes(const std::string& path) {
  if (is_remote(path)) return std::nullopt;
  const fs::path base = nearest_existing(parse_uri(path).key);
  struct statvfs s {};
  if (::statvfs(base.c_str(), &s) != 0) return std::nullopt;
  return static_cast<uint64_t>(s.f_bavail) * s.f_frsize;
}

}  // namespace tessera::storage
