// The examples' demo dataset: 256 samples of 65 tokens < 97 with a learnable pattern, in the `train` and `val`
// splits that the text loader reads (`tokens`: ndarray:int32).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <filesystem>
#include <vector>

#include "tessera/data/mds.h"

namespace examples {

inline void write_demo_data(const std::filesystem::path& dir) {
  for (const char* split : {"train", "val"}) {
    std::filesystem::remove_all(dir / split);
    tessera::data::mds::WriterOptions options;
    options.out = (dir / split).string();
    options.columns = {{"tokens", "ndarray:int32"}};
    options.compression = "zstd";
    options.size_limit = uint64_t{1} << 20;
    tessera::data::mds::MDSWriter w(options);
    for (int i = 0; i < 256; ++i) {
      std::vector<int32_t> t(65);
      for (size_t j = 0; j < t.size(); ++j) t[j] = static_cast<int32_t>((i + 3 * j) % 97);
      w.write({{"tokens", at::tensor(t, at::kInt)}});
    }
    w.finish();
  }
}

}  // namespace examples
