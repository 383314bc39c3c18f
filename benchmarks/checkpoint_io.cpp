// Checkpoint I/O of an mpt-125m training run (fp32 weights + AdamW state, one process) against the disk itself,
// measured in the same run and the same folder:
//   - raw sequential write (8 MiB writes + fsync) and cold read of a file of the checkpoint's size;
//   - save throughput (snapshot, write, checksum, publish; synchronous save) and cold load throughput
//     (checksum verification + reading every tensor into existing memory), as fractions of the raw figures
//     (target: >= 70%); the best of --rounds rounds (default 4), each pairing a raw write with a save and a raw read
//     with a load, in alternating order (medians printed too);
//   - async save: the blocking part (the copy to host memory) as a fraction of a training step (target: < 10%);
//   - restart: from constructing a Trainer with autoresume (which loads the checkpoint) to the end of the first new
//     step.
//
//   bench_checkpoint_io [--dir /tmp/tessera_ckpt_bench] [--seq-len 512] [--batch 2]
//
// With --remote s3://bucket/prefix (benchmarks/checkpoint_s3_vs_boto3.py starts a loopback S3 server and measures
// boto3 writing the same bytes) the checkpoints go to object storage instead, and it measures: the synchronous save
// (snapshot, upload, metadata, `latest`; each of --rounds) and async saves every step (blocking time per
// save against the step time, and the upload's total time in the background).
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <vector>

#include "tessera/callbacks/checkpoint_saver.h"
#include "tessera/checkpoint/checkpoint.h"
#include "tessera/config/reader.h"
#include "tessera/config/value.h"
#include "tessera/data/mds.h"
#include "tessera/storage/storage.h"
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

// Raw sequential write of `bytes` (8 MiB writes + fsync) to a new file, in GB/s.
double raw_write(const fs::path& f, uint64_t bytes) {
  std::vector<char> buf(size_t{8} << 20, 'x');
  const auto t = Clock::now();
  const int fd = ::open(f.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (uint64_t done = 0; done < bytes;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), bytes - done));
    if (::write(fd, buf.data(), n) != static_cast<ssize_t>(n)) throw std::runtime_error("raw write failed");
    done += n;
  }
  ::fsync(fd);
  ::close(fd);
  return static_cast<double>(bytes) / since(t) / 1e9;
}

