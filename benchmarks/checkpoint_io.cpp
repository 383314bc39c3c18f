// Checkpoint I/O of an mpt-125m training run (fp32 weights + AdamW state, one process) against the disk itself,
// measured in the same run and the same folder:
//   - raw sequential write (8 MiB writes + fsync) and cold read of a file of the checkpoint's size;
//   - save throughput (snapshot, write, checksum, publish; synchronous save) and cold load throughput
//     (checksum verification + reading every tensor), as fractions of the raw figures (target: >= 70%);
//   - async save: the blocking part (the copy to host memory) as a fraction of a training step (target: < 10%);
//   - restart: from constructing a Trainer with autoresume (which loads the checkpoint) to the end of the first new
//     step.
//
//   bench_checkpoint_io [--dir /tmp/tessera_ckpt_bench] [--seq-len 512] [--batch 2]
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <vector>

#include "tessera/checkpoint/checkpoint.h"
#include "tessera/config/reader.h"
#include "tessera/config/value.h"
#include "tessera/data/mds.h"
#include "tessera/trainer/checkpointing.h"
#include "tessera/trainer/trainer.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace tessera;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Drops a file's pages from the page cache (clean pages only: call after fsync), so the next read goes to disk.
void evict(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

std::pair<double, double> raw_disk(const fs::path& dir, uint64_t bytes) {
  const fs::path f = dir / "raw.bin";
  std::vector<char> buf(size_t{8} << 20, 'x');
  auto t = Clock::now();
  const int fd = ::open(f.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (uint64_t done = 0; done < bytes;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), bytes - done));
    if (::write(fd, buf.data(), n) != static_cast<ssize_t>(n)) throw std::runtime_error("raw write failed");
    done += n;
  }
  ::fsync(fd);
  ::close(fd);
  const double write_s = since(t);
  evict(f);
  t = Clock::now();
  const int rfd = ::open(f.c_str(), O_RDONLY);
  while (::read(rfd, buf.data(), buf.size()) > 0) {
  }
  ::close(rfd);
  const double read_s = since(t);
  fs::remove(f);
  return {static_cast<double>(bytes) / write_s / 1e9, static_cast<double>(bytes) / read_s / 1e9};
}

void write_data(const fs::path& dir, int64_t n, int64_t seq) {
  fs::remove_all(dir);
  data::mds::WriterOptions o;
  o.out = dir.string();
  o.columns = {{"tokens", "ndarray:int32"}};
  data::mds::MDSWriter w(o);
  for (int64_t i = 0; i < n; ++i) {
    w.write({{"tokens", at::randint(0, 50368, {seq + 1}, at::kInt)}});
  }
  w.finish();
}

trainer::TrainConfig bench_config(const fs::path& root, int64_t seq, int64_t batch, const std::vector<std::string>& o) {
  const std::string yaml = fmt::format(R"(
max_seq_len: {0}
run_name: bench
model: {{name: mpt_causal_lm, d_model: 768, n_heads: 12, n_layers: 12, expansion_ratio: 4, max_seq_len: {0},
        vocab_size: 50368, attn_config: {{attn_impl: torch}}}}
tokenizer: {{name: unused}}
train_loader: {{name: text, dataset: {{local: {1}, split: train, shuffle: true, max_seq_len: {0}}}, drop_last: true}}
optimizer: {{name: decoupled_adamw, lr: 0.0006, weight_decay: 0.0}}
scheduler: {{name: constant_with_warmup, t_warmup: 0ba}}
global_train_batch_size: {2}
device_train_microbatch_size: {2}
device_eval_batch_size: {2}
precision: amp_bf16
eval_interval: 0
log_to_console: false
save_folder: {3}
save_interval: 1ba
)",
                                       seq, (root / "data").string(), batch, (root / "ckpt").string());
  config::Value v = config::parse_yaml(yaml, config::Origin{"bench.yaml", 1, ""});
  for (const auto& s : o) config::apply_override(v, s);
  config::resolve_interpolations(v);
  return trainer::parse_train_config(std::move(v), "bench.yaml");
}

std::shared_ptr<trainer::CheckpointSaver> saver_of(trainer::Trainer& t) {
  for (const auto& c : t.state().callbacks) {
    if (auto s = std::dynamic_pointer_cast<trainer::CheckpointSaver>(c)) return s;
  }
  throw std::runtime_error("no CheckpointSaver");
}

