// Hugging Face names: a local folder, a snapshot in the local cache (huggingface_hub's layout), or a download from
// the Hub into that cache.
#include "tessera/util/hf_hub.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "tessera/util/error.h"
#include "tessera/util/file_io.h"
#include "tessera/util/hf_hub_client.h"
#include "tessera/util/safe_path.h"

namespace tessera::util {
namespace fs = std::filesystem;
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

// A hub id: "name" or "org/name" of letters, digits, '-', '_', '.'.
bool is_hub_id(const std::string& s) {
  if (s.empty() || s.front() == '/' || s.back() == '/' || s.find("..") != std::string::npos) return false;
  int slashes = 0;
  for (const char c : s) {
    if (c == '/') {
      ++slashes;
    } else if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
      return false;
    }
  }
  return slashes <= 1;
}

bool truthy(const std::string& v) {
  std::string l = v;
  for (char& c : l) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return l == "1" || l == "on" || l == "yes" || l == "true";
}

// A name that becomes one path segment in the cache (a commit, an ETag): letters, digits, '.', '_', '-'.
bool plain_segment(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.size() <= 256 && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

// huggingface_hub's token: HF_TOKEN (or its older name), else the file `huggingface-cli login` writes.
std::string hub_token() {
  for (const char* v : {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"}) {
    if (std::string t = env(v); !t.empty()) return t;
  }
  fs::path file = env("HF_TOKEN_PATH");
  if (file.empty()) {
    file = !env("HF_HOME").empty() ? fs::path(env("HF_HOME")) / "token"
                                   : fs::path(env("HOME")) / ".cache" / "huggingface" / "token";
  }
  std::string t;
  if (std::ifstream f(file); f) std::getline(f, t);
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  return t;
}

// Weights in formats Tessera does not load (pickles, TensorFlow, Flax, ONNX, GGUF) are not downloaded.
bool wanted(const std::string& name) {
  static const std::vector<std::string> kSkipped = {".bin", ".pt",      ".pth",    ".pkl",       ".ckpt",
                                                    ".h5",  ".msgpack", ".onnx",   ".onnx_data", ".gguf",
                                                    ".ot",  ".tflite",  ".mlmodel"};
  return std::none_of(kSkipped.begin(), kSkipped.end(), [&](const std::string& ext) { return name.ends_with(ext); });
}

// Downloads the files of `repo`'s main revision that Tessera can use into the cache, laid out as huggingface_hub
// lays them out (blobs/<etag>, snapshots/<commit>/<file> -> ../../blobs/<etag>, refs/main), so that huggingface_hub
// and transformers use them offline and Tessera uses what they downloaded.
fs::path download_snapshot(const std::string& repo, const fs::path& repo_dir) {
  const HubClient hub(repo);
  const std::string api = fmt::format("/api/models/{}/revision/main", repo);
  const HttpResponse info = hub.call("GET", api, nullptr, true);
  const auto j = nlohmann::json::parse(info.body, nullptr, false);
  const std::string where = hub.endpoint() + api;
  if (j.is_discarded() || !j.is_object() || !j.contains("sha") || !j["sha"].is_string()) {
    throw Error("hf_hub", fmt::format("{}: {} did not answer a JSON object with the revision's sha", repo, where));
  }
  const std::string commit = j["sha"];
  if (!plain_segment(commit)) {
    throw Error("hf_hub", fmt::format("{}: {} names commit \"{}\", not a commit name: refusing it as a folder", repo,
                                      where, commit.substr(0, 100)));
  }
  const fs::path snapshot = repo_dir / "snapshots" / commit;
  std::vector<std::string> files;
  for (const auto& s : j.value("siblings", nlohmann::json::array())) {
    const std::string name = s.is_object() ? s.value("rfilename", "") : "";
    confined_path(snapshot, name, where, "hf_hub", "file name");  // throws for "../x", "/etc/x", ...
    if (wanted(name)) files.push_back(name);
  }
  fs::create_directories(repo_dir / "blobs");
  for (const std::string& name : files) {
    const std::string path = fmt::format("/{}/resolve/{}/{}", repo, commit, url_encode(name, true));
    // The file's ETag (an LFS file's is its SHA-256, in X-Linked-Etag on the redirect to the CDN) names its blob.
    const HttpResponse head = hub.call("HEAD", path, nullptr, false);
    std::string etag = head.header("x-linked-etag").empty() ? head.header("etag") : head.header("x-linked-etag");
    if (etag.rfind("W/", 0) == 0) etag.erase(0, 2);
    etag.erase(std::remove(etag.begin(), etag.end(), '"'), etag.end());
    if (!plain_segment(etag)) {
      throw Error("hf_hub", fmt::format("{}: {} has ETag \"{}\", not a blob name", repo, name, etag.substr(0, 100)));
    }
    const fs::path blob = repo_dir / "blobs" / etag;
    const fs::path link = confined_path(snapshot, name, where, "hf_hub", "file name");
    if (!fs::exists(blob)) {
      const std::string tmp = fmt::format("{}.incomplete.{}", blob.string(), ::getpid());
      const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) throw Error("hf_hub", fmt::format("{}: cannot create {}", repo, tmp));
      const std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> sha(EVP_MD_CTX_new(), EVP_MD_CTX_free);
      EVP_DigestInit_ex(sha.get(), EVP_sha256(), nullptr);
      uint64_t got = 0;
      try {
        hub.call(
            "GET", path,
            [&](std::string_view bytes) {
              if (::write(fd, bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size())) {
                throw Error("hf_hub", fmt::format("{}: cannot write {}", repo, tmp));
              }
              EVP_DigestUpdate(sha.get(), bytes.data(), bytes.size());
              got += bytes.size();
            },
            true);
        ::close(fd);
        const std::string size =
            head.header("x-linked-size").empty() ? head.header("content-length") : head.header("x-linked-size");
        if (!size.empty() && size != std::to_string(got)) {
          throw Error("hf_hub",
                      fmt::format("{}: {} arrived with {} bytes, the Hub announced {}", repo, name, got, size));
        }
        // An LFS file's ETag is its SHA-256: a damaged download never becomes a blob.
        unsigned char digest[EVP_MAX_MD_SIZE];
        unsigned int n = 0;
        EVP_DigestFinal_ex(sha.get(), digest, &n);
        std::string hex;
        for (unsigned int i = 0; i < n; ++i) hex += fmt::format("{:02x}", digest[i]);
        if (etag.size() == 64 && std::all_of(etag.begin(), etag.end(), ::isxdigit) && etag != hex) {
          throw Error("hf_hub",
                      fmt::format("{}: {} arrived with SHA-256 {}, the Hub announced {}", repo, name, hex, etag));
        }
        fs::rename(tmp, blob);
      } catch (...) {
        ::close(fd);
        ::unlink(tmp.c_str());
        throw;
      }
    }
    fs::create_directories(link.parent_path());
    const fs::path target = fs::relative(blob, link.parent_path());
    const fs::path tmp_link = link.string() + fmt::format(".tmp.{}", ::getpid());
    fs::remove(tmp_link);
    fs::create_symlink(target, tmp_link);
    fs::rename(tmp_link, link);
  }
  fs::create_directories(snapshot);
  fs::create_directories(repo_dir / "refs");
  write_file_atomically((repo_dir / "refs" / "main").string(), commit, "hf_hub");
  return snapshot;
}

}  // namespace

