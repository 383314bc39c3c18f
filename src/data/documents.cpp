// Document readers for the fortunes, plain-text and JSON-lines formats, over records.h's readers.
#include "tessera/data/documents.h"

#include <fmt/format.h>

#include "tessera/data/records.h"
#include "tessera/util/error.h"

namespace tessera::data {
namespace {

constexpr const char* kDocumentsComponent = "documents";

RecordFormat record_format(DocumentFormat format) {
  switch (format) {
    case DocumentFormat::kFortunes:
      return RecordFormat::kFortunes;
    case DocumentFormat::kText:
      return RecordFormat::kText;
    case DocumentFormat::kJsonl:
      return RecordFormat::kJsonl;
  }
  return RecordFormat::kText;
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
  const RecordFormat rf = record_format(format);
  std::vector<std::string> inputs;
  for (const auto& p : paths) inputs.push_back(p.string());
  RecordStream stream(expand_record_inputs(inputs, rf), rf);
  std::vector<std::string> out;
  std::vector<Record> rows;
  for (;;) {
    rows.clear();
    const int64_t first = stream.position();
    if (stream.read(rows, 4096) == 0) break;
    for (size_t i = 0; i < rows.size(); ++i) {
      auto it = rows[i].find("text");
      if (it == rows[i].end() || !it->is_string()) {
        throw Error(kDocumentsComponent, fmt::format("{}: expected an object with a string \"text\" field",
                                                     stream.where(first + static_cast<int64_t>(i))));
      }
      if (!it->get_ref<const std::string&>().empty()) out.push_back(it->get<std::string>());
    }
  }
  return out;
}

}  // namespace tessera::data
