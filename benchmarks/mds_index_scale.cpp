// Memory and load time of an MDS index with many shards (default 1,000,000), as in LLM Foundry-scale mixtures.
// Writes a synthetic index.json (one ndarray:int32 column, xxh64 hashes, 4,091 samples per shard; shard files are not
// needed because shards open lazily), then measures MDSDataset construction time, resident-memory growth, and the time
// to locate random samples.
//
//   bench_mds_index_scale [--shards 1000000] [--dir /tmp/tessera_index_scale]
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>

#include "tessera/data/mds.h"

namespace {

int64_t rss_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.starts_with("VmRSS:")) return std::stoll(line.substr(6));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"MDS index scale"};
  int64_t shards = 1000000;
  std::string dir = "/tmp/tessera_index_scale";
  app.add_option("--shards", shards);
  app.add_option("--dir", dir);
  CLI11_PARSE(app, argc, argv);
  std::filesystem::create_directories(dir);
  {
    std::ofstream out(std::filesystem::path(dir) / "index.json");
    out << "{\"shards\": [";
    for (int64_t k = 0; k < shards; ++k) {
      out << (k ? ", " : "")
          << fmt::format(
                 "{{\"column_encodings\": [\"ndarray:int32\"], \"column_names\": [\"tokens\"], \"column_sizes\": "
                 "[null], \"compression\": \"zstd\", \"format\": \"mds\", \"hashes\": [\"xxh64\"], \"raw_data\": "
                 "{{\"basename\": \"shard.{:05d}.mds\", \"bytes\": 67092637, \"hashes\": {{\"xxh64\": "
                 "\"{:016x}\"}}}}, \"samples\": 4091, \"size_limit\": 67108864, \"version\": 2, \"zip_data\": "
                 "{{\"basename\": \"shard.{:05d}.mds.zstd\", \"bytes\": 20000000, \"hashes\": {{\"xxh64\": "
                 "\"{:016x}\"}}}}}}",
                 k, k * 2654435761u, k, k * 40503u);
    }
    out << "], \"version\": 2}";
  }
  const auto index_bytes = std::filesystem::file_size(std::filesystem::path(dir) / "index.json");
  const int64_t rss0 = rss_kib();
  const auto t0 = std::chrono::steady_clock::now();
  tessera::data::mds::MDSDataset ds(dir);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t rss1 = rss_kib();
  std::mt19937_64 rng(0);
  const auto t1 = std::chrono::steady_clock::now();
  int64_t check = 0;
  for (int i = 0; i < 1000000; ++i)
    check += ds.locate(static_cast<int64_t>(rng() % static_cast<uint64_t>(ds.size()))).second;
  const double locate_ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t1).count() / 1e6;
  std::cout << nlohmann::json(
                   {{"shards", shards},
                    {"samples", ds.size()},
                    {"index_json_mb", static_cast<double>(index_bytes) / 1e6},
                    {"load_seconds", load_s},
                    {"rss_growth_mb", static_cast<double>(rss1 - rss0) / 1024.0},
                    {"bytes_per_shard", static_cast<double>(rss1 - rss0) * 1024.0 / static_cast<double>(shards)},
                    {"locate_ns", locate_ns},
                    {"checksum", check}})
                   .dump()
            << std::endl;
  return 0;
}
