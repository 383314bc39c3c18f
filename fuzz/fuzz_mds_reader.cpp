// libFuzzer target: the MDS reader on an arbitrary index.json and shard. The input is split at its first 0xFF byte
// into index.json and shard.00000.mds (written to a per-process scratch dataset folder); hashes are not verified so the
// fuzzer reaches the shard parsing (and, for an index naming shard.00000.mds as a compressed shard, decompression).
// Every sample is read and decoded. Anything but tessera::Error is a finding, and so is any file the reader creates
// outside the dataset's folder (the seeds name shards "../x.mds", "/tmp/x.mds", "sub/x.mds" and compressed shards
// whose frames claim more than raw_data.bytes).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "tessera/data/mds.h"
#include "tessera/util/error.h"

namespace {

// <tmp>/tessera_fuzz_mds_<pid>/ds: the dataset folder, alone in its parent, so that an escape is seen.
const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("tessera_fuzz_mds_" + std::to_string(getpid())) / "ds";
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

// Aborts (a finding) if anything but the dataset folder appeared beside it.
void check_nothing_escaped() {
  for (const auto& e : std::filesystem::directory_iterator(scratch().parent_path())) {
    if (e.path() != scratch()) {
      std::fprintf(stderr, "the reader created %s outside the dataset folder\n", e.path().c_str());
      std::abort();
    }
  }
}

void write(const std::filesystem::path& p, std::string_view s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(s.data(), static_cast<std::streamsize>(s.size()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t cut = input.find('\xff');
  const std::string_view index = input.substr(0, cut);
  const std::string_view shard = cut == std::string_view::npos ? std::string_view() : input.substr(cut + 1);
  const auto& dir = scratch();
  write(dir / "index.json", index);
  write(dir / "shard.00000.mds", shard);
  try {
    tessera::data::mds::MDSDataset ds(dir.string(), {.verify_hashes = false});
    for (int64_t i = 0; i < std::min<int64_t>(ds.size(), 256); ++i) ds.get(i);
  } catch (const tessera::Error&) {
  }
  check_nothing_escaped();
  return 0;
}
