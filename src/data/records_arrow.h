// The Arrow-backed record readers (records_arrow.cpp), the only code that includes Arrow's headers.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessera/data/records.h"

namespace tessera::data::detail {

// tessera::Error (component "records") saying "{where}: {what}".
[[noreturn]] void fail_records(const std::string& where, const std::string& what);

std::unique_ptr<RecordFile> open_parquet_file(const std::string& path, const std::vector<std::string>& columns);
std::unique_ptr<RecordFile> open_arrow_file(const std::string& path, const std::vector<std::string>& columns);
std::unique_ptr<RecordFile> open_csv_file(const std::string& path, const std::vector<std::string>& columns);

}  // namespace tessera::data::detail
