// Throughput of Tessera's whole training step on one GPU: data loading from MDS, forward, backward, gradient
// clipping and the optimizer step, as `train` runs them, for the model of a recipe.
//
//   bench_gpu_train_step --recipe recipes/mpt-1b.yaml [--seq 2048] [--batch 4] [--steps 10] [--warmup 3]
//                        [--precision amp_bf16|amp_fp8|...] [--profile trace.json --profile-steps 2]
//                        [--device gpu|cpu] [--cuda-graphs] [overrides of the model, e.g. model.attn_config.alibi=true
//                        ...]
//
// Writes random tokens to a temporary MDS folder, trains `warmup + steps` batches with the recipe's model (its data,
// logging and checkpoint settings are not used), and prints one JSON object: tokens/s over the timed steps, FLOPs
// per token, parameters and the CUDA allocator's peak. benchmarks/gpu_train_vs_pytorch.py runs it beside PyTorch.
// With --profile, `profile-steps` more batches run under LibTorch's Kineto profiler (CPU ops and CUDA kernels, after
// the timed ones, so they do not slow them) and its Chrome trace is written there; benchmarks/gpu_profile.py splits
// it into GEMM, attention, loss, optimizer, ... time. --device cpu runs the same on the CPU (a smoke test of the
// benchmark itself; no allocator figures).
#include <c10/cuda/CUDACachingAllocator.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tessera/config/value.h"
#include "tessera/data/mds.h"
#include "tessera/trainer/trainer.h"
#include "tessera/util/error.h"

namespace {

namespace fs = std::filesystem;

// Times every batch end; the loss's item() waits for the GPU, so each time is a finished step.
class StepClock : public tessera::core::Callback {
 public:
  std::string name() const override { return "StepClock"; }
  void run_event(tessera::core::Event e, tessera::core::State& s, tessera::core::Logger& /*l*/) override {
    if (e != tessera::core::Event::kBatchEnd) return;
    (void)s.loss.item<double>();
    ends.push_back(std::chrono::steady_clock::now());
  }
  std::vector<std::chrono::steady_clock::time_point> ends;
};

// LibTorch's Kineto profiler over batches first..last (1-based), its trace saved to `path`.
class ProfileWindow : public tessera::core::Callback {
 public:
  ProfileWindow(int64_t first, int64_t last, std::string path, bool cuda)
      : first_(first), last_(last), path_(std::move(path)), cuda_(cuda) {}
  std::string name() const override { return "ProfileWindow"; }
  void run_event(tessera::core::Event e, tessera::core::State& s, tessera::core::Logger& /*l*/) override {
    namespace prof = torch::profiler::impl;
    if (e == tessera::core::Event::kBatchStart && s.timestamp.batch + 1 == first_) {
      const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
      std::set<prof::ActivityType> activities{prof::ActivityType::CPU};
      if (cuda_) activities.insert(prof::ActivityType::CUDA);
      torch::autograd::profiler::prepareProfiler(config, activities);
      torch::autograd::profiler::enableProfiler(config, activities);
    }
    if (e == tessera::core::Event::kBatchEnd && s.timestamp.batch == last_) {
      (void)s.loss.item<double>();  // the window's last kernels have run
      torch::autograd::profiler::disableProfiler()->save(path_);
    }
  }

