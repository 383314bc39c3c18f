// Research code bringing its own model and schedule: a small transformer that is not MPT (parallel attention + MLP
// residual blocks, GPT-J style, with a weight-tied head), written in plain LibTorch against the model protocol
// (models::CausalLM) and registered as `parallel_block_lm`, plus a `halving` learning-rate schedule registered from
// code. examples/custom_model.yaml names both; the Trainer trains them like any built-in component: sharded over 2
// ranks with FULL_SHARD, checkpointed, killed and resumed. Built with the project and run by the tests
// (ctest -R example_custom_model).
//
//   build/bin/custom_model            the check: writes demo data, then runs the recipe on 2 ranks twice, once
//                                     uninterrupted and once with rank 1 killed by SIGKILL after batch 5 and the
//                                     supervisor restarting the job (autoresume); exits 0 when the final weights of
//                                     the two runs are bitwise equal and the schedule was the halving one
//   build/bin/custom_model rank DATA RUN_DIR [KILL_AFTER]
//                                     one rank of such a run (what the launcher spawns)
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "demo_data.h"
#include "tessera/checkpoint/checkpoint.h"
#include "tessera/dist/launcher.h"
#include "tessera/models/causal_lm.h"
#include "tessera/optim/scheduler.h"
#include "tessera/trainer/trainer.h"
#include "tessera/util/logging.h"

namespace fs = std::filesystem;
using namespace tessera;

// ---- the model ----------------------------------------------------------------------------------------------------

struct ParallelBlockLMOptions {
  int64_t d_model = 64;
  int64_t n_heads = 4;
  int64_t n_layers = 2;
  int64_t vocab_size = 128;
  int64_t max_seq_len = 64;
};

// x + proj(attention(ln(x))) + fc_out(gelu(fc_in(ln(x)))): attention and MLP read the same normalised input.
class ParallelBlockImpl : public torch::nn::Module {
 public:
  explicit ParallelBlockImpl(const ParallelBlockLMOptions& o) : heads_(o.n_heads) {
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model})));
    qkv = register_module("qkv", torch::nn::Linear(o.d_model, 3 * o.d_model));
    proj = register_module("proj", torch::nn::Linear(o.d_model, o.d_model));
    fc_in = register_module("fc_in", torch::nn::Linear(o.d_model, 4 * o.d_model));
    fc_out = register_module("fc_out", torch::nn::Linear(4 * o.d_model, o.d_model));
  }
  // x: (B, T, C) -> (B, T, C)
  at::Tensor forward(const at::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
    const at::Tensor h = ln(x);
    // (B, T, 3C) -> 3 x (B, H, T, C / H)
    auto parts = qkv(h).view({b, t, 3, heads_, c / heads_}).permute({2, 0, 3, 1, 4}).unbind(0);
    const at::Tensor y = at::scaled_dot_product_attention(parts[0], parts[1], parts[2], {}, 0.0, /*is_causal=*/true)
                             .transpose(1, 2)
                             .reshape({b, t, c});
    return x + proj(y) + fc_out(at::gelu(fc_in(h)));
  }

  torch::nn::LayerNorm ln{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc_in{nullptr}, fc_out{nullptr};

 private:
  int64_t heads_;
};
TORCH_MODULE(ParallelBlock);

