// Research code that uses an installed Tessera (find_package(Tessera)): its own model, data loader, loss, metric,
// schedule, algorithm and callback (components.cpp), each registered by name and selected from research.yaml, trained
// like the built-in ones. The check trains the recipe on 2 ranks with FULL_SHARD, once uninterrupted and once killed
// and resumed, and compares. Built and run by examples/research/check.sh (ctest -R example_research), outside Tessera's
// build tree, which then also runs Tessera's installed tools on the same recipe with the components as a plug-in.
//
//   research_lm                  the check: writes demo data, then runs the recipe on 2 ranks twice, once
//                                uninterrupted and once with rank 1 killed by SIGKILL after batch 5 and the supervisor
//                                restarting the job (autoresume); exits 0 when the final weights of the two runs are
//                                bitwise equal, the schedule, algorithm and metric were applied, and the checkpoint's
//                                HF-format export computes the same logits
//   research_lm rank DATA RUN_DIR [KILL_AFTER]
//                                one rank of such a run (what the launcher spawns)
//   research_lm data DIR         writes the demo dataset to DIR
//   research_lm same-logits CHECKPOINT HF_FOLDER
//                                exits 0 when the two models compute the same logits (bitwise)
#include <fmt/format.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "tessera/checkpoint/checkpoint.h"
#include "tessera/checkpoint/hf.h"
#include "tessera/data/mds.h"
#include "tessera/data/tokenizer.h"
#include "tessera/distributed/launcher.h"
#include "tessera/models/causal_lm.h"
#include "tessera/trainer/trainer.h"
#include "tessera/util/logging.h"
#include "tessera/version.h"

namespace fs = std::filesystem;
using namespace tessera;

// ---- one rank, and the check -----------------------------------------------------------------------------------

// The demo data: 256 samples of 65 tokens < 97 with a learnable pattern, in the `train` and `val` splits that the
// text loader reads (`tokens`: ndarray:int32); a byte-level BPE tokenizer trained on short sentences
// (tokenizer.json, 300 tokens); and two in-context-learning tasks over such sentences, a language-modeling and a
// multiple-choice one (lm.jsonl, mc.jsonl, listed in icl_tasks.yaml for the `eval` tool).
void write_demo_data(const fs::path& dir) {
  for (const char* split : {"train", "val"}) {
    fs::remove_all(dir / split);
    data::mds::WriterOptions options;
    options.out = (dir / split).string();
    options.columns = {{"tokens", "ndarray:int32"}};
    options.compression = "zstd";
    options.size_limit = uint64_t{1} << 20;
    data::mds::MDSWriter w(options);
    for (int i = 0; i < 256; ++i) {
      std::vector<int32_t> t(65);
      for (size_t j = 0; j < t.size(); ++j) t[j] = static_cast<int32_t>((i + 3 * j) % 97);
      w.write({{"tokens", at::tensor(t, at::kInt)}});
    }
    w.finish();
  }
  const std::vector<std::string> animals = {"cat", "dog", "bird", "fish", "cow", "fox", "owl", "bee"};
  const std::vector<std::string> places = {"mat", "rug", "log", "box", "bed", "hill", "tree", "road"};
  std::vector<std::string> sentences;
  for (size_t a = 0; a < animals.size(); ++a) {
    for (size_t p = 0; p < places.size(); ++p) sentences.push_back("the " + animals[a] + " sat on the " + places[p]);
  }
  data::BpeTrainerOptions bpe;
  bpe.vocab_size = 300;
  data::train_bpe_tokenizer(sentences, bpe).save(dir / "tokenizer.json");
  std::ofstream lm(dir / "lm.jsonl"), mc(dir / "mc.jsonl");
  for (size_t i = 0; i < 16; ++i) {
    const std::string& animal = animals[i % animals.size()];
    const std::string& place = places[(3 * i) % places.size()];
    lm << nlohmann::json{{"context", "the " + animal + " sat on the"}, {"continuation", " " + place}}.dump() << "\n";
    mc << nlohmann::json{{"query", "the " + animal + " sat on"},
                         {"choices", {" the " + place, " a " + place + " and", " the the"}},
                         {"gold", 0}}
              .dump()
       << "\n";
  }
  std::ofstream(dir / "icl_tasks.yaml") << fmt::format(
      "icl_tasks:\n"
      "- {{label: sat_on, dataset_uri: {0}/lm.jsonl, num_fewshot: [0, 1], icl_task_type: language_modeling}}\n"
      "- {{label: sat_on_choice, dataset_uri: {0}/mc.jsonl, num_fewshot: [0], icl_task_type: multiple_choice}}\n",
      fs::absolute(dir).string());
}

