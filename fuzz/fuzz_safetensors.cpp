// libFuzzer target: a safetensors file (the 8-byte header length, the JSON header, the data) as SafetensorsFile opens
// it from a checkpoint or a Hugging Face folder. The input is written to a per-process scratch file and opened; every
// tensor the header lists is then viewed and loaded (as stored and as float32). Anything but tessera::Error is a
// finding.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "tessera/checkpoint/safetensors.h"
#include "tessera/util/error.h"

namespace {

const std::string& scratch() {
  static const std::string path =
      (std::filesystem::temp_directory_path() / ("tessera_fuzz_st_" + std::to_string(getpid()) + ".safetensors"))
          .string();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  {
    std::ofstream out(scratch(), std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    tessera::checkpoint::SafetensorsFile file(scratch());
    for (const auto& name : file.names()) {
      const auto& info = file.info(name);
      const auto view = file.view(name);
      if (view.numel() > 0 && view.numel() < (1 << 16)) {
        (void)view.sum().item<double>();
        (void)file.load(name, at::kFloat);
      }
      (void)info;
    }
    (void)file.metadata();
  } catch (const tessera::Error&) {
  }
  return 0;
}
