// Offline resolution of Hugging Face names in the local cache (huggingface_hub's layout).
#include "tessera/util/hf_hub.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>

#include "tessera/util/error.h"

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

}  // namespace

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
  const bool plain = commit != "." && commit != ".." && std::all_of(commit.begin(), commit.end(), [](char c) {
                       return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
                     });
  if (!plain) {
    throw Error("hf_hub", fmt::format("{}: holds \"{}\", not a commit name (letters, digits, '.', '_', '-'): refusing "
                                      "to use it as a snapshot folder of {}",
                                      ref.string(), commit.substr(0, 200), name_or_path));
  }
  const fs::path snapshot = repo / "snapshots" / commit;
  if (!commit.empty() && fs::is_directory(snapshot)) return snapshot;
  throw Error("hf_hub",
              fmt::format("{}: not a local folder, and not in the Hugging Face cache: {} {} (the cache is "
                          "HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub; Tessera does not download: "
                          "fetch it with `huggingface-cli download {}` or give a local path)",
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
