// bench_dist_sharding: the sharding engine on N local ranks (Gloo, CPU). For each strategy and world size it runs a
// few training steps of an MPT (decoupled AdamW, fp32) and prints, per rank, the memory of parameters + gradients +
// optimizer state held between steps, the bytes each rank sent per step next to the ZeRO paper's theory (DDP 2Ψ,
// ZeRO-2 2Ψ, ZeRO-3 3Ψ, Ψ = parameter bytes, times (N-1)/N for ring collectives), and the step time with
// communication overlap on and off.
//
//   build/bin/bench_dist_sharding [--d-model 512 --n-layers 12 --ranks 1,2,4 --steps 3 --seq 64 --batch 2]
//
// The program launches itself once per configuration (dist::launch); each rank prints one JSON line that the parent
// collects into the table.
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "models/mpt/mpt.h"
#include "tessera/distributed/communicator.h"
#include "tessera/distributed/fsdp.h"
#include "tessera/distributed/launcher.h"
#include "tessera/optim/optimizer.h"
#include "tessera/util/allocator.h"

namespace fs = std::filesystem;
using namespace tessera;

namespace {

struct Args {
  int64_t d_model = 512, n_layers = 12, n_heads = 8, vocab = 50368, seq = 64, batch = 2, steps = 3;
  std::string ranks = "1,2,4";
  std::string strategies = "NO_SHARD,SHARD_GRAD_OP,FULL_SHARD";
  // worker side
  std::string strategy;
  bool overlap = true;
  std::string out;
};

dist::ShardingStrategy parse_strategy(const std::string& s) {
  if (s == "NO_SHARD") return dist::ShardingStrategy::kNoShard;
  if (s == "SHARD_GRAD_OP") return dist::ShardingStrategy::kShardGradOp;
  if (s == "HYBRID_SHARD") return dist::ShardingStrategy::kHybridShard;
  return dist::ShardingStrategy::kFullShard;
}

int worker(const Args& a) {
  const dist::Rendezvous rv = dist::rendezvous_from_env();
  auto comm = rv.world_size > 1 ? dist::Communicator::connect(rv, at::kCPU, std::chrono::minutes(10))
                                : dist::Communicator::single();
  models::MPTOptions o;
  o.d_model = a.d_model;
  o.n_heads = a.n_heads;
  o.n_layers = a.n_layers;
  o.expansion_ratio = 4;
  o.max_seq_len = a.seq;
  o.vocab_size = a.vocab;
  o.attn.alibi = true;
  o.attn.kv_n_heads = a.n_heads;
  o.init.init_div_is_residual = std::sqrt(2.0 * static_cast<double>(a.n_layers));
  o.learned_pos_emb = false;
  models::MPTForCausalLM model = models::build_mpt(o, 17);
  int64_t n_params = 0;
  for (const auto& p : model->parameters()) n_params += p.numel();
  dist::ParallelOptions po;
  po.sharding.strategy = parse_strategy(a.strategy);
  po.overlap = a.overlap;
  po.ranks_per_node = comm->size();
  auto parallel = dist::parallelize(*model, po, comm);
  optim::OptimizerOptions oo;
  oo.name = "decoupled_adamw";
  oo.lr = 1e-4;
  oo.betas = {0.9, 0.95};
  auto opt = optim::make_optimizer(oo, parallel->parameters());
  at::manual_seed(100 + rv.rank);
  const at::Tensor ids = at::randint(a.vocab, {a.batch, a.seq}, at::kLong);
  auto step = [&] {
    opt->zero_grad();
    parallel->prepare_backward(true);
    models::causal_lm_loss(model->forward(ids), ids).backward();
    parallel->finish_backward();
    opt->step(oo.lr);
  };
  step();  // warm-up (allocates gradients and optimizer state)
  comm->barrier();
  comm->reset_stats();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < a.steps; ++i) step();
  comm->barrier();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / a.steps;
  const dist::CommStats st = comm->stats();
  const dist::ShardMemory mem = parallel->memory();
  int64_t opt_bytes = 0;
  for (const auto& [name, t] : opt->state()) opt_bytes += static_cast<int64_t>(t.nbytes());
  nlohmann::json j = {{"rank", rv.rank},
                      {"world", rv.world_size},
                      {"params", n_params},
                      {"param_bytes", mem.param_bytes},
                      {"grad_bytes", mem.grad_bytes},
                      {"optimizer_bytes", opt_bytes},
                      {"sent_bytes_per_step", st.total_bytes() / static_cast<double>(a.steps)},
                      {"step_seconds", seconds}};
  std::ofstream(fmt::format("{}.rank{}", a.out, rv.rank)) << j.dump() << "\n";
  return 0;
}