bool hf_hub_offline() {
  return truthy(env("HF_HUB_OFFLINE")) || truthy(env("TRANSFORMERS_OFFLINE"));
}

HubClient::HubClient(std::string repo) : repo_(std::move(repo)), token_(hub_token()) {
  endpoint_ = env("HF_ENDPOINT").empty() ? "https://huggingface.co" : env("HF_ENDPOINT");
  while (!endpoint_.empty() && endpoint_.back() == '/') endpoint_.pop_back();
}

int hub_max_attempts() {
  return env_int("TESSERA_HF_MAX_ATTEMPTS", 5, 1, 100, "hf_hub");
}

int hub_stall_timeout_s(int fallback) {
  return env_int("TESSERA_HF_STALL_TIMEOUT_S", fallback, 1, 3600, "hf_hub");
}

HttpResponse HubClient::send(const std::string& method, const std::string& path,
                             const std::function<void(std::string_view)>& sink, bool follow_redirects,
                             const std::vector<std::pair<std::string, std::string>>& headers) const {
  const int attempts = hub_max_attempts(), stall_timeout_s = hub_stall_timeout_s(60);
  bool delivered = false;  // once bytes reached the sink, a retry would deliver them twice
  const std::function<void(std::string_view)> counted =
      sink ? std::function<void(std::string_view)>([&](std::string_view bytes) {
        delivered = delivered || !bytes.empty();
        sink(bytes);
      })
           : nullptr;
  for (int tries = 1;; ++tries) {
    HttpRequest req;
    req.method = method;
    req.url = endpoint_ + path;
    req.follow_redirects = follow_redirects;
    req.sink = counted;
    req.timeout_s = sink ? 0 : 60;
    req.stall_timeout_s = stall_timeout_s;
    req.headers = headers;
    HttpResponse r = attempt(std::move(req));
    const bool again = r.status == 0 ? r.interrupted : retryable_status(r.status);
    if (!again || tries >= attempts || delivered) {
      if (r.status == 0) unreachable(r);
      return r;
    }
    backoff_sleep(tries, 0.5, 8.0);
  }
}

