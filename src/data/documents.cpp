// Document readers for the fortunes, plain-text and JSON-lines formats.
#include "tessera/data/documents.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "tessera/util/error.h"
#include "tessera/util/file_io.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;
constexpr const char* kDocumentsComponent = "documents";

std::string read_all(const fs::path& p) {
  return util::read_file(p.string(), kDocumentsComponent);
}

bool wanted_in_directory(const fs::path& p, DocumentFormat format) {
  const std::string name = p.filename().string();
  if (name.empty() || name[0] == '.') return false;
  switch (format) {
    case DocumentFormat::kFortunes:
      return !p.has_extension();
    case DocumentFormat::kText:
      return true;
    case DocumentFormat::kJsonl:
      return p.extension() == ".jsonl" || p.extension() == ".json";
  }
  return false;
}

std::vector<fs::path> expand(const std::vector<fs::path>& paths, DocumentFormat format) {
  std::vector<fs::path> files;
  for (const fs::path& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<fs::path> found;
      for (auto it = fs::recursive_directory_iterator(p, fs::directory_options::follow_directory_symlink, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (it->is_regular_file(ec) && !it->is_symlink(ec) && wanted_in_directory(it->path(), format))
          found.push_back(it->path());
      }
      if (ec) throw Error(kDocumentsComponent, fmt::format("{}: cannot list: {}", p.string(), ec.message()));
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::exists(p, ec)) {
      files.push_back(p);
    } else {
      throw Error(kDocumentsComponent, fmt::format("{}: no such file or directory", p.string()));
    }
  }
  return files;
}

void read_fortunes(const std::string& text, std::vector<std::string>& out) {
  std::string doc;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    const size_t next = eol == std::string::npos ? text.size() : eol + 1;
    std::string_view line(text.data() + pos, (eol == std::string::npos ? text.size() : eol) - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line == "%") {
      if (!doc.empty()) out.push_back(std::move(doc));
      doc.clear();
    } else {
      doc.append(text, pos, next - pos);
    }
    pos = next;
  }
  if (!doc.empty()) out.push_back(std::move(doc));
}

void read_jsonl(const fs::path& file, const std::string& text, std::vector<std::string>& out) {
  size_t pos = 0;
  for (int64_t line_no = 1; pos < text.size(); ++line_no) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    const std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw Error(kDocumentsComponent, fmt::format("{}:{}: malformed JSON: {}", file.string(), line_no, e.what()));
    }
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
      throw Error(kDocumentsComponent,
                  fmt::format("{}:{}: expected an object with a string \"text\" field", file.string(), line_no));
    std::string doc = j["text"].get<std::string>();
    if (!doc.empty()) out.push_back(std::move(doc));
  }
}

}  // namespace

DocumentFormat parse_document_format(const std::string& name) {
  if (name == "fortunes") return DocumentFormat::kFortunes;
  if (name == "text") return DocumentFormat::kText;
  if (name == "jsonl") return DocumentFormat::kJsonl;
  throw ConfigError(kDocumentsComponent,
                    fmt::format("unknown document format \"{}\" (expected fortunes, text or jsonl)", name));
}

std::vector<std::string> read_documents(const std::vector<std::filesystem::path>& paths, DocumentFormat format) {
  std::vector<std::string> out;
  for (const fs::path& file : expand(paths, format)) {
    std::string text = read_all(file);
    switch (format) {
      case DocumentFormat::kFortunes:
        read_fortunes(text, out);
        break;
      case DocumentFormat::kText:
        if (!text.empty()) out.push_back(std::move(text));
        break;
      case DocumentFormat::kJsonl:
        read_jsonl(file, text, out);
        break;
    }
  }
  return out;
}

}  // namespace tessera::data