int run_rank(const std::string& data, const std::string& run_dir, int64_t kill_after) {
  trainer::TrainConfig cfg = trainer::load_train_config(
      RESEARCH_SOURCE_DIR "/research.yaml", {"variables.data_local=" + data, "save_folder=" + run_dir + "/checkpoints",
                                             "loggers.jsonl.filename=" + run_dir + "/metrics.jsonl",
                                             "callbacks.kill_after.after=" + std::to_string(kill_after),
                                             "callbacks.kill_after.resumed_at=" + run_dir + "/resumed_at",
                                             // The save before the kill (every 2 batches: batch 4) complete first.
                                             "callbacks.kill_after.wait_for=" + run_dir + "/checkpoints/ep0-ba4"});
  trainer::Trainer t(cfg);
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

// Whether the model of a Tessera checkpoint and an HF-format folder compute the same logits, bit for bit.
bool same_logits(const std::string& checkpoint_dir, const std::string& hf_dir) {
  const auto a = checkpoint::load_checkpoint_model(checkpoint_dir);
  const auto b = checkpoint::load_hf_model(hf_dir);
  at::NoGradGuard no_grad;
  a->eval();
  b->eval();
  const at::Tensor ids = at::arange(1, 17, at::kLong).view({2, 8});
  return at::equal(a->forward(ids), b->forward(ids));
}

int check() {
  std::cout << fmt::format("research_lm: built against Tessera {} (headers {}, LibTorch {})\n", tessera::version(),
                           TESSERA_VERSION, TESSERA_TORCH_VERSION);
  const fs::path root = fs::temp_directory_path() / fmt::format("tessera_research_lm_{}", getpid());
  write_demo_data(root / "data");
  if (launch_run(root / "data", root / "whole", 0) != 0) return 1;
  if (launch_run(root / "data", root / "killed", 5) != 0) return 1;
  // The restarted job resumed from the newest checkpoint before the kill (saved every 2 batches: batch 4).
  int64_t resumed_at = -1;
  std::ifstream(root / "killed" / "resumed_at") >> resumed_at;
  const auto a = final_weights(root / "whole"), b = final_weights(root / "killed");
  bool same = !a.empty() && a.size() == b.size();
  for (const auto& [name, t] : a) same = same && b.count(name) && at::equal(t, b.at(name));
  // The halving schedule: the rate lr_monitor logs at batches 2, 6 and 10 is 0.01, 0.005, 0.0025. Token dropout: it
  // replaced about p of rank 0's 8 x 64 input tokens at every batch (p = 0.1: 51 expected; binomial sd 7).
  const std::map<int64_t, double> expected = {{2, 0.01}, {6, 0.005}, {10, 0.0025}};
  int matched = 0, dropout_batches = 0, evals = 0, icl = 0;
  std::ifstream metrics(root / "whole" / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    const auto it = expected.find(j.value("batch", int64_t{-1}));
    if (it != expected.end() && j.contains("lr-DecoupledAdamW/group0")) {
      matched += std::abs(j["lr-DecoupledAdamW/group0"].get<double>() - it->second) < 1e-12;
    }
    if (j.contains("metrics/eval/Top5Accuracy")) {
      const double a = j["metrics/eval/Top5Accuracy"].get<double>();
      evals += a > 0 && a <= 1;
    }
    for (const auto& [key, value] : j.items()) {  // the ICL tasks, evaluated with the eval loader on both ranks
      if (key.find("InContextLearning") != std::string::npos && value.get<double>() >= 0 && value.get<double>() <= 1) {
        ++icl;
      }
    }
    if (j.contains("token_dropout/replaced")) {
      const double n = j["token_dropout/replaced"].get<double>();
      dropout_batches += n >= 20 && n <= 90;
    }
  }
  // The final checkpoint exported as an HF-format folder and rebuilt from its config.json through the model_type
  // registry computes what the checkpoint's model computes; a left-padded sequence gets the logits it gets alone.
  const std::string latest = fs::canonical(root / "whole" / "checkpoints" / "latest").string();
  checkpoint::export_checkpoint_to_hf(latest, (root / "hf").string());
  const bool exported_same = same_logits(latest, (root / "hf").string());
  bool padding_ok = false;
  {
    const auto model = checkpoint::load_hf_model((root / "hf").string());
    at::NoGradGuard no_grad;
    model->eval();
    const at::Tensor ids = at::arange(9, 17, at::kLong).view({1, 8});
    at::Tensor padded = at::zeros({1, 11}, at::kLong), mask = at::ones({1, 11}, at::kLong);
    padded.slice(1, 3).copy_(ids);
    mask.slice(1, 0, 3).zero_();
    models::ForwardOptions fo;
    fo.attention_mask = mask;
    padding_ok = at::allclose(model->forward(ids), model->forward(padded, fo).slice(1, 3), 1e-5, 1e-6);
  }
  const bool halving = matched == static_cast<int>(expected.size());
  const bool dropout = dropout_batches == 12;
  // The focal loss trained, and the top-5 accuracy was reported at the evaluations after batches 6 and 12.
  std::cout << fmt::format(
      "research_lm: killed after batch 5, resumed at batch {}; {} tensors; the resumed run equals the uninterrupted "
      "one bitwise: {}; halving schedule applied: {}; token dropout at every batch: {}; Top5Accuracy evaluations: "
      "{}; ICL results: {}; the HF-format export computes the same logits: {}; left padding leaves the logits "
      "unchanged: {}\n",
      resumed_at, a.size(), same ? "yes" : "no", halving ? "yes" : "no", dropout ? "yes" : "no", evals, icl,
      exported_same ? "yes" : "no", padding_ok ? "yes" : "no");
  fs::remove_all(root);
  // Two evaluations, each with sat_on 0- and 1-shot and sat_on_choice 0-shot.
  return resumed_at == 4 && same && halving && dropout && evals == 2 && icl == 6 && exported_same && padding_ok ? 0 : 1;
}

int main(int argc, char** argv) {
  util::init_logging("warn");
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "rank" && argc >= 4) return run_rank(argv[2], argv[3], argc > 4 ? std::stoll(argv[4]) : 0);
    if (mode == "data" && argc == 3) {
      write_demo_data(argv[2]);
      return 0;
    }
    if (mode == "same-logits" && argc == 4) {
      const bool same = same_logits(fs::canonical(argv[2]).string(), argv[3]);
      std::cout << fmt::format("research_lm: {} and {} compute the same logits: {}\n", argv[2], argv[3],
                               same ? "yes" : "no");
      return same ? 0 : 1;
    }
    return check();
  } catch (const std::exception& e) {
    std::cerr << "research_lm: " << e.what() << "\n";
    return 1;
  }
}
