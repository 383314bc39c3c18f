// hf://: files in Hugging Face Hub repositories, read through the Hub's HTTP API as huggingface_hub's HfFileSystem
// reads them (what MosaicML Streaming uses for `remote: hf://...`), and written by commits as huggingface_hub's
// create_commit writes them.
//
//   hf://datasets/<org>/<name>[@<revision>]/<path>   a dataset repository (Streaming's form)
//   hf://spaces/<org>/<name>[@<revision>]/<path>     a Space
//   hf://<org>/<name>[@<revision>]/<path>            a model repository
//
// Files come from /<repo>/resolve/<revision>/<path> (redirects followed; ranges with a Range header); listings from
// /api/<kind>/<repo>/tree/<revision>/<folder>?recursive=true, page by page (the Link header's next page). Endpoint and
// token as huggingface_hub (util/hf_hub_client.h); HF_HUB_OFFLINE refuses every request.
//
// Every write (one file, a removal, a whole export folder) is one commit to the revision's branch:
//   1. POST /api/<kind>/<repo>/preupload/<revision>: the Hub says which files go to Git LFS ("lfs") and which into
//      the commit itself ("regular"), from each file's size and first 512 bytes;
//   2. LFS files: POST /<prefix><repo>.git/info/lfs/objects/batch (Git LFS's batch API, transfers basic and
//      multipart): for each object the Hub lacks, one PUT of the bytes to the URL it names (basic), or one PUT per
//      chunk_size part to its numbered URLs and a POST of the parts' ETags to the upload URL (multipart), then its
//      verify URL. Those URLs point at the Hub's storage: the token goes only to the endpoint's own host;
//   3. POST /api/<kind>/<repo>/commit/<revision> (NDJSON): a header line, a "file" line per regular file (base64), an
//      "lfsFile" line per LFS file (SHA-256 and size), a "deletedFile" line per removal. Readers see all or none.
// A missing repository is created, private, before the first write (not a Space: it needs an SDK chosen).
#include <fmt/format.h>

#include <charconv>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "backend.h"
#include "http_pool.h"
#include "tessera/util/error.h"
#include "tessera/util/hashing.h"
#include "tessera/util/hf_hub_client.h"