HttpResponse HubClient::send_body(const std::string& method, const std::string& path, std::string body,
                                  const std::vector<std::pair<std::string, std::string>>& headers,
                                  long stall_timeout_s) const {  // NOLINT(google-runtime-int)
  HttpRequest req;
  req.method = method;
  req.url = endpoint_ + path;
  req.body = std::move(body);
  req.timeout_s = 0;
  req.stall_timeout_s = stall_timeout_s;
  req.headers = headers;
  return exchange(std::move(req));
}

std::vector<std::pair<std::string, std::string>> HubClient::authorization() const {
  if (token_.empty()) return {};
  return {{"Authorization", "Bearer " + token_}};
}

HttpResponse HubClient::attempt(HttpRequest req) const {
  if (req.stall_timeout_s == 0) req.stall_timeout_s = 60;
  if (!token_.empty()) req.headers.emplace_back("Authorization", "Bearer " + token_);
  req.headers.emplace_back("Accept-Encoding", "identity");
  return http_request(req);
}

void HubClient::unreachable(const HttpResponse& r) const {
  throw Error("hf_hub", fmt::format("{}: cannot reach the Hugging Face Hub at {}: {} (HF_HUB_OFFLINE=1 uses the local "
                                    "cache only)",
                                    repo_, endpoint_, r.transport_error));
}

HttpResponse HubClient::exchange(HttpRequest req) const {
  HttpResponse r = attempt(std::move(req));
  if (r.status == 0) unreachable(r);
  return r;
}

HttpResponse HubClient::call(const std::string& method, const std::string& path,
                             const std::function<void(std::string_view)>& sink, bool follow_redirects,
                             const std::vector<std::pair<std::string, std::string>>& headers) const {
  HttpResponse r = send(method, path, sink, follow_redirects, headers);
  if (r.status >= 200 && r.status < (follow_redirects ? 300 : 400)) return r;
  fail(method, path, r);
}

void HubClient::fail(const std::string& method, const std::string& path, const HttpResponse& r) const {
  const std::string url = endpoint_ + path;
  const std::string token_note = token_.empty() ? "no token was sent (HF_TOKEN, or `huggingface-cli login`)"
                                                : "the token (HF_TOKEN or the saved login) was sent";
  if (r.status == 401 || r.status == 403) {
    throw Error("hf_hub", fmt::format("{}: the Hugging Face Hub refused {} (HTTP {}): a private or gated repository "
                                      "needs a token with access; {}",
                                      repo_, url, r.status, token_note));
  }
  if (r.status == 404) {
    throw Error("hf_hub", fmt::format("{}: no such repository or file on the Hugging Face Hub ({} answered 404; {})",
                                      repo_, url, token_note));
  }
  throw Error("hf_hub", fmt::format("{}: {} {} answered HTTP {}", repo_, method, url, r.status));
}

