// Tokenizer encode throughput, single thread: MB/s and tokens/s over a document corpus.
//
//   bench_tokenizer_throughput --tokenizer tokenizer.json --input /usr/share/games/fortunes [--format fortunes]
//                              [--rounds 5]
//
// Each round encodes every document once (the first round starts with an empty word cache). Prints one JSON line with
// the first round's and the median round's figures. benchmarks/tokenizer_vs_hf.py runs it beside HF tokenizers.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <iostream>

#include "tessera/data/documents.h"
#include "tessera/data/tokenizer.h"
#include "tessera/util/error.h"

int main(int argc, char** argv) {
  CLI::App app{"tokenizer throughput"};
  std::string tokenizer, format = "fortunes";
  std::vector<std::string> inputs;
  int rounds = 5;
  app.add_option("--tokenizer", tokenizer)->required();
  app.add_option("--input", inputs)->required();
  app.add_option("--format", format);
  app.add_option("--rounds", rounds)->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    const auto tok = tessera::data::Tokenizer::from_file(tokenizer);
    const auto docs =
        tessera::data::read_documents({inputs.begin(), inputs.end()}, tessera::data::parse_document_format(format));
    size_t bytes = 0;
    for (const auto& d : docs) bytes += d.size();
    std::vector<double> seconds;
    int64_t tokens = 0;
    for (int r = 0; r < rounds; ++r) {
      tokens = 0;
      const auto t0 = std::chrono::steady_clock::now();
      for (const auto& d : docs) tokens += static_cast<int64_t>(tok.encode(d, false).size());
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    const double first = seconds[0];
    std::sort(seconds.begin(), seconds.end());
    const double median = seconds[seconds.size() / 2];
    std::cout << nlohmann::json{{"documents", docs.size()},
                                {"bytes", bytes},
                                {"tokens", tokens},
                                {"first_round_s", first},
                                {"median_round_s", median},
                                {"mb_per_s", static_cast<double>(bytes) / 1e6 / median},
                                {"tokens_per_s", static_cast<double>(tokens) / median}}
                     .dump()
              << "\n";
    return 0;
  } catch (const tessera::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return e.exit_code();
  }
}
