// URI-addressed objects: local files (plain paths, file://), S3-compatible object stores (s3://bucket/key), Google
// Cloud Storage (gs://bucket/key), Azure Blob Storage and Data Lake Gen2 (azure://container/path,
// azure-dl://filesystem/path, abfs[s]://container@account.dfs.core.windows.net/path), Databricks Unity Catalog volumes
// (dbfs:/Volumes/catalog/schema/volume/path), OCI Object Storage (oci://bucket[@namespace]/path) and Hugging Face Hub
// repositories (hf://datasets/org/name/path, hf://org/name/path), behind one set of functions. Every layer above
// (datasets, the MDS writer, checkpoints, HF export) reads and writes through these, so any path in a recipe may be
// remote.
//
// Semantics, the same for every backend:
//   - write() publishes atomically: readers see the old object (or none) or the whole new one, never a part (local:
//     temporary file + fsync + rename; S3: one PUT, or a multipart upload that becomes visible only when completed;
//     GCS: a resumable upload, visible only when finalized; Azure: one Put Blob, or blocks committed by one Put Block
//     List; Unity Catalog volumes: one Files API PUT; OCI: one PutObject, or a committed multipart upload; the Hub:
//     one commit).
//   - download() fetches into a temporary file next to `local_path` and renames it, so a crash never leaves a partial
//     file under the final name; objects come down in parallel byte ranges.
//   - list() is recursive under a prefix and returns full URIs, sorted.
// Errors throw tessera::Error naming the URI (and the store's own error, and where the credentials came from).
// Thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::storage {

// A parsed location. Local paths keep their spelling (relative stays relative); `file://` is stripped.
struct Uri {
  enum class Scheme { kLocal, kS3, kGcs, kHf, kAzure, kAzureDl, kAbfs, kAbfss, kDbfs, kOci };
  Scheme scheme = Scheme::kLocal;
  std::string bucket;       // object stores only
  std::string key;          // object stores: the object key (no leading '/'); local: the path
  std::string str() const;  // scheme://bucket/key (dbfs:/Volumes/key), or the path
};

// Throws ConfigError for an unsupported scheme ("ftp://", ...) or an object URI without a bucket, naming it.
Uri parse_uri(std::string_view uri);
bool is_remote(std::string_view uri);  // true for an object store's URI (s3://, gs://, azure://, hf://, ...)
// `base` + "/" + `name` for URIs and paths alike (no doubled slash).
std::string join(std::string_view base, std::string_view name);

struct ObjectInfo {
  std::string uri;
  uint64_t size = 0;
  std::string etag;  // S3's ETag without quotes; empty for local files and GCS
};

std::string read(const std::string& uri);
// `length` bytes from `offset`; throws if the object is shorter.
std::string read_range(const std::string& uri, uint64_t offset, uint64_t length);
void download(const std::string& uri, const std::string& local_path);
void write(const std::string& uri, std::string_view data);
// write() of the concatenation of `parts`, without joining them in memory (S3: each multipart part is gathered from
// them as it is sent). For writers whose bytes are already in several buffers, e.g. a checkpoint's tensors.
void write_parts(const std::string& uri, const std::vector<std::string_view>& parts);
// Streams a local file to `uri` (S3: multipart in parallel parts when large, memory bounded by the part pool; GCS:
// one resumable upload from the file mapped in memory).
void upload(const std::string& local_path, const std::string& uri);
// Uploads every file under `local_dir` to `uri` + its relative path; the files named in `last` (relative paths, e.g.
// "config.json") go after all the others, so a reader that waits for them finds the rest in place. With `replace`,
// the objects under `uri`/ that `local_dir` lacks are deleted afterwards (an export written over an older one). A
// Hugging Face Hub repository gets the whole tree, deletions included, as one commit.
void upload_tree(const std::string& local_dir, const std::string& uri, const std::vector<std::string>& last = {},
                 bool replace = false);
std::vector<ObjectInfo> list(const std::string& prefix_uri);
// write() of a small object only while it is the version this writer last saw: `expected` is the ETag stat() or the
// last write_if() gave (nullopt: no object yet). Returns the new ETag, or nullopt when another writer changed the
// object first. S3, Azure and OCI check the condition in the PUT itself (If-Match, If-None-Match: *); other stores
// compare stat()'s ETag just before writing, which narrows the race without closing it (and stores without ETags,
// GCS through Arrow and the Hub, see no change). An object found holding exactly `data` counts as written (a retried
// PUT that had succeeded). Not for local paths.
std::optional<std::string> write_if(const std::string& uri, std::string_view data,
                                    const std::optional<std::string>& expected);
// Deletes one object; deleting a missing object is not an error (as S3).
void remove(const std::string& uri);
// Size and ETag, or nullopt when the object does not exist.
std::optional<ObjectInfo> stat(const std::string& uri);

}  // namespace tessera::storage