namespace tessera::storage {
namespace {

constexpr const char* kHfComponent = "hf";

// Where a URI points in the Hub.
struct HfLocation {
  std::string kind;      // "datasets", "spaces" or "models" (the API's word)
  std::string repo;      // org/name
  std::string revision;  // "main" unless the URI says @revision
  std::string path;      // the file (or prefix) inside the repository
  std::string root;      // the URI up to the path, ending in '/'
};

HfLocation hf_locate(const Uri& u) {
  HfLocation l;
  std::string rest = u.key;
  std::string org;
  if (u.bucket == "datasets" || u.bucket == "spaces") {
    l.kind = u.bucket;
    const size_t slash = rest.find('/');
    org = rest.substr(0, slash);
    rest = slash == std::string::npos ? "" : rest.substr(slash + 1);
  } else {
    l.kind = "models";
    org = u.bucket;
  }
  const size_t slash = rest.find('/');
  std::string name = rest.substr(0, slash);
  l.path = slash == std::string::npos ? "" : rest.substr(slash + 1);
  l.revision = "main";
  const bool named_revision = name.find('@') != std::string::npos;
  if (const size_t at = name.find('@'); at != std::string::npos) {
    l.revision = name.substr(at + 1);
    name.resize(at);
  }
  if (org.empty() || name.empty() || l.revision.empty()) {
    throw ConfigError(kHfComponent, fmt::format("{}: expected hf://datasets/<org>/<name>[@<revision>]/<path> (or "
                                                "hf://<org>/<name>/... for a model repository)",
                                                u.str()));
  }
  l.repo = org + "/" + name;
  const std::string repo_at = named_revision ? fmt::format("{}@{}", l.repo, l.revision) : l.repo;
  l.root = fmt::format("hf://{}{}/", l.kind == "models" ? "" : l.kind + "/", repo_at);
  return l;
}

std::string hf_resolve_path(const HfLocation& l) {
  return fmt::format("/{}{}/resolve/{}/{}", l.kind == "models" ? "" : l.kind + "/", l.repo,
                     util::url_encode(l.revision), util::url_encode(l.path, true));
}

util::HubClient hf_client(const Uri& u) {
  if (util::hf_hub_offline()) {
    throw Error(kHfComponent, fmt::format("{}: HF_HUB_OFFLINE is set, so the Hub is not asked", u.str()));
  }
  return util::HubClient(u.str());
}

// ---- writes

// One file of a commit: its place in the repository and its bytes (a mapped file, or a checkpoint's buffers).
struct HubFile {
  HubFile(std::string p, std::vector<std::string_view> bytes) : path(std::move(p)), parts(std::move(bytes)) {}
  std::string path;
  std::vector<std::string_view> parts;
  uint64_t size = 0;
  std::string oid;  // SHA-256, hex
  bool lfs = false;
};

// One PUT of an LFS upload: the bytes [offset, offset + length) of `file` to `url`; `etag` is what came back.
struct LfsPut {
  const HubFile* file = nullptr;
  std::string url;
  uint64_t offset = 0, length = 0;
  std::string etag;
};

// A URL as error messages show it: without its query (an upload URL's query is its signature).
std::string shown_url(const std::string& url) {
  return url.substr(0, url.find('?'));
}

// Whether `id` is a full commit id (40 hex digits), safe in a URL's path.
bool is_commit_id(const std::string& id) {
  return id.size() == 40 && id.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// How many ranges of a download, or LFS PUTs of an upload, are in flight at once.
int hf_parallelism() {
  return env_int("TESSERA_HF_PARALLELISM", 8, 1, 256, kHfComponent);
}

int hf_max_attempts() {
  return util::hub_max_attempts();
}
// How long a write's request may move less than 1 KiB/s: an upload stalled, or a commit the Hub is still making.
int hf_stall_timeout_s() {
  return util::hub_stall_timeout_s(120);
}

// A POST of the Hub's upload API, retried with backoff while the Hub (or a proxy) answers 429/5xx or no answer
// comes back. Returns the last answer.
util::HttpResponse hub_post(const util::HubClient& hub, const std::string& path, const std::string& body,
                            const std::string& content_type) {
  const int attempts = hf_max_attempts();
  std::vector<std::pair<std::string, std::string>> headers{{"Content-Type", content_type}};
  if (content_type.find("git-lfs") != std::string::npos) headers.emplace_back("Accept", content_type);
  for (int attempt = 1;; ++attempt) {
    try {
      util::HttpResponse r = hub.send_body("POST", path, body, headers, hf_stall_timeout_s());
      if (!retryable_status(r.status) || attempt >= attempts) return r;
    } catch (const Error&) {  // no answer at all
      if (attempt >= attempts) throw;
    }
    backoff_sleep(attempt, 0.5, 8.0);
  }
}

// The Hub's refusal of a write (or its failure, once retries are spent), naming the repository, the step and, for a
// 401/403, whether a token was sent (never the token).
[[noreturn]] void refused(const util::HubClient& hub, const std::string& uri, const std::string& step,
                          const util::HttpResponse& r) {
  const std::string code = r.header("x-error-code");
  std::string said = r.header("x-error-message");
  if (said.empty()) {
    const auto j = nlohmann::json::parse(r.body, nullptr, false);
    if (j.is_object() && j.contains("error") && j["error"].is_string()) said = j["error"];
  }
  const std::string status = fmt::format("HTTP {}{}{}", r.status, code.empty() ? "" : ", " + code,
                                         said.empty() ? "" : ": " + said.substr(0, 300));
  if (retryable_status(r.status)) {
    throw Error(kHfComponent, fmt::format("{}: the {} failed at the Hugging Face Hub at {} ({}; gave up after {} "
                                          "attempts, TESSERA_HF_MAX_ATTEMPTS)",
                                          uri, step, hub.endpoint(), status, hf_max_attempts()));
  }
  std::string note;
  if (r.status == 401 || r.status == 403) {
    note = hub.has_token() ? "; the token (HF_TOKEN or the saved login) was sent: it needs write access"
                           : "; no token was sent (HF_TOKEN, or `huggingface-cli login`)";
  }
  throw Error(kHfComponent, fmt::format("{}: the Hugging Face Hub at {} refused the {} ({}){}", uri, hub.endpoint(),
                                        step, status, note));
}

class HubWrite {
 public:
  HubWrite(const Uri& where, HfLocation l) : where_(where.str()), l_(std::move(l)), hub_(hf_client(where)) {}

  // One commit adding `files` and deleting `deleted` (paths in the repository). With `parent` (a commit id) the Hub
  // makes it only while the branch still points there: nullopt when it has moved on (HTTP 412). Otherwise the new
  // commit's id ("" when the Hub names none).
  std::optional<std::string> commit(std::vector<HubFile>& files, const std::vector<std::string>& deleted,
                                    const std::string& summary, const std::string& parent = "") {
    measure(files);
    if (!files.empty()) preupload(files);
    std::vector<const HubFile*> lfs;
    for (const HubFile& f : files) {
      if (f.lfs) lfs.push_back(&f);
    }
    if (!lfs.empty()) upload_lfs(lfs);
    nlohmann::json header{{"summary", summary}, {"description", ""}};
    if (!parent.empty()) header["parentCommit"] = parent;
    std::string ndjson = nlohmann::json{{"key", "header"}, {"value", header}}.dump();
    for (const HubFile& f : files) {
      if (f.lfs) {
        ndjson +=
            "\n" + nlohmann::json{{"key", "lfsFile"},
                                  {"value", {{"path", f.path}, {"algo", "sha256"}, {"oid", f.oid}, {"size", f.size}}}}
                       .dump();
      } else {
        std::string scratch;
        const std::string_view bytes = Concatenation(f.parts).contiguous(0, f.size, scratch);
        ndjson += "\n" + nlohmann::json{{"key", "file"},
                                        {"value",
                                         {{"content", base64_encode(bytes)}, {"path", f.path}, {"encoding", "base64"}}}}
                             .dump();
      }
    }
    for (const std::string& path : deleted) {
      ndjson += "\n" + nlohmann::json{{"key", "deletedFile"}, {"value", {{"path", path}}}}.dump();
    }
    const std::string path = api("commit");
    const util::HttpResponse r = hub_post(hub_, path, ndjson, "application/x-ndjson");
    if (r.status == 412 && !parent.empty()) return std::nullopt;
    if (r.status != 200 && r.status != 201) refused(hub_, where_, "commit", r);
    const auto j = nlohmann::json::parse(r.body, nullptr, false);
    if (j.is_object() && j.contains("commitOid") && j["commitOid"].is_string()) {
      const std::string id = j["commitOid"].get<std::string>();
      if (is_commit_id(id)) return id;
    }
    return std::string();
  }

  // What the Hub says about `files` before any of them goes up: a token without write access, a missing revision
  // or an ignored name is refused here (and a missing repository created). Nothing is committed.
  void check(std::vector<HubFile>& files) {
    measure(files);
    preupload(files);
  }

 private:
  // Sizes and SHA-256s, the files hashed in parallel.
  static void measure(std::vector<HubFile>& files) {
    parallel_for(files.size(), hf_parallelism(), [&](size_t i) {
      HubFile& f = files[i];
      f.size = Concatenation(f.parts).size();
      f.oid = util::sha256_hex(f.parts);
    });
  }

  std::string api(const char* verb) const {
    return fmt::format("/api/{}/{}/{}/{}", l_.kind, l_.repo, verb, util::url_encode(l_.revision));
  }

  // Asks which files go to LFS; creates the repository when the Hub has none by that name.
  void preupload(std::vector<HubFile>& files) {
    std::map<std::string, HubFile*> by_path;
    for (HubFile& f : files) by_path[f.path] = &f;
    for (size_t start = 0; start < files.size(); start += 256) {
      nlohmann::json body{{"files", nlohmann::json::array()}};
      for (size_t i = start; i < std::min(files.size(), start + 256); ++i) {
        std::string scratch;  // the first 512 bytes
        const std::string_view sample =
            Concatenation(files[i].parts).contiguous(0, std::min<uint64_t>(files[i].size, 512), scratch);
        body["files"].push_back({{"path", files[i].path}, {"sample", base64_encode(sample)}, {"size", files[i].size}});
      }
      const std::string path = api("preupload");
      util::HttpResponse r = hub_post(hub_, path, body.dump(), "application/json");
      if (r.status == 404 && r.header("x-error-code") == "RepoNotFound" && !created_) {
        create_repository();
        r = hub_post(hub_, path, body.dump(), "application/json");
      }
      if (r.status != 200) refused(hub_, where_, "preupload", r);
      const auto j = nlohmann::json::parse(r.body, nullptr, false);
      if (!j.is_object() || !j.contains("files") || !j["files"].is_array()) {
        throw Error(kHfComponent, fmt::format("{}: the Hub's preupload answer has no \"files\" list", where_));
      }
      for (const auto& item : j["files"]) {
        const std::string p = item.is_object() ? item.value("path", "") : "";
        const auto it = by_path.find(p);
        const std::string mode = item.is_object() ? item.value("uploadMode", "") : "";
        if (it == by_path.end() || (mode != "lfs" && mode != "regular")) {
          throw Error(kHfComponent, fmt::format("{}: the Hub's preupload answer names \"{}\" with upload mode \"{}\" "
                                                "(expected a file of this commit, \"lfs\" or \"regular\")",
                                                where_, p.substr(0, 200), mode.substr(0, 40)));
        }
        if (item.value("shouldIgnore", false)) {
          throw Error(kHfComponent,
                      fmt::format("{}: the repository's .gitignore ignores {}: the Hub would leave it out "
                                  "of the commit",
                                  where_, p));
        }
        it->second->lfs = mode == "lfs" && it->second->size > 0;  // empty files cannot go to LFS
      }
    }
  }

  void create_repository() {
    created_ = true;
    if (l_.kind == "spaces") {
      throw Error(kHfComponent, fmt::format("{}: the Space {} does not exist; create it first (a Space needs its SDK "
                                            "chosen)",
                                            where_, l_.repo));
    }
    const size_t slash = l_.repo.find('/');
    nlohmann::json body{
        {"name", l_.repo.substr(slash + 1)}, {"organization", l_.repo.substr(0, slash)}, {"private", true}};
    if (l_.kind == "datasets") body["type"] = "dataset";
    const util::HttpResponse r = hub_post(hub_, "/api/repos/create", body.dump(), "application/json");
    if (r.status != 200 && r.status != 201 && r.status != 409) refused(hub_, where_, "creation of the repository", r);
  }

  // The LFS batch request, then every PUT it asks for (parallel), multipart completions and verifications.
  void upload_lfs(const std::vector<const HubFile*>& files) {
    std::map<std::string, const HubFile*> by_oid;
    for (const HubFile* f : files) by_oid.emplace(f->oid, f);  // identical files are one object
    std::vector<const HubFile*> unique;
    for (const auto& [oid, f] : by_oid) unique.push_back(f);
    const std::string batch =
        fmt::format("/{}{}.git/info/lfs/objects/batch", l_.kind == "models" ? "" : l_.kind + "/", l_.repo);
    std::vector<LfsPut> puts;
    struct Finish {
      const HubFile* file;
      std::string complete_url;  // multipart only
      size_t first_put = 0, n_puts = 0;
      std::string verify_url;
    };
    std::vector<Finish> finishes;
    for (size_t start = 0; start < unique.size(); start += 256) {
      nlohmann::json body{{"operation", "upload"},
                          {"transfers", {"basic", "multipart"}},
                          {"objects", nlohmann::json::array()},
                          {"hash_algo", "sha256"},
                          {"ref", {{"name", l_.revision}}}};
      for (size_t i = start; i < std::min(unique.size(), start + 256); ++i) {
        body["objects"].push_back({{"oid", unique[i]->oid}, {"size", unique[i]->size}});
      }
      const util::HttpResponse r = hub_post(hub_, batch, body.dump(), "application/vnd.git-lfs+json");
      if (r.status != 200) refused(hub_, where_, "LFS batch request", r);
      const auto j = nlohmann::json::parse(r.body, nullptr, false);
      if (!j.is_object() || !j.contains("objects") || !j["objects"].is_array()) {
        throw Error(kHfComponent, fmt::format("{}: the Hub's LFS batch answer has no \"objects\" list", where_));
      }
      for (const auto& o : j["objects"]) {
        const std::string oid = o.is_object() ? o.value("oid", "") : "";
        const auto it = by_oid.find(oid);
        if (it == by_oid.end()) {
          throw Error(kHfComponent, fmt::format("{}: the Hub's LFS batch answer names object \"{}\", not one of this "
                                                "upload",
                                                where_, oid.substr(0, 80)));
        }
        const HubFile& f = *it->second;
        if (o.contains("error")) {
          throw Error(kHfComponent, fmt::format("{}: the Hub refused the LFS upload of {}: {}", where_, f.path,
                                                o["error"].dump().substr(0, 300)));
        }
        if (!o.contains("actions") || !o["actions"].is_object() || !o["actions"].contains("upload")) continue;
        const auto& actions = o["actions"];  // (no upload action: the Hub has the object already)
        const auto& upload = actions["upload"];
        if (!upload.is_object() || !upload.contains("href") || !upload["href"].is_string()) {
          throw Error(kHfComponent, fmt::format("{}: the Hub's LFS upload action for {} has no href", where_, f.path));
        }
        Finish fin{&f, "", puts.size(), 0, ""};
        if (actions.contains("verify") && actions["verify"].is_object() && actions["verify"].contains("href") &&
            actions["verify"]["href"].is_string()) {
          fin.verify_url = actions["verify"]["href"];
        }
        const auto header = upload.value("header", nlohmann::json::object());
        if (header.is_object() && header.contains("chunk_size")) {
          fin.complete_url = upload["href"];
          add_parts(f, header, puts);
        } else {
          puts.push_back({&f, upload["href"], 0, f.size, ""});
        }
        fin.n_puts = puts.size() - fin.first_put;
        finishes.push_back(std::move(fin));
      }
    }
    parallel_for(puts.size(), hf_parallelism(), [&](size_t i) { put(puts[i]); });
    for (const Finish& fin : finishes) {
      if (!fin.complete_url.empty()) {
        nlohmann::json parts = nlohmann::json::array();
        for (size_t i = 0; i < fin.n_puts; ++i) {
          parts.push_back({{"partNumber", i + 1}, {"etag", puts[fin.first_put + i].etag}});
        }
        post_outside(fin.complete_url, nlohmann::json{{"oid", fin.file->oid}, {"parts", parts}}.dump(),
                     "completion of the multipart LFS upload of " + fin.file->path);
      }
      if (!fin.verify_url.empty()) {
        post_outside(fin.verify_url, nlohmann::json{{"oid", fin.file->oid}, {"size", fin.file->size}}.dump(),
                     "verification of the LFS upload of " + fin.file->path);
      }
    }
  }

  // A multipart upload's PUTs: the header's numbered URLs, one per chunk_size bytes.
  void add_parts(const HubFile& f, const nlohmann::json& header, std::vector<LfsPut>& puts) const {
    const auto& c = header["chunk_size"];
    uint64_t chunk = 0;
    if (c.is_number_unsigned()) {
      chunk = c.get<uint64_t>();
    } else if (c.is_string()) {
      chunk = byte_count(c.get<std::string>(), where_, "the LFS chunk_size", kHfComponent);
    }
    std::vector<std::pair<uint64_t, std::string>> urls;
    for (const auto& [key, value] : header.items()) {
      uint64_t n = 0;
      if (std::from_chars(key.data(), key.data() + key.size(), n).ec == std::errc() && value.is_string()) {
        urls.emplace_back(n, value.get<std::string>());
      }
    }
    std::sort(urls.begin(), urls.end());
    if (chunk == 0 || urls.size() != (f.size + chunk - 1) / chunk) {
      throw Error(kHfComponent, fmt::format("{}: the Hub's multipart LFS upload of {} ({} bytes) gives {} part URLs "
                                            "for chunk_size {}",
                                            where_, f.path, f.size, urls.size(), c.dump().substr(0, 40)));
    }
    for (size_t i = 0; i < urls.size(); ++i) {
      const uint64_t offset = i * chunk;
      puts.push_back({&f, urls[i].second, offset, std::min(chunk, f.size - offset), ""});
    }
  }

  // The headers for a URL the batch answer named: the token only when it points at the endpoint's own host.
  std::vector<std::pair<std::string, std::string>> outside_headers(const std::string& url) const {
    std::vector<std::pair<std::string, std::string>> h;
    const auto target = util::parse_url(url), endpoint = util::parse_url(hub_.endpoint());
    if (target && endpoint && target->scheme == endpoint->scheme && target->authority == endpoint->authority &&
        hub_.has_token()) {
      h = hub_.authorization();
    }
    return h;
  }

  void put(LfsPut& p) {
    Concatenation bytes(p.file->parts);
    Exchange x;
    x.method = "PUT";
    x.url = p.url;
    x.headers = outside_headers(p.url);
    x.payload_parts = bytes.views(p.offset, p.length);
    const util::HttpResponse r =
        perform(x, fmt::format("LFS upload of {} (bytes {}..{})", p.file->path, p.offset, p.offset + p.length));
    p.etag = r.header("etag");
    if (p.etag.empty() && p.length != p.file->size) {
      throw Error(kHfComponent, fmt::format("{}: the LFS part upload of {} to {} answered no ETag", where_,
                                            p.file->path, shown_url(p.url)));
    }
  }

  void post_outside(const std::string& url, const std::string& body, const std::string& what) {
    Exchange x;
    x.method = "POST";
    x.url = url;
    x.headers = outside_headers(url);
    x.headers.emplace_back("Content-Type", "application/vnd.git-lfs+json");
    x.headers.emplace_back("Accept", "application/vnd.git-lfs+json");
    x.payload = body;
    perform(x, what);
  }

  // One exchange outside the Hub's API (an upload URL, a completion, a verification), retried with backoff while it
  // fails in a way a retry may mend; a failure that stays is an Error naming `what` and the URL without its query.
  util::HttpResponse perform(Exchange& x, const std::string& what) {
    static HttpPool pool;
    x.stall_timeout_s = hf_stall_timeout_s();
    const int attempts = hf_max_attempts();
    for (int attempt = 1;; ++attempt) {
      bool retryable = false;
      util::HttpResponse r = pool.perform(x, &retryable);
      if (r.status >= 200 && r.status < 300) return r;
      const bool again = r.status == 0 ? retryable : retryable_status(r.status);
      if (!again || attempt >= attempts) {
        throw Error(kHfComponent, fmt::format("{}: the {} at {} failed: {}", where_, what, shown_url(x.url),
                                              r.status == 0 ? r.transport_error : fmt::format("HTTP {}", r.status)));
      }
      backoff_sleep(attempt, 0.5, 8.0);
    }
  }

  std::string where_;
  HfLocation l_;
  util::HubClient hub_;
  bool created_ = false;
};

class HfBackend final : public Backend {
 public:
  std::string get(const Uri& u) override {
    return hf_client(u).call("GET", hf_resolve_path(hf_locate(u)), nullptr, true).body;
  }

  std::string get_range(const Uri& u, uint64_t offset, uint64_t length) override {
    if (length == 0) return "";
    const auto r = hf_client(u).call("GET", hf_resolve_path(hf_locate(u)), nullptr, true,
                                     {{"Range", fmt::format("bytes={}-{}", offset, offset + length - 1)}});
    if (r.status != 206 || r.body.size() != length) {
      throw Error(kHfComponent, fmt::format("{}: asked for {} bytes at {}, got HTTP {} with {} bytes (the file is "
                                            "shorter, or the server ignores ranges)",
                                            u.str(), length, offset, r.status, r.body.size()));
    }
    return r.body;
  }

  // In parallel ranges of one commit: the first range's answer (or its redirect to the CDN) names the commit the
  // revision points at (X-Repo-Commit), and every other range reads that commit's file.
  void download(const Uri& u, const std::string& local_path) override {
    const HfLocation l = hf_locate(u);
    const util::HubClient hub = hf_client(u);
    const uint64_t part = static_cast<uint64_t>(env_int("TESSERA_HF_PART_SIZE_MB", 16, 1, 4096, kHfComponent)) << 20;
    ranged_download(u.str(), local_path, part, hf_parallelism(),
                    [&](uint64_t first, uint64_t last, const std::string& pin,
                        const std::function<void(uint64_t, std::string_view)>& sink) {
                      HfLocation at = l;
                      if (!pin.empty()) at.revision = pin;
                      const std::vector<std::pair<std::string, std::string>> range{
                          {"Range", fmt::format("bytes={}-{}", first, last)}};
                      uint64_t offset = 0;
                      const std::function<void(std::string_view)> write = [&](std::string_view bytes) {
                        sink(offset, bytes);
                        offset += bytes.size();
                      };
                      // The first range without following the redirect: the Hub's own answer names the commit.
                      util::HttpResponse r =
                          hub.send("GET", hf_resolve_path(at),
                                   pin.empty() ? std::function<void(std::string_view)>() : write, !pin.empty(), range);
                      std::string commit = pin.empty() ? r.header("x-repo-commit") : pin;
                      if (commit.empty() || commit.find('/') != std::string::npos) commit = l.revision;
                      if (pin.empty() && r.status >= 300 && r.status < 400) {
                        at.revision = commit;
                        r = hub.send("GET", hf_resolve_path(at), write, true, range);
                      } else if (pin.empty() && r.status >= 200 && r.status < 300) {
                        write(r.body);
                      }
                      if (r.status != 200 && r.status != 206 && r.status != 416) {
                        hub.fail("GET", hf_resolve_path(at), r);
                      }
                      return RangeAnswer{r.status, r.header("content-range"), commit};
                    });
  }

  void put_parts(const Uri& u, const std::vector<std::string_view>& parts) override {
    const HfLocation l = file_location(u);
    std::vector<HubFile> files{HubFile(l.path, parts)};
    HubWrite(u, l).commit(files, {}, fmt::format("Upload {} with Tessera", l.path));
  }

  void upload_file(const std::string& local_path, const Uri& u) override {
    const MappedFile file(local_path, kHfComponent);
    put_parts(u, {file.bytes()});
  }

  // A commit deleting the file; none when it is missing.
  void remove(const Uri& u) override {
    const HfLocation l = file_location(u);
    if (!stat(u)) return;
    std::vector<HubFile> none;
    HubWrite(u, l).commit(none, {l.path}, fmt::format("Delete {} with Tessera", l.path));
  }

  // The whole folder, deletions included, as one commit.
  void upload_tree(const std::string& local_dir, const Uri& folder, const std::vector<std::string>& files,
                   const std::vector<Uri>& stale) override {
    HfLocation l = hf_locate(folder);
    while (!l.path.empty() && l.path.back() == '/') l.path.pop_back();
    std::vector<std::unique_ptr<MappedFile>> mapped;
    std::vector<HubFile> adds;
    for (const std::string& rel : files) {
      mapped.push_back(std::make_unique<MappedFile>((std::filesystem::path(local_dir) / rel).string(), kHfComponent));
      adds.emplace_back(l.path.empty() ? rel : l.path + "/" + rel,
                        std::vector<std::string_view>{mapped.back()->bytes()});
    }
    std::vector<std::string> deleted;
    for (const Uri& s : stale) deleted.push_back(file_location(s).path);
    HubWrite(folder, l).commit(
        adds, deleted,
        fmt::format("Upload {} with Tessera ({} files)", l.path.empty() ? "the repository" : l.path, files.size()));
  }

  // The folder of the prefix, listed recursively and filtered to the prefix.
  std::vector<ObjectInfo> list(const Uri& prefix) override {
    const HfLocation l = hf_locate(prefix);
    const size_t slash = l.path.rfind('/');
    const std::string folder = slash == std::string::npos ? "" : l.path.substr(0, slash);
    const util::HubClient hub = hf_client(prefix);
    std::string page = fmt::format("/api/{}/{}/tree/{}/{}?recursive=true", l.kind, l.repo, util::url_encode(l.revision),
                                   util::url_encode(folder, true));
    std::vector<ObjectInfo> out;
    for (int pages = 0; !page.empty(); ++pages) {
      const auto r = hub.send("GET", page, nullptr, true);
      if (r.status == 404 && pages == 0) return out;  // no such folder
      if (r.status != 200) hub.fail("GET", page, r);
      const auto items = nlohmann::json::parse(r.body, nullptr, false);
      if (!items.is_array()) {
        throw Error(kHfComponent, fmt::format("{}: the Hub's listing of {} is not a JSON array", prefix.str(), page));
      }
      for (const auto& item : items) {
        if (!item.is_object() || item.value("type", "") != "file" || !item.contains("path") ||
            !item["path"].is_string()) {
          continue;
        }
        const std::string path = item["path"];
        if (path.rfind(l.path, 0) != 0) continue;
        const auto& sized = item.contains("lfs") && item["lfs"].is_object() ? item["lfs"] : item;
        const uint64_t size =
            sized.contains("size") && sized["size"].is_number_unsigned() ? sized["size"].get<uint64_t>() : 0;
        out.push_back({l.root + path, size, ""});
      }
      page = next_page(r.header("link"), hub.endpoint());
      if (pages > 100000) throw Error(kHfComponent, fmt::format("{}: the listing never ends", prefix.str()));
    }
    return out;
  }

  std::optional<ObjectInfo> stat(const Uri& u) override { return stat_at(u, hf_locate(u)); }

  // A conditional write checked by the Hub: the file is compared at the branch's current commit, and the commit that
  // writes it names that commit as its parent, so the Hub refuses it (412) if anything was committed in between.
  std::optional<std::string> put_if(const Uri& u, std::string_view data,
                                    const std::optional<std::string>& expected) override {
    const HfLocation l = file_location(u);
    const util::HubClient hub = hf_client(u);
    std::string parent;  // none for a repository or branch the Hub does not have yet: the commit creates it
    const std::string info = fmt::format("/api/{}/{}/revision/{}", l.kind, l.repo, util::url_encode(l.revision));
    const util::HttpResponse r = hub.send("GET", info, nullptr, true);
    if (r.status != 404) {
      if (r.status != 200) hub.fail("GET", info, r);
      const auto j = nlohmann::json::parse(r.body, nullptr, false);
      if (j.is_object() && j.contains("sha") && j["sha"].is_string()) parent = j["sha"].get<std::string>();
      if (!is_commit_id(parent)) {
        throw Error(kHfComponent,
                    fmt::format("{}: {}{} named no commit of revision {}", u.str(), hub.endpoint(), info, l.revision));
      }
    }
    HfLocation at = l;
    at.revision = parent;
    const std::optional<ObjectInfo> now = parent.empty() ? std::nullopt : stat_at(u, at);
    if (now.has_value() != expected.has_value() || (now && now->etag != *expected)) return std::nullopt;
    std::vector<HubFile> files{HubFile(l.path, {data})};
    const std::optional<std::string> made =
        HubWrite(u, l).commit(files, {}, fmt::format("Upload {} with Tessera", l.path), parent);
    if (!made) return std::nullopt;
    at.revision = made->empty() ? l.revision : *made;
    const std::optional<ObjectInfo> after = stat_at(u, at);
    return after ? after->etag : std::string();
  }

  // The file at location `l` (its revision may be a commit id): its size and its ETag as huggingface_hub reads it
  // (an LFS file's SHA-256 from X-Linked-Etag, else the git blob id), without quotes.
  static std::optional<ObjectInfo> stat_at(const Uri& u, const HfLocation& l) {
    const util::HubClient hub = hf_client(u);
    const std::string path = hf_resolve_path(l);
    const auto r = hub.send("HEAD", path, nullptr, false);
    if (r.status == 404) return std::nullopt;
    if (r.status < 200 || r.status >= 400) hub.fail("HEAD", path, r);
    const std::string size = r.header("x-linked-size").empty() ? r.header("content-length") : r.header("x-linked-size");
    uint64_t bytes = 0;
    if (!size.empty() && std::from_chars(size.data(), size.data() + size.size(), bytes).ec != std::errc()) {
      throw Error(kHfComponent,
                  fmt::format("{}: the Hub sent size \"{}\", not a byte count", u.str(), size.substr(0, 40)));
    }
    std::string etag = r.header("x-linked-etag").empty() ? r.header("etag") : r.header("x-linked-etag");
    if (etag.rfind("W/", 0) == 0) etag.erase(0, 2);
    return ObjectInfo{u.str(), bytes, strip_quotes(etag)};
  }

  // The Hub's preupload answer for an empty probe file, which needs write access: no commit for a check.
  void probe_write(const Uri& folder, const std::string& probe_object) override {
    const Uri object = parse_uri(join(folder.str(), probe_object));
    std::vector<HubFile> files{HubFile(file_location(object).path, {})};
    HubWrite(folder, hf_locate(folder)).check(files);
  }

 private:
  // A file's location; a write names a file, not the repository itself.
  static HfLocation file_location(const Uri& u) {
    HfLocation l = hf_locate(u);
    if (l.path.empty() || l.path.back() == '/') {
      throw ConfigError(kHfComponent, fmt::format("{}: names no file inside the repository", u.str()));
    }
    return l;
  }

  // The path of the Link header's rel="next" page under `endpoint`, or "" when there is none.
  static std::string next_page(const std::string& link, const std::string& endpoint) {
    const size_t rel = link.find("rel=\"next\"");
    if (rel == std::string::npos) return "";
    const size_t open = link.rfind('<', rel), close = link.find('>', open);
    if (open == std::string::npos || close == std::string::npos || close > rel) return "";
    const std::string url = link.substr(open + 1, close - open - 1);
    if (url.rfind(endpoint + "/", 0) != 0) {
      throw Error(kHfComponent, fmt::format("the Hub's next listing page {} is not under {}", url, endpoint));
    }
    return url.substr(endpoint.size());
  }
};

}  // namespace

Backend& hf_backend() {
  static HfBackend backend;
  return backend;
}

}  // namespace tessera::storage
