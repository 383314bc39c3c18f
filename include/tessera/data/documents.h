// Reading raw text documents for tokenizer training and text -> MDS conversion.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace tessera::data {

enum class DocumentFormat {
  kFortunes,  // fortune(6) files: documents separated by lines holding only "%"; directories: files without an
              // extension (the .dat indexes and .u8 links are skipped)
  kText,      // one document per file; directories: every regular file not starting with "."
  kJsonl,     // one JSON object per line, the document in its "text" string; directories: *.jsonl and *.json files
};

// "fortunes", "text" or "jsonl"; anything else is a tessera::ConfigError.
DocumentFormat parse_document_format(const std::string& name);

// The documents of `paths` (files, or directories searched recursively, files in sorted path order) in order.
// Empty documents are skipped. Text is returned as stored (no UTF-8 repair; the tokenizer repairs invalid UTF-8).
// Errors (tessera::Error, component "documents") name the file, and the line for jsonl: a missing path, an
// unreadable file, a malformed JSON line, a line without a string "text" field.
std::vector<std::string> read_documents(const std::vector<std::filesystem::path>& paths, DocumentFormat format);

}  // namespace tessera::data
