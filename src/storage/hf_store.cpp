// hf://: files in Hugging Face Hub repositories, read through the Hub's HTTP API as huggingface_hub's HfFileSystem
// reads them (what MosaicML Streaming uses for `remote: hf://...`). Read-only.
//
//   hf://datasets/<org>/<name>[@<revision>]/<path>   a dataset repository (Streaming's form)
//   hf://spaces/<org>/<name>[@<revision>]/<path>     a Space
//   hf://<org>/<name>[@<revision>]/<path>            a model repository
//
// Files come from /<repo>/resolve/<revision>/<path> (redirects followed; ranges with a Range header); listings from
// /api/<kind>/<repo>/tree/<revision>/<folder>?recursive=true, page by page (the Link header's next page). Endpoint and
// token as huggingface_hub (util/hf_hub_client.h); HF_HUB_OFFLINE refuses every request.
#include <fmt/format.h>

#include <charconv>
#include <nlohmann/json.hpp>

#include "backend.h"
#include "tessera/util/error.h"
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

  void download(const Uri& u, const std::string& local_path) override {
    download_through_temporary(u.str(), local_path, [&](const DownloadWriter& write) {
      uint64_t got = 0;
      const auto r = hf_client(u).call(
          "GET", hf_resolve_path(hf_locate(u)),
          [&](std::string_view bytes) {
            write(got, bytes);
            got += bytes.size();
          },
          true);
      if (const std::string length = r.header("content-length"); !length.empty() && length != std::to_string(got)) {
        throw Error(kHfComponent, fmt::format("{}: {} bytes arrived of the {} announced", u.str(), got, length));
      }
    });
  }

  void put_parts(const Uri& u, const std::vector<std::string_view>&) override { read_only(u); }
  void upload_file(const std::string&, const Uri& u) override { read_only(u); }
  void remove(const Uri& u) override { read_only(u); }

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

  std::optional<ObjectInfo> stat(const Uri& u) override {
    const util::HubClient hub = hf_client(u);
    const std::string path = hf_resolve_path(hf_locate(u));
    const auto r = hub.send("HEAD", path, nullptr, false);
    if (r.status == 404) return std::nullopt;
    if (r.status < 200 || r.status >= 400) hub.fail("HEAD", path, r);
    const std::string size = r.header("x-linked-size").empty() ? r.header("content-length") : r.header("x-linked-size");
    uint64_t bytes = 0;
    if (!size.empty() && std::from_chars(size.data(), size.data() + size.size(), bytes).ec != std::errc()) {
      throw Error(kHfComponent,
                  fmt::format("{}: the Hub sent size \"{}\", not a byte count", u.str(), size.substr(0, 40)));
    }
    return ObjectInfo{u.str(), bytes, ""};
  }

 private:
  [[noreturn]] static void read_only(const Uri& u) {
    throw Error(kHfComponent,
                fmt::format("{}: hf:// is read-only in Tessera (uploads to the Hub are not implemented; "
                            "save locally or to an object store and upload with `huggingface-cli upload`)",
                            u.str()));
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