fs::path hf_hub_cache() {
  if (const std::string v = env("HF_HUB_CACHE"); !v.empty()) return v;
  if (const std::string v = env("HUGGINGFACE_HUB_CACHE"); !v.empty()) return v;
  if (const std::string v = env("HF_HOME"); !v.empty()) return fs::path(v) / "hub";
  if (const std::string v = env("XDG_CACHE_HOME"); !v.empty()) return fs::path(v) / "huggingface" / "hub";
  return fs::path(env("HOME")) / ".cache" / "huggingface" / "hub";
}

fs::path resolve_hf_folder(const std::string& name_or_path) {
  if (fs::is_directory(name_or_path)) return name_or_path;
  if (!is_hub_id(name_or_path)) {
    throw Error("hf_hub", fmt::format("{}: no such folder (and not a Hugging Face hub id)", name_or_path));
  }
  std::string flat = name_or_path;
  for (size_t i = flat.find('/'); i != std::string::npos; i = flat.find('/', i)) flat.replace(i, 1, "--");
  const fs::path repo = hf_hub_cache() / ("models--" + flat);
  const fs::path ref = repo / "refs" / "main";
  std::string commit;
  if (std::ifstream f(ref); f) std::getline(f, commit);
  while (!commit.empty() && std::isspace(static_cast<unsigned char>(commit.back()))) commit.pop_back();
  // The ref names a snapshot folder: a plain commit name, never a path ("../../x", "/abs").
  const bool plain = commit.empty() || plain_segment(commit);
  if (!plain) {
    throw Error("hf_hub", fmt::format("{}: holds \"{}\", not a commit name (letters, digits, '.', '_', '-'): refusing "
                                      "to use it as a snapshot folder of {}",
                                      ref.string(), commit.substr(0, 200), name_or_path));
  }
  const fs::path snapshot = repo / "snapshots" / commit;
  if (!commit.empty() && fs::is_directory(snapshot)) return snapshot;
  if (!hf_hub_offline()) return download_snapshot(name_or_path, repo);
  throw Error("hf_hub",
              fmt::format("{}: not a local folder, and not in the Hugging Face cache: {} {} (the cache is "
                          "HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub; HF_HUB_OFFLINE is set, so "
                          "nothing is downloaded: fetch it with `huggingface-cli download {}` or give a local path)",
                          name_or_path, commit.empty() ? "no" : "no snapshot",
                          commit.empty() ? ref.string() : snapshot.string(), name_or_path));
}

fs::path resolve_hf_tokenizer(const std::string& name_or_path) {
  if (fs::is_regular_file(name_or_path)) return name_or_path;
  const fs::path folder = resolve_hf_folder(name_or_path);
  // A tokenizer_config.json alone may name a tokenizer Tessera reads without one (LLM Foundry's tiktoken wrapper).
  if (!fs::is_regular_file(folder / "tokenizer.json") && !fs::is_regular_file(folder / "tokenizer_config.json"))
    throw Error("hf_hub",
                fmt::format("{}: no tokenizer.json (nor tokenizer_config.json) in {}", name_or_path, folder.string()));
  return folder;
}

fs::path resolve_tool_tokenizer(const std::string& tokenizer, const std::string& model, const std::string& tool) {
  try {
    return resolve_hf_tokenizer(tokenizer.empty() ? model : tokenizer);
  } catch (const Error& e) {
    throw ConfigError(tool, fmt::format("{}{}", e.message(),
                                        tokenizer.empty() ? " (give --tokenizer: a tokenizer.json, its folder or a hub "
                                                            "id in the local HF cache)"
                                                          : ""));
  }
}

}  // namespace tessera::util
