// Token-batch loader throughput over a local MDS dataset: samples/s and MB/s of token data for one full epoch.
//
//   bench_loader_throughput --data DIR [--batch 8] [--workers 2] [--seq 2048] [--shuffle]
//
// Prints one JSON line. benchmarks/loader_vs_streaming.py runs it beside mosaicml-streaming on the same shards.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <iostream>

#include "tessera/data/loader.h"
#include "tessera/util/allocator.h"
#include "tessera/util/error.h"

int main(int argc, char** argv) {
  CLI::App app{"loader throughput"};
  std::string data;
  int64_t batch = 8, workers = 2, seq = 2048;
  bool shuffle = false;
  app.add_option("--data", data)->required();
  app.add_option("--batch", batch);
  app.add_option("--workers", workers);
  app.add_option("--seq", seq);
  app.add_flag("--shuffle", shuffle);
  CLI11_PARSE(app, argc, argv);
  tessera::util::configure_host_allocator();
  try {
    tessera::data::StreamingOptions o;
    o.streams.emplace_back();
    o.streams.back().local = data;
    o.batch_size = batch;
    o.shuffle = shuffle;
    const auto t0 = std::chrono::steady_clock::now();
    tessera::data::StreamingDataset ds(o, {1, 1, workers});
    tessera::data::TokenLoaderOptions lo;
    lo.max_seq_len = seq;
    lo.drop_last = false;
    tessera::data::TokenBatchLoader loader(ds, workers, 0, 0, 0, 0, lo);
    int64_t samples = 0, tokens = 0;
    while (auto b = loader.next()) {
      samples += b->samples;
      tokens += b->input_ids.numel();
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cout << nlohmann::json({{"framework", "tessera"},
                                 {"samples", samples},
                                 {"seconds", dt},
                                 {"samples_per_s", samples / dt},
                                 {"mb_per_s", tokens * 4.0 / dt / 1e6}})
                     .dump()
              << std::endl;
  } catch (const tessera::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return e.exit_code();
  }
  return 0;
}