class ParallelBlockLM : public models::CausalLM {
 public:
  ParallelBlockLM(const ParallelBlockLMOptions& o, const std::string& device) : o_(o) {
    wte = register_module("wte", torch::nn::Embedding(o.vocab_size, o.d_model));
    wpe = register_module("wpe", torch::nn::Embedding(o.max_seq_len, o.d_model));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < o.n_layers; ++i) blocks->push_back(ParallelBlock(o));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model})));
    // torch::nn modules allocate on the CPU; `meta` (shapes only) is not worth it for a model this small, so it is
    // built on the CPU as well, and the sharding engine shards it from there.
    if (device != "meta" && device != "cpu") to(at::Device(device));
  }

  // ids: (B, T) -> logits (B, T, V). Units: 0 = embeddings, final norm and the tied head; 1..L = the blocks.
  at::Tensor forward(const at::Tensor& ids, const models::ForwardOptions& fo = {}) override {
    if (fo.cache || fo.attention_mask || fo.sequence_id) {
      throw Error("parallel_block_lm", "padding masks, packed sequences and KV caches are not implemented");
    }
    const int64_t t = ids.size(1);
    at::Tensor x = models::run_unit(
        runner_, 0, [this, t](const at::Tensor& in) { return wte(in) + wpe(at::arange(t, in.options())); }, ids);
    for (size_t i = 0; i < blocks->size(); ++i) {
      auto block = blocks[i]->as<ParallelBlockImpl>();
      x = models::run_unit(
          runner_, static_cast<int64_t>(i) + 1, [block](const at::Tensor& h) { return block->forward(h); }, x);
    }
    return models::run_unit(
        runner_, 0, [this](const at::Tensor& h) { return at::linear(ln_f(h), wte->weight); }, x);
  }

  int64_t num_units() const override { return o_.n_layers + 1; }
  int64_t unit_of_parameter(const std::string& name) const override {
    if (name.rfind("blocks.", 0) != 0) return 0;
    return std::stoll(name.substr(7, name.find('.', 7) - 7)) + 1;
  }
  void set_unit_runner(std::shared_ptr<models::UnitRunner> runner) override { runner_ = std::move(runner); }

  // N(0, 0.02) weights, zero biases, unit norms; each module from its own generator (seed and module name), so that
  // initialising one unit at a time gives the values of a whole-model init.
  void init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select = nullptr) override {
    at::NoGradGuard no_grad;
    for (const auto& item : named_modules()) {
      if (select && !select(item.key())) continue;
      const uint64_t module_seed = seed ^ std::hash<std::string>{}(item.key());
      at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(module_seed);
      for (auto& p : item.value()->named_parameters(/*recurse=*/false)) {
        at::Tensor w = p.value();
        if (item.value()->as<torch::nn::LayerNormImpl>()) {
          p.key() == "weight" ? w.fill_(1.0) : w.zero_();
        } else if (p.key() == "bias") {
          w.zero_();
        } else {
          w.copy_(at::empty(w.sizes(), at::kFloat).normal_(0.0, 0.02, gen));
        }
      }
    }
  }
  std::shared_ptr<models::CausalLM> rebuild(const std::string& device, std::optional<uint64_t> seed) const override {
    auto m = std::make_shared<ParallelBlockLM>(o_, device);
    if (seed) m->init_weights(*seed);
    return m;
  }

  double flops_per_token(int64_t seq_len) const override {
    return 6.0 * static_cast<double>(num_params()) +
           12.0 * static_cast<double>(o_.n_layers * o_.d_model) * static_cast<double>(seq_len);
  }
  int64_t vocab_size() const override { return o_.vocab_size; }
  int64_t max_seq_len() const override { return o_.max_seq_len; }
  std::string family() const override { return "parallel_block_lm"; }

  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};

 private:
  ParallelBlockLMOptions o_;
  std::shared_ptr<models::UnitRunner> runner_;
};

// ---- the schedule: the rate halves every `every` batches -----------------------------------------------------------

class Halving : public optim::Scheduler {
 public:
  explicit Halving(int64_t every) : every_(every) {}
  double multiplier(const optim::ScheduleClock& c) const override {
    const int64_t halvings = c.now.batch / every_;  // whole periods elapsed
    return std::pow(0.5, static_cast<double>(halvings));
  }

 private:
  int64_t every_;
};

void register_components() {
  models::model_registry().add(
      "parallel_block_lm",
      [](config::Section& s) {
        ParallelBlockLMOptions o;
        o.d_model = s.get_int("d_model", o.d_model);
        o.n_heads = s.get_int("n_heads", o.n_heads);
        s.check(o.d_model % o.n_heads == 0, "n_heads", "must divide d_model");
        o.n_layers = s.get_int("n_layers", o.n_layers);
        o.vocab_size = s.get_int("vocab_size", o.vocab_size);
        o.max_seq_len = s.get_int("max_seq_len", o.max_seq_len);
        const std::string init_device = s.get_choice("init_device", "cpu", {"cpu"});
        s.finish();
        return models::ModelOptions{"parallel_block_lm", o, o.max_seq_len, init_device, {}};
      },
      [](const models::ModelOptions& m, const std::string& device, uint64_t seed) -> std::shared_ptr<models::CausalLM> {
        auto model = std::make_shared<ParallelBlockLM>(std::any_cast<const ParallelBlockLMOptions&>(m.options), device);
        model->init_weights(seed);
        return model;
      });
  optim::scheduler_registry().add(
      "halving",
      [](config::Section& s) {
        optim::SchedulerOptions o;
        o.name = "halving";
        o.extra = s.get_int("every", 4);
        s.check(std::any_cast<int64_t>(o.extra) > 0, "every", "must be a positive number of batches");
        s.finish();
        return o;
      },
      [](const optim::SchedulerOptions& o) -> std::shared_ptr<const optim::Scheduler> {
        return std::make_shared<Halving>(std::any_cast<int64_t>(o.extra));
      });
}

// ---- one rank, and the check -----------------------------------------------------------------------------------

