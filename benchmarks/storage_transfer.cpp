// Object-storage transfers through Tessera's storage layer, for benchmarks/storage_vs_boto3.py and storage_vs_gcs.py
// (which measure the store's own Python client, and Streaming's downloader, against the same server in the same run):
//   download: every object under a prefix, one after another, each in parallel byte ranges;
//   upload:   every file of a folder under a prefix, each as a parallel multipart upload (upload_tree).
// Prints one JSON line: {"bytes", "seconds", "mb_per_s", "requests" (S3 only), "objects"}.
//
//   bench_storage_transfer download --from s3://bucket/prefix --to DIR
//   bench_storage_transfer upload --from DIR --to s3://bucket/prefix
#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "tessera/storage/s3.h"
#include "tessera/storage/storage.h"
#include "tessera/util/tool_main.h"

int main(int argc, char** argv) {
  return tessera::util::tool_main([&] {
    namespace fs = std::filesystem;
    namespace storage = tessera::storage;
    CLI::App app{"Object-storage transfer throughput"};
    std::string mode, from, to;
    app.add_option("mode", mode, "download | upload")->required()->check(CLI::IsMember({"download", "upload"}));
    app.add_option("--from", from, "Source prefix (download) or folder (upload)")->required();
    app.add_option("--to", to, "Destination folder (download) or prefix (upload)")->required();
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      return app.exit(e);
    }
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t bytes = 0, objects = 0;
    if (mode == "download") {
      const storage::Uri base = storage::parse_uri(from);
      for (const auto& o : storage::list(from)) {
        const std::string rel = storage::parse_uri(o.uri).key.substr(base.key.size());
        storage::download(o.uri, (fs::path(to) / rel).string());
        bytes += o.size;
        ++objects;
      }
    } else {  // (upload_tree: one upload per file; on the Hugging Face Hub, one commit for them all)
      storage::upload_tree(from, to);
      for (const auto& e : fs::directory_iterator(from)) {
        bytes += e.file_size();
        ++objects;
      }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cout << nlohmann::json{{"bytes", bytes},
                                {"seconds", seconds},
                                {"mb_per_s", static_cast<double>(bytes) / 1e6 / seconds},
                                {"requests",
                                 storage::parse_uri(mode == "download" ? from : to).scheme == storage::Uri::Scheme::kS3
                                     ? nlohmann::json(storage::S3Client::shared().requests_sent())
                                     : nlohmann::json()},
                                {"objects", objects}}
                     .dump()
              << "\n";
    return 0;
  });
}
