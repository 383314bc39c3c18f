// A tiny learnable token dataset for trainer-level tests.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "tessera/config/value.h"
#include "tessera/core/callback.h"
#include "tessera/core/state.h"
#include "tessera/data/mds.h"
#include "tessera/trainer/train_config.h"

namespace tessera::testing {

// Writes `n` samples of `length` tokens < 64 to the MDS directory `dir` (replacing it), following a learnable
// pattern: token t+1 = (3 t + i % 5) % 64 within sample i, whose first token depends on i and `seed`.
inline void write_token_split(const std::filesystem::path& dir, int64_t n, int64_t seed, int64_t length = 33) {
  std::filesystem::remove_all(dir);
  data::mds::WriterOptions o;
  o.out = dir.string();
  o.columns = {{"tokens", "ndarray:int32"}};
  data::mds::MDSWriter w(o);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int32_t> t(static_cast<size_t>(length));
    t[0] = static_cast<int32_t>((i * 7 + seed) % 64);
    for (size_t j = 1; j < t.size(); ++j) t[j] = (3 * t[j - 1] + static_cast<int32_t>(i % 5)) % 64;
    w.write({{"tokens", at::tensor(t, at::kInt)}});
  }
  w.finish();
}

// A 2-layer MPT over the `train` / `val` splits of `data` (fp32, batch 8, 2 epochs, decoupled AdamW at 0.01).
// `extra` is top-level YAML added to it (eval_interval, microbatch and eval batch sizes, components); `overrides`
// are applied like command-line overrides.
inline trainer::TrainConfig tiny_train_config(const std::filesystem::path& data, const std::string& extra,
                                              const std::vector<std::string>& overrides = {}) {
  const std::string yaml = R"(
max_seq_len: 32
model: {name: mpt_causal_lm, d_model: 32, n_heads: 2, n_layers: 2, expansion_ratio: 2, max_seq_len: 32,
        vocab_size: 64, attn_config: {attn_impl: torch}}
tokenizer: {name: unused}
train_loader: {name: text, dataset: {local: )" +
                           data.string() + R"(, split: train, shuffle: true, max_seq_len: 32}, drop_last: true}
eval_loader: {name: text, dataset: {local: )" +
                           data.string() + R"(, split: val, shuffle: false, max_seq_len: 32}, drop_last: false}
optimizer: {name: decoupled_adamw, lr: 0.01, weight_decay: 0.0}
scheduler: {name: constant_with_warmup, t_warmup: 0ba}
max_duration: 2ep
global_train_batch_size: 8
precision: fp32
log_to_console: false
)" + extra;
  config::Value v = config::parse_yaml(yaml, config::Origin{"tiny.yaml", 1, ""});
  for (const std::string& o : overrides) config::apply_override(v, o);
  config::resolve_interpolations(v);
  return trainer::parse_train_config(std::move(v), "tiny.yaml");
}

// Stops training after `batch` without a final save, as a crash would.
class CrashAt : public core::Callback {
 public:
  explicit CrashAt(int64_t batch) : batch_(batch) {}
  std::string name() const override { return "CrashAt"; }
  void run_event(core::Event e, core::State& s, core::Logger& /*l*/) override {
    if (e == core::Event::kBatchEnd && s.timestamp.batch == batch_) s.stop_training();
  }

 private:
  int64_t batch_;
};

}  // namespace tessera::testing
