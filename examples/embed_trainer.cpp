// Embedding Tessera in research code: the main job's recipe, adjusted from C++, with a custom Algorithm and a custom
// Callback. Built with the project and run by the test suite (ctest -R example_embed_trainer).
//
//   build/bin/embed_trainer [DATA_DIR]   (default: a small synthetic MDS dataset written under /tmp)
#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <string>

#include "demo_data.h"
#include "tessera/trainer/trainer.h"
#include "tessera/util/logging.h"

namespace fs = std::filesystem;
using namespace tessera;

// A custom algorithm: freeze the token embeddings at INIT (the optimizer is created after INIT, so it never sees
// them), e.g. to study training with a fixed input representation.
class FreezeEmbeddings : public core::Algorithm {
 public:
  std::string name() const override { return "FreezeEmbeddings"; }
  bool match(core::Event e, const core::State&) const override { return e == core::Event::kInit; }
  void apply(core::Event, core::State& s, core::Logger&) override {
    s.model->named_parameters()["transformer.wte.weight"].set_requires_grad(false);
  }
};

// A custom callback: track the training loss and stop early once it is low enough.
class LossTracker : public core::Callback {
 public:
  explicit LossTracker(double stop_below) : stop_below_(stop_below) {}
  std::string name() const override { return "LossTracker"; }
  void run_event(core::Event e, core::State& s, core::Logger& logger) override {
    if (e != core::Event::kBatchEnd) return;
    losses.push_back(s.train_loss);
    logger.log_metrics({{"loss_tracker/best", *std::min_element(losses.begin(), losses.end())}});
    if (s.train_loss < stop_below_) s.stop_training();
  }
  std::vector<double> losses;

 private:
  double stop_below_;
};

int run(int argc, char** argv) {
  util::init_logging("warn");
  fs::path data = argc > 1 ? fs::path(argv[1]) : fs::temp_directory_path() / "tessera_embed_demo";
  if (argc <= 1) examples::write_demo_data(data);

  // The main job's recipe, made smaller from code (the same overrides work on the command line).
  trainer::TrainConfig cfg = trainer::load_train_config(
      TESSERA_SOURCE_DIR "/recipes/mpt-tiny-cpu.yaml",
      {"variables.data_local=" + data.string(), "variables.max_seq_len=64", "model.d_model=64", "model.n_layers=2",
       "model.vocab_size=128", "max_duration=40ba", "eval_interval=20ba", "eval_first=false", "callbacks={}",
       "loggers={}", "global_train_batch_size=16", "device_train_microbatch_size=8", "scheduler.t_warmup=5ba",
       "log_to_console=false"});

  auto freeze = std::make_shared<FreezeEmbeddings>();
  auto tracker = std::make_shared<LossTracker>(0.5);
  trainer::Trainer t(cfg, {{freeze}, {tracker}});
  const at::Tensor wte_before = t.state().model->named_parameters()["transformer.wte.weight"].detach().clone();
  t.fit();
  const core::Metrics eval = t.eval();

  const bool frozen = at::equal(wte_before, t.state().model->named_parameters()["transformer.wte.weight"]);
  const bool fell = tracker->losses.back() < tracker->losses.front() - 1.0;
  std::cout << fmt::format("batches: {}, loss {:.3f} -> {:.3f}, eval perplexity {:.2f}, embeddings frozen: {}\n",
                           tracker->losses.size(), tracker->losses.front(), tracker->losses.back(),
                           eval.at("LanguagePerplexity"), frozen ? "yes" : "no");
  return frozen && fell ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc > 2 || (argc == 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h"))) {
    std::cout << "usage: embed_trainer [DATA_DIR]\n  Trains the main job's model, made smaller from C++, with a custom "
                 "algorithm and callback, on DATA_DIR's MDS data (default: a small synthetic dataset under /tmp).\n";
    return argc == 2 ? 0 : 2;
  }
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // a bad DATA_DIR, an unreadable recipe: the message, not an abort
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
