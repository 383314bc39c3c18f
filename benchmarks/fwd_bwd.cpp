// Forward+backward throughput of a recipe's model (any family, built through the model registry) on this machine
// (tokens/s and MFU against a measured GEMM peak).
//
//   bench_fwd_bwd --recipe recipes/mpt-125m.yaml [--batch 1] [--seq 512] [--steps 3] [--precision fp32|amp_bf16]
//                 [overrides ...]
//
// Prints one JSON object per line. benchmarks/mpt_fwd_bwd_vs_hf.py and llama_vs_hf.py run it beside HF
// transformers' eager classes.
#include <ATen/autocast_mode.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <iostream>

#include "tessera/models/causal_lm.h"
#include "tessera/trainer/train_config.h"
#include "tessera/util/allocator.h"
#include "tessera/util/error.h"
#include "tessera/util/peak_flops.h"

int main(int argc, char** argv) {
  CLI::App app{"Forward+backward throughput of a recipe's model"};
  std::string recipe = "recipes/mpt-125m.yaml", precision = "fp32";
  std::vector<std::string> overrides;
  int64_t batch = 1, seq = 512, steps = 3, warmup = 1;
  app.add_option("--recipe", recipe);
  app.add_option("--batch", batch);
  app.add_option("--seq", seq);
  app.add_option("--steps", steps);
  app.add_option("--warmup", warmup);
  app.add_option("--precision", precision)->check(CLI::IsMember({"fp32", "amp_bf16"}));
  bool reference = false;
  app.add_flag("--reference-attention", reference, "explicit softmax attention instead of SDPA");
  app.add_option("overrides", overrides);
  bool default_allocator = false;
  app.add_flag("--default-allocator", default_allocator, "skip util::configure_host_allocator()");
  CLI11_PARSE(app, argc, argv);
  if (!default_allocator) tessera::util::configure_host_allocator();
  try {
    const auto cfg = tessera::trainer::load_train_config(recipe, overrides);
    auto model = tessera::models::model_registry().build(cfg.model.name, cfg.model, "cpu", 0);
    model->train();
    const at::Tensor ids = at::randint(0, model->vocab_size(), {batch, seq}, at::kLong);
    const bool bf16 = precision == "amp_bf16";
    auto step = [&] {
      model->zero_grad();
      at::autocast::set_autocast_enabled(at::kCPU, bf16);
      at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
      tessera::models::ForwardOptions fo;
      fo.reference_attention = reference;
      const at::Tensor loss = tessera::models::causal_lm_loss(model->forward(ids, fo), ids);
      at::autocast::set_autocast_enabled(at::kCPU, false);
      at::autocast::clear_cache();
      loss.backward();
      return loss.item<double>();
    };
    for (int64_t i = 0; i < warmup; ++i) step();
    std::vector<double> step_seconds;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < steps; ++i) {
      const auto s0 = std::chrono::steady_clock::now();
      step();
      step_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count());
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tokens_per_s = static_cast<double>(batch * seq * steps) / dt;
    const double flops_per_token = model->flops_per_token(seq);
    int64_t params = 0;
    for (const auto& p : model->parameters()) params += p.numel();
    const double peak = tessera::util::measure_matmul_flops(bf16 ? at::kBFloat16 : at::kFloat);
    nlohmann::json out = {{"framework", "tessera"},
                          {"precision", precision},
                          {"model", model->family()},
                          {"params", params},
                          {"batch", batch},
                          {"seq", seq},
                          {"threads", at::get_num_threads()},
                          {"tokens_per_s", tokens_per_s},
                          {"step_seconds", step_seconds},
                          {"flops_per_token", flops_per_token},
                          {"gemm_peak_flops", peak},
                          {"mfu", tokens_per_s * flops_per_token / peak}};
    std::cout << out.dump() << std::endl;
  } catch (const tessera::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return e.exit_code();
  }
  return 0;
}