// On the job's first start, rank 1 kills itself (SIGKILL: no cleanup) after batch `after`; on a restart, rank 0
// writes the batch training resumed from to `resumed_at`.
class KillAfter : public core::Callback {
 public:
  KillAfter(int64_t after, fs::path resumed_at) : after_(after), resumed_at_(std::move(resumed_at)) {}
  std::string name() const override { return "KillAfter"; }
  void run_event(core::Event e, core::State& s, core::Logger&) override {
    const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
    const bool first = restart == nullptr || std::string(restart) == "0";
    if (e == core::Event::kBatchCheckpoint && s.timestamp.batch == after_ && s.rank == 1 && first) {
      std::cerr << fmt::format("rank 1: killing myself after batch {}\n", after_);
      raise(SIGKILL);
    }
    if (e == core::Event::kFitStart && s.rank == 0 && !first) std::ofstream(resumed_at_) << s.timestamp.batch;
  }

 private:
  int64_t after_;
  fs::path resumed_at_;
};

int run_rank(const std::string& data, const std::string& run_dir, int64_t kill_after) {
  register_components();
  trainer::TrainConfig cfg =
      trainer::load_train_config(TESSERA_SOURCE_DIR "/examples/custom_model.yaml",
                                 {"variables.data_local=" + data, "save_folder=" + run_dir + "/checkpoints",
                                  "loggers.jsonl.filename=" + run_dir + "/metrics.jsonl"});
  trainer::TrainerParts parts;
  if (kill_after > 0) parts.callbacks.push_back(std::make_shared<KillAfter>(kill_after, run_dir + "/resumed_at"));
  trainer::Trainer t(cfg, std::move(parts));
  t.fit();
  return 0;
}

int launch_run(const fs::path& data, const fs::path& run_dir, int64_t kill_after) {
  fs::remove_all(run_dir);
  dist::LaunchOptions lo;
  lo.nproc_per_node = 2;
  lo.master_port = 0;  // the launcher binds a free port and hands it to rank 0
  lo.max_restarts = kill_after > 0 ? 1 : 0;
  lo.argv = {"/proc/self/exe", "rank", data.string(), run_dir.string(), std::to_string(kill_after)};
  return dist::launch(lo);
}

// The final checkpoint's model tensors, by name.
std::map<std::string, at::Tensor> final_weights(const fs::path& run_dir) {
  checkpoint::CheckpointReader reader(fs::canonical(run_dir / "checkpoints" / "latest").string());
  std::map<std::string, at::Tensor> out;
  for (const std::string& name : reader.tensor_names("model/")) out[name] = reader.read_full(name);
  return out;
}

int check() {
  const fs::path root = fs::temp_directory_path() / fmt::format("tessera_custom_model_{}", getpid());
  examples::write_demo_data(root / "data");
  if (launch_run(root / "data", root / "whole", 0) != 0) return 1;
  if (launch_run(root / "data", root / "killed", 5) != 0) return 1;
  // The restarted job resumed from the newest checkpoint before the kill (saved every 2 batches: batch 4).
  int64_t resumed_at = -1;
  std::ifstream(root / "killed" / "resumed_at") >> resumed_at;
  const auto a = final_weights(root / "whole"), b = final_weights(root / "killed");
  bool same = !a.empty() && a.size() == b.size();
  for (const auto& [name, t] : a) same = same && b.count(name) && at::equal(t, b.at(name));
  // The halving schedule: the rate lr_monitor logs at batches 2, 6 and 10 is 0.01, 0.005, 0.0025.
  const std::map<int64_t, double> expected = {{2, 0.01}, {6, 0.005}, {10, 0.0025}};
  int matched = 0;
  std::ifstream metrics(root / "whole" / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    const auto it = expected.find(j.value("batch", int64_t{-1}));
    if (it != expected.end() && j.contains("lr-DecoupledAdamW/group0")) {
      matched += std::abs(j["lr-DecoupledAdamW/group0"].get<double>() - it->second) < 1e-12;
    }
  }
  const bool halving = matched == static_cast<int>(expected.size());
  std::cout << fmt::format(
      "killed after batch 5, resumed at batch {}; {} tensors; the resumed run equals the "
      "uninterrupted one bitwise: {}; halving schedule applied: {}\n",
      resumed_at, a.size(), same ? "yes" : "no", halving ? "yes" : "no");
  fs::remove_all(root);
  return resumed_at == 4 && same && halving ? 0 : 1;
}

int main(int argc, char** argv) {
  util::init_logging("warn");
  try {
    if (argc >= 4 && std::string(argv[1]) == "rank") {
      return run_rank(argv[2], argv[3], argc > 4 ? std::stoll(argv[4]) : 0);
    }
    return check();
  } catch (const std::exception& e) {
    std::cerr << "custom_model: " << e.what() << "\n";
    return 1;
  }
}
