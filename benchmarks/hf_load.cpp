// Peak host memory and time of loading a Hugging Face folder (config.json + safetensors, sharded or not) into a
// Tessera model on one process: checkpoint::load_hf_model, which reads each stored tensor through a memory map, copies
// it into its parameter (converting the dtype) and drops its pages again.
//
//   bench_hf_load --folder DIR
//
// Prints one JSON object: seconds, the process's resident memory before loading and its peak (VmHWM) after, the
// model's bytes in memory, and the stored bytes (all tensors, and the largest one). benchmarks/hf_load_vs_hf.py runs
// it beside transformers' from_pretrained.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "tessera/checkpoint/hf.h"
#include "tessera/checkpoint/safetensors.h"
#include "tessera/util/error.h"

namespace {

// A field of /proc/self/status in bytes (VmRSS, VmHWM).
int64_t status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Peak memory of loading a Hugging Face folder"};
  std::string folder;
  app.add_option("--folder", folder)->required();
  CLI11_PARSE(app, argc, argv);
  try {
    int64_t stored = 0, largest = 0;
    for (const auto& entry : std::filesystem::directory_iterator(folder)) {
      if (entry.path().extension() != ".safetensors") continue;
      const tessera::checkpoint::SafetensorsFile file(entry.path().string());
      for (const auto& name : file.names()) {
        const auto& info = file.info(name);
        const auto bytes = static_cast<int64_t>(info.end - info.begin);
        stored += bytes;
        largest = std::max(largest, bytes);
      }
    }
    const int64_t before = status_bytes("VmRSS");
    const auto t0 = std::chrono::steady_clock::now();
    const auto model = tessera::checkpoint::load_hf_model(folder);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int64_t model_bytes = 0;
    for (const auto& p : model->parameters()) model_bytes += p.numel() * static_cast<int64_t>(p.element_size());
    const nlohmann::json out = {{"framework", "tessera"},         {"seconds", seconds},
                                {"rss_before", before},           {"peak_rss", status_bytes("VmHWM")},
                                {"model_bytes", model_bytes},     {"stored_bytes", stored},
                                {"largest_stored_bytes", largest}};
    std::cout << out.dump() << std::endl;
  } catch (const tessera::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return e.exit_code();
  }
  return 0;
}
