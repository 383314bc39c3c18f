// A tiny learnable token dataset for trainer-level tests.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <filesystem>
#include <vector>

#include "tessera/data/mds.h"

namespace tessera::testing {

// Writes `n` samples of 33 tokens < 64 to the MDS directory `dir` (replacing it), following a learnable pattern:
// token t+1 = (3 t + i % 5) % 64 within sample i, whose first token depends on i and `seed`.
inline void write_token_split(const std::filesystem::path& dir, int64_t n, int64_t seed) {
  std::filesystem::remove_all(dir);
  data::mds::WriterOptions o;
  o.out = dir.string();
  o.columns = {{"tokens", "ndarray:int32"}};
  data::mds::MDSWriter w(o);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int32_t> t(33);
    t[0] = static_cast<int32_t>((i * 7 + seed) % 64);
    for (size_t j = 1; j < t.size(); ++j) t[j] = (3 * t[j - 1] + static_cast<int32_t>(i % 5)) % 64;
    w.write({{"tokens", at::tensor(t, at::kInt)}});
  }
  w.finish();
}

}  // namespace tessera::testing
