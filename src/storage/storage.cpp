// storage::*: URI parsing and dispatch to local files or the shared S3 client.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "tessera/storage/s3.h"
#include "tessera/storage/storage.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"

namespace tessera::storage {
namespace {

namespace fs = std::filesystem;
constexpr const char* kComponent = "storage";

void make_parent(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
}

}  // namespace

std::string Uri::str() const {
  return scheme == Scheme::kS3 ? fmt::format("s3://{}/{}", bucket, key) : key;
}

Uri parse_uri(std::string_view uri) {
  Uri u;
  const size_t sep = uri.find("://");
  if (sep == std::string_view::npos) {
    u.key = std::string(uri);
    return u;
  }
  const std::string_view scheme = uri.substr(0, sep), rest = uri.substr(sep + 3);
  if (scheme == "file") {
    u.key = std::string(rest);
    return u;
  }
  if (scheme != "s3") {
    throw ConfigError(kComponent,
                      fmt::format("{}: unsupported scheme \"{}://\" (supported: s3://, file://, local paths; "
                                  "Google Cloud Storage, OCI and R2 work through their S3 endpoints "
                                  "with S3_ENDPOINT_URL)",
                                  uri, scheme));
  }
  u.scheme = Uri::Scheme::kS3;
  const size_t slash = rest.find('/');
  u.bucket = std::string(rest.substr(0, slash));
  if (slash != std::string_view::npos) u.key = std::string(rest.substr(slash + 1));
  if (u.bucket.empty()) throw ConfigError(kComponent, fmt::format("{}: no bucket name", uri));
  return u;
}

bool is_remote(std::string_view uri) {
  return uri.rfind("s3://", 0) == 0;
}

std::string join(std::string_view base, std::string_view name) {
  std::string out(base);
  if (!out.empty() && out.back() != '/') out += '/';
  while (!name.empty() && name.front() == '/') name.remove_prefix(1);
  return out + std::string(name);
}

std::string read(const std::string& uri) {
  const Uri u = parse_uri(uri);
  if (u.scheme == Uri::Scheme::kS3) return S3Client::shared().get(u.bucket, u.key);
  return util::read_file(u.key, kComponent);
}

std::string read_range(const std::string& uri, uint64_t offset, uint64_t length) {
  const Uri u = parse_uri(uri);
  if (u.scheme == Uri::Scheme::kS3) return S3Client::shared().get_range(u.bucket, u.key, offset, length);
  std::ifstream in(u.key, std::ios::binary);
  if (!in) throw Error(kComponent, fmt::format("{}: cannot open", u.key));
  std::string out(length, '\0');
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(out.data(), static_cast<std::streamsize>(length));
  if (static_cast<uint64_t>(in.gcount()) != length) {
    throw Error(kComponent, fmt::format("{}: asked for {} bytes at {}, the file is shorter", u.key, length, offset));
  }
  return out;
}

void download(const std::string& uri, const std::string& local_path) {
  const Uri u = parse_uri(uri);
  make_parent(local_path);
  if (u.scheme == Uri::Scheme::kS3) {
    S3Client::shared().download(u.bucket, u.key, local_path);
    return;
  }
  util::write_file_atomically(local_path, util::read_file(u.key, kComponent), kComponent);
}

void write(const std::string& uri, std::string_view data) {
  const Uri u = parse_uri(uri);
  if (u.scheme == Uri::Scheme::kS3) {
    S3Client::shared().put(u.bucket, u.key, data);
    return;
  }
  make_parent(u.key);
  util::write_file_atomically(u.key, data, kComponent);
}

void write_parts(const std::string& uri, const std::vector<std::string_view>& parts) {
  const Uri u = parse_uri(uri);
  if (u.scheme == Uri::Scheme::kS3) {
    S3Client::shared().put_parts(u.bucket, u.key, parts);
    return;
  }
  make_parent(u.key);
  util::write_file_atomically(u.key, parts, kComponent);
}

void upload(const std::string& local_path, const std::string& uri) {
  const Uri u = parse_uri(uri);
  if (u.scheme == Uri::Scheme::kS3) {
    S3Client::shared().upload_file(local_path, u.bucket, u.key);
    return;
  }
  if (fs::exists(u.key) && fs::equivalent(local_path, u.key)) return;
  make_parent(u.key);
  util::write_file_atomically(u.key, util::read_file(local_path, kComponent), kComponent);
}

void upload_tree(const std::string& local_dir, const std::string& uri, const std::vector<std::string>& last) {
  std::vector<std::string> first, final;
  for (const auto& e : fs::recursive_directory_iterator(local_dir)) {
    if (!e.is_regular_file()) continue;
    const std::string rel = fs::relative(e.path(), local_dir).generic_string();
    (std::find(last.begin(), last.end(), rel) == last.end() ? first : final).push_back(rel);
  }
  std::sort(first.begin(), first.end());
  std::sort(final.begin(), final.end(), [&](const std::string& a, const std::string& b) {
    return std::find(last.begin(), last.end(), a) < std::find(last.begin(), last.end(), b);
  });
  for (const auto* group : {&first, &final}) {
    for (const std::string& rel : *group) upload((fs::path(local_dir) / rel).string(), join(uri, rel));
  }
}

std::vector<ObjectInfo> list(const std::string& prefix_uri) {
  const Uri u = parse_uri(prefix_uri);
  std::vector<ObjectInfo> out;
  if (u.scheme == Uri::Scheme::kS3) {
    for (auto& l : S3Client::shared().list(u.bucket, u.key)) {
      out.push_back({fmt::format("s3://{}/{}", u.bucket, l.key), l.size, std::move(l.etag)});
    }
    return out;
  }
  // A local prefix is a directory (everything under it) or a file-name prefix within its parent.
  const fs::path p(u.key);
  std::error_code ec;
  if (fs::is_directory(p, ec)) {
    for (const auto& e : fs::recursive_directory_iterator(p)) {
      if (e.is_regular_file()) out.push_back({e.path().string(), e.file_size(), ""});
    }
  } else if (fs::is_directory(p.parent_path().empty() ? "." : p.parent_path(), ec)) {
    const std::string name = p.filename().string();
    for (const auto& e : fs::directory_iterator(p.parent_path().empty() ? "." : p.parent_path())) {
      if (e.path().filename().string().rfind(name, 0) != 0) continue;
      if (e.is_regular_file()) {
        out.push_back({e.path().string(), e.file_size(), ""});
      } else if (e.is_directory()) {
        for (const auto& f : fs::recursive_directory_iterator(e.path())) {
          if (f.is_regular_file()) out.push_back({f.path().string(), f.file_size(), ""});
        }
      }
    }
  }
  std::sort(out.begin(), out.end(), [](const ObjectInfo& a, const ObjectInfo& b) { return a.uri < b.uri; });
  return out;
}

void remove(const std::string& uri) {
  const Uri u = parse_uri(uri);
  if (u.scheme == Uri::Scheme::kS3) {
    S3Client::shared().remove(u.bucket, u.key);
    return;
  }
  std::error_code ec;
  fs::remove(u.key, ec);
  if (ec) throw Error(kComponent, fmt::format("{}: cannot delete: {}", u.key, ec.message()));
}

std::optional<ObjectInfo> stat(const std::string& uri) {
  const Uri u = parse_uri(uri);
  if (u.scheme == Uri::Scheme::kS3) {
    auto h = S3Client::shared().head(u.bucket, u.key);
    if (!h) return std::nullopt;
    return ObjectInfo{uri, h->size, std::move(h->etag)};
  }
  std::error_code ec;
  if (!fs::is_regular_file(u.key, ec)) return std::nullopt;
  return ObjectInfo{uri, fs::file_size(u.key), ""};
}

}  // namespace tessera::storage