// Raw sequential cold read of a whole file (8 MiB reads), in GB/s.
double raw_read(const fs::path& f) {
  std::vector<char> buf(size_t{8} << 20);
  evict(f);
  const auto t = Clock::now();
  const int fd = ::open(f.c_str(), O_RDONLY);
  uint64_t bytes = 0;
  for (ssize_t n; (n = ::read(fd, buf.data(), buf.size())) > 0;) bytes += static_cast<uint64_t>(n);
  ::close(fd);
  return static_cast<double>(bytes) / since(t) / 1e9;
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

// mpt-125m's 12 layers, or fewer (--layers) for a smaller state: the quick suite's.
int64_t g_layers = 12;

trainer::TrainConfig bench_config(const fs::path& root, int64_t seq, int64_t batch, const std::vector<std::string>& o,
                                  const std::string& save_folder = "") {
  const std::string yaml = fmt::format(R"(
max_seq_len: {0}
run_name: bench
model: {{name: mpt_causal_lm, d_model: 768, n_heads: 12, n_layers: {4}, expansion_ratio: 4, max_seq_len: {0},
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
                                       seq, (root / "data").string(), batch,
                                       save_folder.empty() ? (root / "ckpt").string() : save_folder, g_layers);
  config::Value v = config::parse_yaml(yaml, config::Origin{"bench.yaml", 1, ""});
  for (const auto& s : o) config::apply_override(v, s);
  config::resolve_interpolations(v);
  return trainer::parse_train_config(std::move(v), "bench.yaml");
}

std::shared_ptr<callbacks::CheckpointSaver> saver_of(trainer::Trainer& t) {
  for (const auto& c : t.state().callbacks) {
    if (auto s = std::dynamic_pointer_cast<callbacks::CheckpointSaver>(c)) return s;
  }
  throw std::runtime_error("no CheckpointSaver");
}

// Times each BATCH_END (the end of a step) from a start point.
class StepClock : public core::Callback {
 public:
  std::string name() const override { return "StepClock"; }
  void run_event(core::Event e, core::State& s, core::Logger& /*l*/) override {
    if (e == core::Event::kBatchEnd) steps.push_back(s.timestamp.batch_wct);
    if (e == core::Event::kBatchEnd && !first_step_end) first_step_end = Clock::now();
  }
  std::vector<double> steps;
  std::optional<Clock::time_point> first_step_end;
};

// --remote: saves to object storage; prints and writes the figures; returns the exit code.
int remote_saves(const fs::path& root, const std::string& folder, int64_t seq, int64_t batch, int rounds,
                 int async_steps, const std::string& json_path) {
  std::vector<double> sync_s;
  uint64_t bytes = 0;
  if (rounds > 0 || async_steps < 2) {
    // One step; the end of training saves once (untimed), then the timed rounds.
    trainer::Trainer t(
        bench_config(root, seq, batch, {"max_duration=1ba", "save_async=false", "save_overwrite=true"}, folder));
    t.fit();
    const auto saver = saver_of(t);
    core::Logger logger(t.state());
    for (int r = 0; r < rounds; ++r) {
      // The same name again: the previous save's objects are removed first (untimed, as boto3's rounds delete theirs),
      // so each save writes new objects, as a run's saves under new names do, rather than replacing old ones (which
      // costs the loopback server more).
      for (const storage::ObjectInfo& o : storage::list(folder + "/")) storage::remove(o.uri);
      saver->save(t.state(), logger);
      sync_s.push_back(saver->last_save().seconds);
    }
    bytes = saver->last_save().bytes;
  }
  // Async saves every step: what a step waits for, and the uploads' time in the background.
  double blocking = 0, step = 0, background = 0;
  if (async_steps >= 2) {
    auto clock = std::make_shared<StepClock>();
    trainer::Trainer t(bench_config(root, seq, batch,
                                    {fmt::format("max_duration={}ba", async_steps), "save_overwrite=true",
                                     "save_num_checkpoints_to_keep=1"},
                                    folder),
                       {.algorithms = {}, .callbacks = {clock}});
    t.fit();
    bytes = saver_of(t)->last_save().bytes;
    blocking = saver_of(t)->last_save().blocking_seconds;
    background = saver_of(t)->last_save().seconds;
    for (size_t i = 1; i < clock->steps.size(); ++i) step += clock->steps[i];
    step /= static_cast<double>(clock->steps.size() - 1);
  }
  std::cout << fmt::format("checkpoint (rank 0 file) {:.1f} MB to {}\n", bytes / 1e6, folder);
  if (!sync_s.empty()) {
    std::vector<double> sorted = sync_s;
    std::sort(sorted.begin(), sorted.end());
    std::cout << fmt::format("sync save: best {:.2f} s ({:.0f} MB/s), median {:.2f} s over {} rounds\n", sorted.front(),
                             bytes / 1e6 / sorted.front(), sorted[sorted.size() / 2], rounds);
  }
  if (async_steps >= 2) {
    std::cout << fmt::format(
        "async save: blocking {:.3f} s per save, step {:.2f} s ({:.1f}% of a step); upload in the "
        "background {:.2f} s\n",
        blocking, step, 100 * blocking / step, background);
  }
  if (!json_path.empty()) {
    nlohmann::json out{{"bytes", bytes}, {"sync_seconds", sync_s}};
    if (async_steps >= 2) {
      out["async_blocking_seconds"] = blocking;
      out["async_background_seconds"] = background;
      out["step_seconds"] = step;
    }
    std::ofstream(json_path) << out.dump(1) << "\n";
  }
  fs::remove_all(root);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Checkpoint save/load throughput against the raw disk; async-save blocking time; restart time"};
  std::string dir = (fs::temp_directory_path() / "tessera_ckpt_bench").string();
  int64_t seq = 512, batch = 2;
  app.add_option("--dir", dir, "Work folder (on the disk to measure)");
  app.add_option("--seq-len", seq, "Sequence length (default 512)");
  app.add_option("--batch", batch, "Global batch size (default 2)");
  app.add_option("--layers", g_layers, "Transformer layers (default mpt-125m's 12; fewer: a smaller state)")
      ->check(CLI::PositiveNumber);
  std::string json_path, remote;
  int rounds = 4, async_steps = 4;
  app.add_option("--json", json_path, "Also write the figures here as JSON (benchmarks/run)");
  app.add_option("--remote", remote, "Save to this object-storage prefix instead (s3://bucket/prefix)");
  app.add_option("--rounds", rounds,
                 "Rounds of raw write, save, raw read and load (with --remote: synchronous saves to time); default 4");
  app.add_option("--async-steps", async_steps,
                 "Steps of the --remote run with an async save after each (default 4; under 2: not run)");
  CLI11_PARSE(app, argc, argv);
  if (rounds < (remote.empty() ? 1 : 0)) {
    std::cerr << "bench_checkpoint_io: --rounds must be at least " << (remote.empty() ? 1 : 0) << "\n";
    return 2;
  }
  const fs::path root(dir);
  fs::remove_all(root);
  fs::create_directories(root);
  write_data(root / "data" / "train", 16 * batch, seq);
  std::cout << fmt::format("mpt-125m{}, fp32 weights + AdamW state, seq {}, batch {}, amp_bf16, {}\n",
                           g_layers == 12 ? "" : fmt::format(" with {} layers", g_layers), seq, batch, root.string());
  if (!remote.empty()) return remote_saves(root, remote, seq, batch, rounds, async_steps, json_path);

  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return (v[(v.size() - 1) / 2] + v[v.size() / 2]) / 2;
  };

  // --rounds rounds, each timing a raw write and a synchronous save of a trained state (the whole save path), then a
  // raw cold read and a cold load as load_checkpoint does it (checksums verified while reading, every tensor copied
  // into memory that already exists, like a model's parameters and optimizer state), in alternating order. This
  // machine's virtual disk varies from second to second and runs an operation up to 5x slower after some others (a raw
  // write right after a save: 0.3-1 GB/s, the same write after a read: 2 GB/s). Interference only slows an operation
  // down, so the ratios compare the best of the rounds of each (as timeit does); the medians are printed too.
  std::vector<double> raw_w_runs, raw_r_runs, save_gbs_runs, load_gbs_runs;
  uint64_t bytes = 0, loaded = 0;
  {
    trainer::Trainer t(bench_config(root, seq, batch, {"max_duration=1ba", "save_async=false"}));
    t.fit();
    const auto saver = saver_of(t);
    bytes = saver->last_save().bytes;
    core::Logger logger(t.state());
    std::vector<at::Tensor> dst;
    const fs::path raw = root / "raw.bin";
    for (int round = 0; round < rounds; ++round) {
      const bool raw_first = round % 2 == 0;
      auto save = [&] {
        fs::remove_all(root / "ckpt");
        saver->save(t.state(), logger);
        save_gbs_runs.push_back(static_cast<double>(saver->last_save().bytes) / saver->last_save().seconds / 1e9);
      };
      auto load = [&] {
        const std::string latest = checkpoint::find_latest_valid_checkpoint((root / "ckpt").string(), "latest").value();
        checkpoint::CheckpointReader r(latest);
        const std::vector<std::string> names = r.tensor_names();
        if (dst.empty()) {
          for (const std::string& n : names) dst.push_back(at::zeros(r.shape(n), r.dtype(n)));
        }
        for (const auto& e : fs::directory_iterator(latest)) evict(e.path());
        const auto t0 = Clock::now();
        loaded = 0;
        for (size_t i = 0; i < names.size(); ++i) {
          r.read(names[i], 0, dst[i]);
          loaded += dst[i].nbytes();
        }
        load_gbs_runs.push_back(static_cast<double>(bytes) / since(t0) / 1e9);
      };
      if (raw_first) {
        raw_w_runs.push_back(raw_write(raw, bytes));
        save();
      } else {
        save();
        raw_w_runs.push_back(raw_write(raw, bytes));
      }
      // The first read of a file just written runs at about half speed on this disk; a restart reads a checkpoint
      // written long before. One untimed cold read of each file first.
      raw_read(raw);
      for (const auto& e :
           fs::directory_iterator(checkpoint::checkpoint_candidates((root / "ckpt").string(), "latest").front())) {
        raw_read(e.path());
      }
      if (raw_first) {
        raw_r_runs.push_back(raw_read(raw));
        load();
      } else {
        load();
        raw_r_runs.push_back(raw_read(raw));
      }
      fs::remove(raw);
    }
  }
  const double raw_w = median(raw_w_runs), raw_r = median(raw_r_runs);
  const double save_gbs = median(save_gbs_runs), load_gbs = median(load_gbs_runs);
  auto best = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  auto runs = [](const std::vector<double>& v) { return fmt::format("{:.2f}", fmt::join(v, " / ")); };

  // 3. Async saves every step: blocking time against the step time.
  fs::remove_all(root / "ckpt");
  double blocking = 0, step = 0;
  {
    auto clock = std::make_shared<StepClock>();
    trainer::Trainer t(bench_config(root, seq, batch, {"max_duration=4ba"}), {.algorithms = {}, .callbacks = {clock}});
    t.fit();
    bytes = saver_of(t)->last_save().bytes;
    blocking = saver_of(t)->last_save().blocking_seconds;
    // Steps 2..4 (the first includes warm-up); each includes waiting for the previous save's background write.
    for (size_t i = 1; i < clock->steps.size(); ++i) step += clock->steps[i];
    step /= static_cast<double>(clock->steps.size() - 1);
  }

  // 4. Restart: a new trainer resuming from the newest checkpoint, to the end of its first step.
  double construct_s = 0, to_first_step_s = 0;
  {
    auto clock = std::make_shared<StepClock>();
    const auto t0 = Clock::now();
    trainer::Trainer t(bench_config(root, seq, batch, {"max_duration=5ba", "autoresume=true", "save_interval=100ba"}),
                       {.algorithms = {}, .callbacks = {clock}});
    construct_s = since(t0);
    t.fit();
    to_first_step_s = std::chrono::duration<double>(*clock->first_step_end - t0).count();
  }

  std::cout << fmt::format("checkpoint size (rank 0 file): {:.2f} GB (loaded {:.2f} GB of tensors)\n", bytes / 1e9,
                           loaded / 1e9);
  std::cout << fmt::format(
      "| what | GB/s, best of {} | median | rounds | vs raw disk (best / best) |\n|---|---|---|---|---|\n", rounds);
  std::cout << fmt::format("| raw sequential write + fsync | {:.2f} | {:.2f} | {} | 1.00 |\n", best(raw_w_runs), raw_w,
                           runs(raw_w_runs));
  std::cout << fmt::format("| checkpoint save (sync, whole path) | {:.2f} | {:.2f} | {} | {:.2f} |\n",
                           best(save_gbs_runs), save_gbs, runs(save_gbs_runs), best(save_gbs_runs) / best(raw_w_runs));
  std::cout << fmt::format("| raw cold read | {:.2f} | {:.2f} | {} | 1.00 |\n", best(raw_r_runs), raw_r,
                           runs(raw_r_runs));
  std::cout << fmt::format("| checkpoint load (cold, checksums + all tensors) | {:.2f} | {:.2f} | {} | {:.2f} |\n",
                           best(load_gbs_runs), load_gbs, runs(load_gbs_runs), best(load_gbs_runs) / best(raw_r_runs));
  std::cout << fmt::format("async save: blocking {:.3f} s per save, step {:.2f} s: {:.1f}% of a step\n", blocking, step,
                           100 * blocking / step);
  std::cout << fmt::format(
      "restart: trainer built and checkpoint loaded in {:.2f} s; first new step done after "
      "{:.2f} s\n",
      construct_s, to_first_step_s);
  fs::remove_all(root);
  if (!json_path.empty()) {
    const nlohmann::json rows = nlohmann::json::array({{{"case", "save (sync, whole path)"},
                                                        {"unit", "GB/s"},
                                                        {"tessera", best(save_gbs_runs)},
                                                        {"peers", {{"raw sequential write + fsync", best(raw_w_runs)}}},
                                                        {"median", save_gbs},
                                                        {"peer_median", raw_w}},
                                                       {{"case", "load (cold, checksums + all tensors)"},
                                                        {"unit", "GB/s"},
                                                        {"tessera", best(load_gbs_runs)},
                                                        {"peers", {{"raw cold read", best(raw_r_runs)}}},
                                                        {"median", load_gbs},
                                                        {"peer_median", raw_r}}});
    const nlohmann::json record = {{"benchmark", "checkpoint_io"},
                                   {"title", "Checkpoint I/O (mpt-125m, fp32 + AdamW): Tessera vs the raw disk"},
                                   {"checkpoint_bytes", bytes},
                                   {"async_blocking_seconds", blocking},
                                   {"step_seconds", step},
                                   {"restart_construct_seconds", construct_s},
                                   {"restart_first_step_seconds", to_first_step_s},
                                   {"rows", rows}};
    std::ofstream(json_path) << record.dump(1) << "\n";
  }
  return 0;
}