// Times each BATCH_END (the end of a step) from a start point.
class StepClock : public trainer::Callback {
 public:
  std::string name() const override { return "StepClock"; }
  void run_event(trainer::Event e, trainer::State& s, trainer::Logger& /*l*/) override {
    if (e == trainer::Event::kBatchEnd) steps.push_back(s.timestamp.batch_wct);
    if (e == trainer::Event::kBatchEnd && !first_step_end) first_step_end = Clock::now();
  }
  std::vector<double> steps;
  std::optional<Clock::time_point> first_step_end;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Checkpoint save/load throughput against the raw disk; async-save blocking time; restart time"};
  std::string dir = (fs::temp_directory_path() / "tessera_ckpt_bench").string();
  int64_t seq = 512, batch = 2;
  app.add_option("--dir", dir, "Work folder (on the disk to measure)");
  app.add_option("--seq-len", seq, "Sequence length (default 512)");
  app.add_option("--batch", batch, "Global batch size (default 2)");
  CLI11_PARSE(app, argc, argv);
  const fs::path root(dir);
  fs::remove_all(root);
  fs::create_directories(root);
  write_data(root / "data" / "train", 16 * batch, seq);
  std::cout << fmt::format("mpt-125m, fp32 weights + AdamW state, seq {}, batch {}, amp_bf16, {}\n", seq, batch,
                           root.string());

  // 1. Synchronous saves: throughput of the whole save path.
  uint64_t bytes = 0;
  double save_s = 0;
  {
    trainer::Trainer t(bench_config(root, seq, batch, {"max_duration=2ba", "save_async=false"}));
    t.fit();
    const auto& r = saver_of(t)->last_save();
    bytes = r.bytes;
    save_s = r.seconds;
  }
  const auto [raw_w, raw_r] = raw_disk(root, bytes);
  const double save_gbs = static_cast<double>(bytes) / save_s / 1e9;

  // 2. Cold load: checksum verification, then every tensor read into memory.
  const std::string latest = checkpoint::find_latest_valid_checkpoint((root / "ckpt").string(), "latest").value();
  for (const auto& e : fs::directory_iterator(latest)) evict(e.path());
  auto t0 = Clock::now();
  uint64_t loaded = 0;
  {
    checkpoint::CheckpointReader r(latest);
    for (const std::string& name : r.tensor_names()) loaded += r.read_full(name).nbytes();
  }
  const double load_s = since(t0);
  const double load_gbs = static_cast<double>(bytes) / load_s / 1e9;

  // 3. Async saves every step: blocking time against the step time.
  fs::remove_all(root / "ckpt");
  double blocking = 0, step = 0;
  {
    auto clock = std::make_shared<StepClock>();
    trainer::Trainer t(bench_config(root, seq, batch, {"max_duration=4ba"}), {.algorithms = {}, .callbacks = {clock}});
    t.fit();
    blocking = saver_of(t)->last_save().blocking_seconds;
    // Steps 2..4 (the first includes warm-up); each includes waiting for the previous save's background write.
    for (size_t i = 1; i < clock->steps.size(); ++i) step += clock->steps[i];
    step /= static_cast<double>(clock->steps.size() - 1);
  }

  // 4. Restart: a new trainer resuming from the newest checkpoint, to the end of its first step.
  double construct_s = 0, to_first_step_s = 0;
  {
    auto clock = std::make_shared<StepClock>();
    t0 = Clock::now();
    trainer::Trainer t(bench_config(root, seq, batch, {"max_duration=5ba", "autoresume=true", "save_interval=100ba"}),
                       {.algorithms = {}, .callbacks = {clock}});
    construct_s = since(t0);
    t.fit();
    to_first_step_s = std::chrono::duration<double>(*clock->first_step_end - t0).count();
  }

  std::cout << fmt::format("checkpoint size (rank 0 file): {:.2f} GB (loaded {:.2f} GB of tensors)\n", bytes / 1e9,
                           loaded / 1e9);
  std::cout << fmt::format("| what | GB/s | vs raw disk |\n|---|---|---|\n");
  std::cout << fmt::format("| raw sequential write + fsync | {:.2f} | 1.00 |\n", raw_w);
  std::cout << fmt::format("| checkpoint save (sync, whole path) | {:.2f} | {:.2f} |\n", save_gbs, save_gbs / raw_w);
  std::cout << fmt::format("| raw cold read | {:.2f} | 1.00 |\n", raw_r);
  std::cout << fmt::format("| checkpoint load (cold, checksums + all tensors) | {:.2f} | {:.2f} |\n", load_gbs,
                           load_gbs / raw_r);
  std::cout << fmt::format("async save: blocking {:.3f} s per save, step {:.2f} s: {:.1f}% of a step\n", blocking, step,
                           100 * blocking / step);
  std::cout << fmt::format(
      "restart: trainer built and checkpoint loaded in {:.2f} s; first new step done after "
      "{:.2f} s\n",
      construct_s, to_first_step_s);
  fs::remove_all(root);
  return 0;
}