 private:
  int64_t first_, last_;
  std::string path_;
  bool cuda_;
};

void write_tokens(const fs::path& dir, int64_t n, int64_t seq, int64_t vocab) {
  fs::remove_all(dir);
  tessera::data::mds::WriterOptions o;
  o.out = dir.string();
  o.columns = {{"tokens", "ndarray:int32"}};
  tessera::data::mds::MDSWriter w(o);
  at::manual_seed(0);
  for (int64_t i = 0; i < n; ++i) w.write({{"tokens", at::randint(0, vocab, {seq}, at::kInt)}});
  w.finish();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tessera's training step on one GPU"};
  std::string recipe = "recipes/mpt-125m.yaml", precision = "amp_bf16", device = "gpu", profile;
  std::vector<std::string> overrides;
  int64_t batch = 8, seq = 2048, steps = 10, warmup = 3, profile_steps = 2;
  app.add_option("--recipe", recipe);
  app.add_option("--batch", batch, "samples per step (one microbatch)");
  app.add_option("--seq", seq);
  app.add_option("--steps", steps, "timed steps");
  app.add_option("--warmup", warmup, "untimed steps first");
  app.add_option("--precision", precision)->check(CLI::IsMember({"fp32", "amp_bf16", "amp_fp16", "amp_fp8"}));
  app.add_option("--device", device)->check(CLI::IsMember({"gpu", "cpu"}));
  app.add_option("--profile", profile, "write a Kineto (Chrome) trace of --profile-steps more batches here");
  app.add_option("--profile-steps", profile_steps);
  bool cuda_graphs = false;
  app.add_flag("--cuda-graphs", cuda_graphs, "the step's microbatches as one captured CUDA graph (cuda_graphs: true)");
  app.add_option("overrides", overrides, "applied to the recipe, e.g. model.attn_config.alibi=true");
  CLI11_PARSE(app, argc, argv);
  using tessera::trainer::Trainer;
  const fs::path data = fs::temp_directory_path() / fmt::format("tessera_gpu_train_step_{}", getpid());
  try {
    // The recipe's model, resolved (interpolations filled in), in a recipe of this benchmark's own.
    const auto full = tessera::trainer::load_train_config(recipe, overrides);
    nlohmann::ordered_json model = full.resolved.to_json()["model"];
    if (model.contains("max_seq_len")) model["max_seq_len"] = seq;  // MPT's; the Llama family's positions are fixed
    model["init_device"] = "cpu";  // one process: build the whole model, then move it to the GPU
    const int64_t vocab = model.value("vocab_size", int64_t{50368});
    const int64_t profiled = profile.empty() ? 0 : profile_steps;
    const int64_t n = (steps + warmup + profiled) * batch;
    write_tokens(data / "train", n, seq, vocab);
    nlohmann::ordered_json r;
    r["max_seq_len"] = seq;
    r["model"] = model;
    r["tokenizer"] = {{"name", "unused"}};
    r["train_loader"] = {
        {"name", "text"},
        {"dataset", {{"local", data.string()}, {"split", "train"}, {"shuffle", false}, {"max_seq_len", seq}}},
        {"drop_last", true},
        {"num_workers", 1}};
    r["optimizer"] = {
        {"name", "decoupled_adamw"}, {"lr", 6e-4}, {"betas", {0.9, 0.95}}, {"eps", 1e-8}, {"weight_decay", 0.0}};
    r["scheduler"] = {{"name", "constant_with_warmup"}, {"t_warmup", "0ba"}};
    r["algorithms"] = {{"gradient_clipping", {{"clipping_type", "norm"}, {"clipping_threshold", 1.0}}}};
    r["max_duration"] = fmt::format("{}ba", steps + warmup + profiled);
    r["eval_interval"] = 0;
    r["global_train_batch_size"] = batch;
    r["device_train_microbatch_size"] = batch;
    r["device_eval_batch_size"] = batch;
    r["precision"] = precision;
    r["device"] = device;
    r["log_to_console"] = false;
    r["cuda_graphs"] = cuda_graphs;
    r["progress_bar"] = false;
    const fs::path recipe_out = data / "recipe.yaml";
    {
      std::ofstream out(recipe_out);
      out << r.dump(2);
    }
    const bool cuda = device == "gpu";
    auto clock = std::make_shared<StepClock>();
    std::vector<std::shared_ptr<tessera::core::Callback>> callbacks{clock};
    if (!profile.empty()) {
      callbacks.push_back(
          std::make_shared<ProfileWindow>(warmup + steps + 1, warmup + steps + profile_steps, profile, cuda));
    }
    Trainer t(tessera::trainer::load_train_config(recipe_out.string(), {}), {{}, callbacks});
    if (cuda) c10::cuda::CUDACachingAllocator::resetPeakStats(0);
    t.fit();
    if (static_cast<int64_t>(clock->ends.size()) != steps + warmup + profiled) {
      throw tessera::Error("bench",
                           fmt::format("ran {} batches, expected {}", clock->ends.size(), steps + warmup + profiled));
    }
    // The timed steps: from the end of the last warm-up step to the end of the last timed one.
    const double seconds = std::chrono::duration<double>(clock->ends[static_cast<size_t>(warmup + steps - 1)] -
                                                         clock->ends[static_cast<size_t>(warmup - 1)])
                               .count();
    const auto agg = static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE);
    const c10::CachingDeviceAllocator::DeviceStats stats =
        cuda ? c10::cuda::CUDACachingAllocator::getDeviceStats(0) : c10::CachingDeviceAllocator::DeviceStats{};
    nlohmann::ordered_json out;
    out["recipe"] = recipe;
    out["seq"] = seq;
    out["batch"] = batch;
    out["steps"] = steps;
    out["precision"] = precision;
    out["params"] = t.state().model->num_params();
    out["flops_per_token"] = t.state().model->flops_per_token(seq);
    out["tokens_per_sec"] = static_cast<double>(steps * batch * seq) / seconds;
    out["step_ms"] = seconds * 1e3 / static_cast<double>(steps);
    out["cuda_graph_replays"] = t.cuda_graph_replays();
    out["peak_allocated_gb"] = static_cast<double>(stats.allocated_bytes[agg].peak) / 1e9;
    out["peak_reserved_gb"] = static_cast<double>(stats.reserved_bytes[agg].peak) / 1e9;
    if (!profile.empty()) out["profile"] = profile;
    std::cout << out.dump() << std::endl;
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    fs::remove_all(data);
    return 1;
  }
  fs::remove_all(data);
  return 0;
}