nlohmann::json run_config(const Args& a, const std::string& strategy, int n, bool overlap, const fs::path& dir) {
  const std::string out = (dir / fmt::format("{}_{}_{}", strategy, n, overlap)).string();
  dist::LaunchOptions lo;
  lo.nproc_per_node = n;
  lo.master_port = 0;  // the launcher binds a free port
  lo.argv = {fs::read_symlink("/proc/self/exe").string(),
             "--worker",
             "--strategy",
             strategy,
             "--overlap",
             overlap ? "1" : "0",
             "--out",
             out,
             "--d-model",
             std::to_string(a.d_model),
             "--n-layers",
             std::to_string(a.n_layers),
             "--n-heads",
             std::to_string(a.n_heads),
             "--vocab",
             std::to_string(a.vocab),
             "--seq",
             std::to_string(a.seq),
             "--batch",
             std::to_string(a.batch),
             "--steps",
             std::to_string(a.steps)};
  if (dist::launch(lo) != 0) throw std::runtime_error("a benchmark rank failed");
  std::ifstream f(out + ".rank0");
  return nlohmann::json::parse(f);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  bool is_worker = false;
  CLI::App app{"Sharding engine: per-rank memory, bytes sent per step, step time with overlap on and off"};
  app.add_flag("--worker", is_worker)->group("");
  app.add_option("--strategy", a.strategy)->group("");
  app.add_option("--overlap", a.overlap)->group("");
  app.add_option("--out", a.out)->group("");
  app.add_option("--d-model", a.d_model, "Model width");
  app.add_option("--n-layers", a.n_layers, "Blocks");
  app.add_option("--n-heads", a.n_heads, "Attention heads");
  app.add_option("--vocab", a.vocab, "Vocabulary size");
  app.add_option("--seq", a.seq, "Sequence length");
  app.add_option("--batch", a.batch, "Samples per rank per step");
  app.add_option("--steps", a.steps, "Timed steps (after one warm-up step)");
  app.add_option("--ranks", a.ranks, "World sizes to measure, comma-separated");
  app.add_option("--strategies", a.strategies, "Strategies, comma-separated");
  std::string json_path;
  app.add_option("--json", json_path, "Also write the figures here as JSON (benchmarks/run)");
  CLI11_PARSE(app, argc, argv);
  util::configure_host_allocator();
  if (is_worker) return worker(a);

  const fs::path dir = fs::temp_directory_path() / fmt::format("bench_dist_{}", getpid());
  fs::create_directories(dir);
  auto split = [](const std::string& s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    for (std::string x; std::getline(ss, x, ',');) out.push_back(x);
    return out;
  };
  std::cout
      << "| strategy | N | params | param MB/rank | grad MB/rank | optimizer MB/rank | total MB/rank | sent MB/step"
         " | theory MB/step | step s (overlap) | step s (no overlap) "
         "|\n|---|---|---|---|---|---|---|---|---|---|---|\n";
  nlohmann::json rows = nlohmann::json::array();
  for (const std::string& strategy : split(a.strategies)) {
    for (const std::string& ns : split(a.ranks)) {
      const int n = std::stoi(ns);
      const nlohmann::json r = run_config(a, strategy, n, true, dir);
      std::string no_overlap = "";
      if (n == 2)
        no_overlap = fmt::format("{:.3f}", run_config(a, strategy, n, false, dir)["step_seconds"].get<double>());
      const double psi = 4.0 * r["params"].get<double>();
      const double factor = strategy == "NO_SHARD" ? 2.0 : strategy == "SHARD_GRAD_OP" ? 2.0 : 3.0;
      const double theory = factor * psi * (n - 1) / n;
      const double mb = 1e6;
      const double p = r["param_bytes"].get<double>(), g = r["grad_bytes"].get<double>(),
                   o = r["optimizer_bytes"].get<double>();
      std::cout << fmt::format(
          "| {} | {} | {:.1f} M | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.3f} | {} |\n", strategy, n,
          r["params"].get<double>() / 1e6, p / mb, g / mb, o / mb, (p + g + o) / mb,
          r["sent_bytes_per_step"].get<double>() / mb, theory / mb, r["step_seconds"].get<double>(), no_overlap);
      std::cout.flush();
      const double step = r["step_seconds"].get<double>();
      rows.push_back(
          {{"case", fmt::format("{} x{}", strategy, n)},
           {"strategy", strategy},
           {"ranks", n},
           {"unit", "samples/s"},
           {"tessera", static_cast<double>(n * a.batch) / step},
           {"peers", nlohmann::json::object()},
           {"step_seconds", step},
           {"step_seconds_no_overlap", no_overlap.empty() ? nlohmann::json() : nlohmann::json(std::stod(no_overlap))},
           {"params", r["params"]},
           {"bytes_per_rank", p + g + o},
           {"sent_bytes_per_step", r["sent_bytes_per_step"]},
           {"theory_bytes_per_step", theory}});
    }
  }
  fs::remove_all(dir);
  if (!json_path.empty()) {
    const nlohmann::json record = {
        {"benchmark", "dist_sharding"},
        {"title", "Sharding engine on one machine (CPU, Gloo): ranks x strategies"},
        {"model", {{"d_model", a.d_model}, {"n_layers", a.n_layers}, {"seq", a.seq}, {"batch_per_rank", a.batch}}},
        {"rows", rows}};
    std::ofstream(json_path) << record.dump(1) << "\n";
  }
  return 0;
}
