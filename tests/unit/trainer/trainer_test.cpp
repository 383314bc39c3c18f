// The training loop on a tiny model and dataset: the engine's event sequence (2 epochs, evaluation, gradient
// accumulation), algorithm ordering, determinism, gradient accumulation against one big batch, and a falling loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "models/mpt/mpt.h"
#include "tessera/algorithms/algorithms.h"
#include "tessera/config/reader.h"
#include "tessera/config/value.h"
#include "tessera/data/mds.h"
#include "tessera/data/tokenizer.h"
#include "tessera/eval/icl.h"
#include "tessera/trainer/step_graph.h"
#include "tessera/trainer/trainer.h"
#include "tessera/util/device.h"
#include "tessera/util/peak_flops.h"
#include "test_util.h"
#include "tiny_data.h"

namespace tessera::trainer {
namespace {

using core::Algorithm;
using core::Callback;
using core::Event;
using core::Logger;
using core::LoggerDestination;
using core::Metrics;
using core::State;

namespace fs = std::filesystem;

fs::path dataset() {
  static const fs::path dir = [] {
    const fs::path d = fs::temp_directory_path() / "tessera_trainer_test";
    testing::write_token_split(d / "train", 24, 1);
    testing::write_token_split(d / "val", 10, 2);
    return d;
  }();
  return dir;
}

TrainConfig tiny_config(const std::vector<std::string>& overrides = {}) {
  return testing::tiny_train_config(
      dataset(), "eval_interval: 1ep\ndevice_train_microbatch_size: 4\ndevice_eval_batch_size: 4\n", overrides);
}

class Recorder : public Callback {
 public:
  std::string name() const override { return "Recorder"; }
  void run_event(Event e, State& /*s*/, Logger& /*l*/) override { events.emplace_back(to_string(e)); }
  std::vector<std::string> events;
};

class Tagger : public Algorithm {
 public:
  Tagger(std::string tag, std::vector<std::string>* log) : tag_(std::move(tag)), log_(log) {}
  std::string name() const override { return tag_; }
  bool match(Event e, const State& /*s*/) const override {
    return e == Event::kInit || e == Event::kBeforeLoss || e == Event::kAfterLoss;
  }
  void apply(Event e, State& /*s*/, Logger& /*l*/) override { log_->push_back(tag_ + ":" + std::string(to_string(e))); }

 private:
  std::string tag_;
  std::vector<std::string>* log_;
};

std::vector<std::string> repeat(const std::vector<std::string>& part, int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.insert(out.end(), part.begin(), part.end());
  return out;
}

std::vector<std::string> concat(std::initializer_list<std::vector<std::string>> parts) {
  std::vector<std::string> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

TEST(Trainer, EventOrderTwoEpochsWithEvalAndAccumulation) {
  auto rec = std::make_shared<Recorder>();
  Trainer t(tiny_config(), {.algorithms = {}, .callbacks = {rec}});
  t.fit();
  // 24 samples / batch 8 = 3 batches per epoch; 2 microbatches of 4; eval: 10 samples / 4 = 3 batches.
  const auto micro =
      repeat({"before_forward", "after_forward", "before_loss", "after_loss", "before_backward", "after_backward"}, 2);
  const auto batch = concat({{"before_dataloader", "after_dataloader", "batch_start", "before_train_batch"},
                             micro,
                             {"after_train_batch", "batch_end", "batch_checkpoint"}});
  const auto eval =
      concat({{"eval_before_all", "eval_start"},
              repeat({"eval_batch_start", "eval_before_forward", "eval_after_forward", "eval_batch_end"}, 3),
              {"eval_end", "eval_after_all"}});
  const auto epoch = concat({{"epoch_start"}, repeat(batch, 3), {"epoch_end"}, eval, {"epoch_checkpoint"}});
  const auto expected = concat({{"init", "before_load", "after_load", "fit_start"}, repeat(epoch, 2), {"fit_end"}});
  EXPECT_EQ(rec->events, expected);
  EXPECT_EQ(t.state().timestamp.epoch, 2);
  EXPECT_EQ(t.state().timestamp.batch, 6);
  EXPECT_EQ(t.state().timestamp.sample, 48);
  EXPECT_EQ(t.state().timestamp.token, 48 * 32);
}

TEST(Trainer, AlgorithmsRunInOrderAndReverseOnAfterEvents) {
  std::vector<std::string> log;
  auto a = std::make_shared<Tagger>("A", &log);
  auto b = std::make_shared<Tagger>("B", &log);
  Trainer t(tiny_config({"max_duration=1ba", "eval_interval=0"}), {.algorithms = {a, b}, .callbacks = {}});
  t.fit();
  const std::vector<std::string> expected = {"A:init",       "B:init",       "A:before_loss", "B:before_loss",
                                             "B:after_loss", "A:after_loss", "A:before_loss", "B:before_loss",
                                             "B:after_loss", "A:after_loss"};
  EXPECT_EQ(log, expected);
}

std::vector<at::Tensor> weights_after(const TrainConfig& cfg) {
  Trainer t(cfg);
  t.fit();
  std::vector<at::Tensor> out;
  for (const auto& p : t.state().model->parameters()) out.push_back(p.detach().clone());
  return out;
}

TEST(Trainer, TwoRunsAreBitwiseIdentical) {
  const TrainConfig cfg = tiny_config({"max_duration=4ba", "eval_interval=0", "deterministic_mode=true"});
  const auto a = weights_after(cfg);
  const auto b = weights_after(cfg);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << "parameter " << i;
}

TEST(Trainer, AccumulationMatchesOneBigBatch) {
  // SGD, so that the comparison sees gradients directly (Adam's normalisation magnifies rounding in ~0 gradients).
  const std::vector<std::string> base = {"max_duration=3ba", "eval_interval=0", "optimizer.name=decoupled_sgdw",
                                         "optimizer.lr=0.5"};
  auto with = [&](std::string extra) {
    auto o = base;
    o.push_back(std::move(extra));
    return tiny_config(o);
  };
  const auto accumulated = weights_after(with("device_train_microbatch_size=2"));
  const auto whole = weights_after(with("device_train_microbatch_size=8"));
  for (size_t i = 0; i < whole.size(); ++i) {
    EXPECT_TRUE(at::allclose(accumulated[i], whole[i], 1e-5, 1e-6)) << "parameter " << i;
  }
}

// A callback that needs more memory than exists while the microbatch is above 2 samples: its allocation fails in
// LibTorch's CPU allocator for real (1 PiB), as a forward that does not fit would.
class AllocatesTooMuchAboveTwoSamples : public Callback {
 public:
  std::string name() const override { return "AllocatesTooMuchAboveTwoSamples"; }
  void run_event(Event e, State& s, Logger& /*l*/) override {
    if (e != Event::kAfterForward) return;
    sizes.push_back(s.device_train_microbatch_size);
    (void)at::empty({s.device_train_microbatch_size > 2 ? int64_t{1} << 50 : 1}, at::kByte);
  }
  std::vector<int64_t> sizes;  // microbatch size of each forward
};

TEST(Trainer, AutoMicrobatchingHalvesAndRetriesWhenAnAllocationFails) {
  try {
    (void)at::empty({int64_t{1} << 50}, at::kByte);
    ADD_FAILURE() << "allocated 1 PiB";
  } catch (const std::exception& e) {
    EXPECT_TRUE(util::is_out_of_memory(e)) << e.what();
  }
  EXPECT_FALSE(util::is_out_of_memory(Error("train", "not enough samples")));

  const std::vector<std::string> base = {"max_duration=3ba", "eval_interval=0", "deterministic_mode=true"};
  auto with = [&](const std::string& extra) {
    auto o = base;
    o.push_back(extra);
    return tiny_config(o);
  };
  auto hungry = std::make_shared<AllocatesTooMuchAboveTwoSamples>();
  Trainer t(with("device_train_microbatch_size=auto"), {{}, {hungry}});
  t.fit();
  EXPECT_EQ(t.state().device_train_microbatch_size, 2);
  // Batch 1: 8 fails, 4 fails, then 2 + 2 + 2 + 2; batches 2 and 3 keep 2.
  const std::vector<int64_t> expected = {8, 4, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2};
  EXPECT_EQ(hungry->sizes, expected);
  // The retried run is the run that used 2 samples from the start, bit for bit.
  const auto fixed = weights_after(with("device_train_microbatch_size=2"));
  const auto params = t.state().model->parameters();
  ASSERT_EQ(params.size(), fixed.size());
  for (size_t i = 0; i < fixed.size(); ++i) EXPECT_TRUE(at::equal(params[i], fixed[i])) << "parameter " << i;
}

TEST(Trainer, LossFallsAndEvalReportsPerplexity) {
  Trainer t(tiny_config({"max_duration=8ep", "eval_interval=0"}));
  const double before = t.eval().at("LanguageCrossEntropy");
  t.fit();
  const Metrics after = t.eval();
  // Falls clearly, and below a uniform guess over the 64-token vocabulary (ln 64 = 4.16).
  EXPECT_LT(after.at("LanguageCrossEntropy"), before - 0.5);
  EXPECT_LT(after.at("LanguageCrossEntropy"), std::log(64.0));
  EXPECT_NEAR(after.at("LanguagePerplexity"), std::exp(after.at("LanguageCrossEntropy")), 1e-9);
}

TEST(Trainer, BadSetupsNameTheProblem) {
  EXPECT_NE(testing::error_of([] { Trainer t(tiny_config({"global_train_batch_size=64"})); }).find("fewer samples"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] {
              Trainer t(tiny_config({"precision=amp_fp16", "device=cpu"}));
            }).find("amp_fp16 needs a GPU"),
            std::string::npos);
  // amp_fp8 is a GPU precision (compute capability 8.9+): on the CPU, a ConfigError before anything trains.
  const std::string fp8 = testing::error_of([] { Trainer t(tiny_config({"precision=amp_fp8", "device=cpu"})); });
  EXPECT_NE(fp8.find("precision: amp_fp8: float8 GEMMs need an NVIDIA GPU of compute capability 8.9"),
            std::string::npos)
      << fp8;
  // cuda_graphs: every reason a replayed step cannot serve this run, named at once, before anything trains.
  std::vector<std::string> log;
  const std::string graphs = testing::error_of([&log] {
    Trainer t(tiny_config({"cuda_graphs=true", "device=cpu", "device_train_microbatch_size=auto"}),
              {{std::make_shared<Tagger>("tagger", &log)}, {}});
  });
  for (const char* why : {"cuda_graphs: true: CUDA graphs need a GPU", "device_train_microbatch_size: auto",
                          "algorithm tagger acts at before_loss, inside the step", "set cuda_graphs: false"}) {
    EXPECT_NE(graphs.find(why), std::string::npos) << graphs;
  }
  // `device`: auto, cpu or gpu; gpu needs one.
  EXPECT_NE(testing::error_of([] { tiny_config({"device=tpu"}); }).find("device"), std::string::npos);
  if (util::device_info().cuda_devices == 0) {
    EXPECT_NE(testing::error_of([] { Trainer t(tiny_config({"device=gpu"})); }).find("device: gpu, but cpu"),
              std::string::npos);
  }
  EXPECT_FALSE(Trainer(tiny_config({"device=cpu"})).state().device.is_cuda());
}

// `icl_tasks` in a recipe: evaluated at eval_interval with the eval loader, logged per task and few-shot count.
TEST(Trainer, IclTasksRunAtEvalInterval) {
  const fs::path dir = fs::temp_directory_path() / "tessera_trainer_icl";
  fs::create_directories(dir);
  data::train_bpe_tokenizer({"the cat sat on the mat", "x a a a a a b b b b"}, {300, 2, {"<|endoftext|>"}})
      .save(dir / "tokenizer.json");
  std::ofstream(dir / "mc.jsonl") << R"({"query": "the cat", "choices": ["sat", "mat"], "gold": 0}
{"query": "a b", "choices": ["a", "b b"], "gold": 1}
{"query": "the mat", "choices": ["cat", "on"], "gold": 1}
)";
  std::ofstream(dir / "lm.jsonl") << R"({"context": "the cat sat", "continuation": "on the mat"}
{"context": "x a a", "continuation": "a"}
)";
  const std::string tasks = "icl_tasks=[{label: mc, dataset_uri: " + (dir / "mc.jsonl").string() +
                            ", num_fewshot: [0, 1], icl_task_type: multiple_choice}, {label: lm, dataset_uri: " +
                            (dir / "lm.jsonl").string() + ", num_fewshot: [1], icl_task_type: language_modeling}]";
  // The Eval Gauntlet over them: mc/1-shot against a 0.5 baseline, lm/1-shot against 0.
  const std::string gauntlet =
      "eval_gauntlet={categories: [{name: both, benchmarks: [{name: mc, num_fewshot: 1, random_baseline: 0.5}, "
      "{name: lm, num_fewshot: 1, random_baseline: 0.0}]}]}";
  auto rec = std::make_shared<Recorder>();
  Trainer t(tiny_config({"model.vocab_size=320", "tokenizer.name=" + dir.string(), tasks, gauntlet}),
            {.algorithms = {}, .callbacks = {rec}});
  t.fit();
  EXPECT_EQ(std::count(rec->events.begin(), rec->events.end(), "eval_start"), 2);
  const auto& m = t.state().eval_metrics;
  ASSERT_EQ(m.count("mc/0-shot"), 1u);
  ASSERT_EQ(m.count("mc/1-shot"), 1u);
  ASSERT_EQ(m.count("lm/1-shot"), 1u);
  EXPECT_EQ(m.count("eval"), 1u);
  // The logged accuracy is the evaluator's on the final model.
  const data::Tokenizer tok = data::Tokenizer::from_file(dir / "tokenizer.json");
  eval::IclTaskConfig mc;
  mc.label = "mc";
  mc.dataset_uri = (dir / "mc.jsonl").string();
  mc.icl_task_type = "multiple_choice";
  mc.max_seq_len = 32;
  EXPECT_DOUBLE_EQ(m.at("mc/1-shot").at("InContextLearningMultipleChoiceAccuracy"),
                   eval::evaluate_icl_task(*t.state().model, tok, mc, 1).at(0).accuracy());
  // A subset (icl_subset_num_batches): the examples of the first batches of LLM Foundry's dataloader, whose
  // multiple-choice batches hold batch_size / choices examples; on 2 ranks each rank's first batches.
  eval::IclTaskConfig subset = mc;
  subset.subset_num_batches = 1;
  EXPECT_EQ(eval::evaluate_icl_task(*t.state().model, tok, subset, 1, {}, 2).at(0).total, 1);
  EXPECT_EQ(eval::evaluate_icl_task(*t.state().model, tok, subset, 1, {}, 4).at(0).total, 2);
  EXPECT_EQ(eval::evaluate_icl_task(*t.state().model, tok, subset, 1, {}, 1).at(0).total, 1);  // at least one
  subset.subset_num_batches = 2;
  EXPECT_EQ(eval::evaluate_icl_task(*t.state().model, tok, subset, 1, {}, 4).at(0).total, 3);  // the whole file
  subset.subset_num_batches = std::numeric_limits<int64_t>::max();  // a count past int64 when multiplied out
  EXPECT_EQ(eval::evaluate_icl_task(*t.state().model, tok, subset, 1, {}, 4).at(0).total, 3);
  // In a recipe: the trainer evaluates each task's first batches (device_eval_batch_size 4: 2 questions of 2 choices).
  Trainer sub(
      tiny_config({"model.vocab_size=320", "tokenizer.name=" + dir.string(), tasks, "icl_subset_num_batches=1"}));
  sub.fit();
  subset.subset_num_batches = 1;
  const double first_two = eval::evaluate_icl_task(*sub.state().model, tok, subset, 1, {}, 4).at(0).accuracy();
  const double all_three = eval::evaluate_icl_task(*sub.state().model, tok, mc, 1, {}, 4).at(0).accuracy();
  EXPECT_DOUBLE_EQ(sub.state().eval_metrics.at("mc/1-shot").at("InContextLearningMultipleChoiceAccuracy"), first_two)
      << "the whole task scores " << all_three;
  const auto& g = m.at("eval_gauntlet");
  const double both = ((m.at("mc/1-shot").at("InContextLearningMultipleChoiceAccuracy") - 0.5) / 0.5 +
                       m.at("lm/1-shot").at("InContextLearningLMAccuracy")) /
                      2;
  EXPECT_DOUBLE_EQ(g.at("icl/metrics/eval_gauntlet/both"), both);
  EXPECT_DOUBLE_EQ(g.at("icl/metrics/eval_gauntlet/default_average"), both);
  EXPECT_NE(testing::error_of([&] { Trainer alone(tiny_config({gauntlet})); }).find("eval_gauntlet: needs icl_tasks"),
            std::string::npos);
  // icl_seq_len bounds the prompts of tasks without their own max_seq_len: lm's 3-token continuation cannot fit in 2.
  EXPECT_NE(testing::error_of([&] {
              Trainer short_prompts(
                  tiny_config({"model.vocab_size=320", "tokenizer.name=" + dir.string(), tasks, "icl_seq_len=2"}));
              short_prompts.fit();
            }).find("does not fit in max_seq_len 2"),
            std::string::npos);
  // Without a tokenizer file the recipe is refused before training.
  EXPECT_NE(testing::error_of([&] {
              Trainer bad(tiny_config({"model.vocab_size=320", tasks}));
            }).find("tokenizer.name: icl_tasks need a tokenizer"),
            std::string::npos);
}

// ---- algorithms (each does what it claims) ----

// Records the sequence length of every forward and the parameters at every batch end.
class Probe : public Callback {
 public:
  std::string name() const override { return "Probe"; }
  void run_event(Event e, State& s, Logger& /*l*/) override {
    if (e == Event::kBeforeForward) lengths.push_back(s.batch.input_ids.size(1));
    if (e == Event::kEvalBeforeForward) eval_lengths.push_back(s.batch.input_ids.size(1));
    if (e == Event::kBatchEnd) {
      std::vector<at::Tensor> p;
      for (const auto& t : s.model->parameters()) p.push_back(t.detach().clone());
      params.push_back(std::move(p));
    }
    if (e == Event::kEvalStart) {
      std::vector<at::Tensor> p;
      for (const auto& t : s.model->parameters()) p.push_back(t.detach().clone());
      eval_params.push_back(std::move(p));
    }
  }
  std::vector<int64_t> lengths, eval_lengths;
  std::vector<std::vector<at::Tensor>> params, eval_params;
};

// Each parameter's piece of `values` (a held tensor or its gradient), shaped like the parameter: one rank holds
// every parameter whole, as ranges of the engine's flat vectors.
void append_per_parameter(const core::HeldTensor& h, const at::Tensor& values, std::vector<at::Tensor>* out) {
  for (const dist::ShardSpan& sp : h.spans) {
    out->push_back(values.detach().reshape({-1}).narrow(0, sp.offset, sp.numel).view(sp.shape).clone());
  }
}

std::vector<at::Tensor> grads_after_clipping(const std::string& type, double threshold, std::vector<at::Tensor>* before,
                                             std::vector<at::Tensor>* weights = nullptr) {
  struct Grab : Callback {
    std::string name() const override { return "Grab"; }
    void run_event(Event e, State& s, Logger& /*l*/) override {
      if (e != Event::kAfterTrainBatch) return;  // callbacks run after algorithms: clipped gradients here
      for (const auto& h : s.held_layout()) append_per_parameter(h, h.tensor.grad(), &grads);
    }
    std::vector<at::Tensor> grads;
  };
  struct GrabBefore : Algorithm {  // registered before clipping: sees the unclipped gradients
    std::string name() const override { return "GrabBefore"; }
    bool match(Event e, const State& /*s*/) const override { return e == Event::kAfterTrainBatch; }
    void apply(Event /*e*/, State& s, Logger& /*l*/) override {
      for (const auto& h : s.held_layout()) {
        append_per_parameter(h, h.tensor.grad(), &grads);
        append_per_parameter(h, h.tensor, &weights);
      }
    }
    std::vector<at::Tensor> grads, weights;
  };
  auto grab = std::make_shared<Grab>();
  auto first = std::make_shared<GrabBefore>();
  // AFTER_* events run algorithms in reverse: the recipe's clipping (first in the list) runs after GrabBefore.
  Trainer t(tiny_config({"max_duration=1ba", "eval_interval=0", "algorithms.gradient_clipping.clipping_type=" + type,
                         "algorithms.gradient_clipping.clipping_threshold=" + std::to_string(threshold)}),
            {.algorithms = {first}, .callbacks = {grab}});
  t.fit();
  *before = first->grads;
  if (weights != nullptr) *weights = first->weights;
  return grab->grads;
}

TEST(Algorithms, GradientClippingNormValueAdaptive) {
  std::vector<at::Tensor> raw;
  const auto norm = grads_after_clipping("norm", 0.05, &raw);
  std::vector<at::Tensor> norms;
  for (const auto& g : raw) norms.push_back(g.norm());
  const double total = at::stack(norms).norm().item<double>();
  ASSERT_GT(total, 0.05) << "the test needs gradients above the threshold";
  for (size_t i = 0; i < raw.size(); ++i) EXPECT_TRUE(at::allclose(norm[i], raw[i] * (0.05 / (total + 1e-6))));
  const auto value = grads_after_clipping("value", 1e-3, &raw);
  for (size_t i = 0; i < raw.size(); ++i) EXPECT_TRUE(at::equal(value[i], raw[i].clamp(-1e-3, 1e-3)));
  // AGC: each unit (matrix row; whole vector otherwise) scaled by min(1, threshold * |w_unit| / |g_unit|).
  std::vector<at::Tensor> weights;
  const auto agc = grads_after_clipping("adaptive", 0.01, &raw, &weights);
  int clipped_units = 0;
  for (size_t i = 0; i < raw.size(); ++i) {
    const bool matrix = raw[i].dim() > 1;
    const at::Tensor g = matrix ? raw[i].norm(2, {1}, true) : raw[i].norm();
    const at::Tensor w = matrix ? weights[i].norm(2, {1}, true) : weights[i].norm();
    const at::Tensor coef = at::clamp_max(0.01 * w / g, 1.0);
    clipped_units += (coef < 1).sum().item<int>();
    EXPECT_TRUE(at::allclose(agc[i], raw[i] * coef, 1e-5, 1e-8)) << "parameter " << i;
  }
  EXPECT_GT(clipped_units, 0);
}

TEST(Algorithms, AlibiDropsPositionsTrainsShortEvaluatesLong) {
  auto probe = std::make_shared<Probe>();
  Trainer t(tiny_config({"max_duration=2ba", "algorithms.alibi.train_sequence_length_scaling=0.25",
                         "algorithms.alibi.max_sequence_length=64"}),
            {.algorithms = {}, .callbacks = {probe}});
  const auto mpt = std::dynamic_pointer_cast<models::MPTForCausalLMImpl>(t.state().model);
  ASSERT_TRUE(mpt);
  EXPECT_TRUE(mpt->options().attn.alibi);
  EXPECT_FALSE(mpt->transformer->wpe);
  EXPECT_EQ(mpt->options().max_seq_len, 64);
  t.fit();
  for (int64_t len : probe->lengths) EXPECT_EQ(len, 8);        // 32 * 0.25
  for (int64_t len : probe->eval_lengths) EXPECT_EQ(len, 32);  // evaluation at the full length
  EXPECT_FALSE(probe->eval_lengths.empty());
}

TEST(Algorithms, LoraTrainsOnlyAdaptersAndMergesExactly) {
  auto probe = std::make_shared<Probe>();
  Trainer t(tiny_config({"max_duration=3ba", "eval_interval=0", "algorithms.lora.r=4", "algorithms.lora.lora_alpha=8",
                         "algorithms.lora.lora_dropout=0", "algorithms.lora.target_modules=[Wqkv,up_proj]"}),
            {.algorithms = {}, .callbacks = {probe}});
  int adapters = 0;
  for (const auto& p : t.state().model->named_parameters()) {
    const bool adapter = p.key().find("lora_") != std::string::npos;
    EXPECT_EQ(p.value().requires_grad(), adapter) << p.key();
    adapters += adapter;
  }
  EXPECT_EQ(adapters, 2 * 2 * 2);  // 2 layers x (Wqkv, up_proj) x (A, B)
  const auto before = t.state().model->named_parameters();
  std::map<std::string, at::Tensor> base;
  for (const auto& p : before) base[p.key()] = p.value().detach().clone();
  t.fit();
  for (const auto& p : t.state().model->named_parameters()) {
    const bool changed = !at::equal(base[p.key()], p.value());
    EXPECT_EQ(changed, p.key().find("lora_") != std::string::npos) << p.key();
  }
  // The merged model computes what the adapted one computes.
  models::CausalLM& model = *t.state().model;
  model.eval();
  const at::Tensor ids = at::randint(0, 64, {2, 16}, at::TensorOptions().dtype(at::kLong).device(t.state().device));
  const at::Tensor adapted = model.forward(ids).detach();
  algorithms::merge_lora(model);
  for (const auto& p : model.named_parameters()) EXPECT_EQ(p.key().find("lora_"), std::string::npos) << p.key();
  EXPECT_TRUE(at::allclose(model.forward(ids), adapted, 1e-5, 1e-5));
}

TEST(Algorithms, EmaAveragesWeightsAndIsSwappedInForEval) {
  auto probe = std::make_shared<Probe>();
  Trainer t(tiny_config({"max_duration=4ba", "eval_interval=2ba", "algorithms.ema.half_life=2ba"}),
            {.algorithms = {}, .callbacks = {probe}});
  std::vector<at::Tensor> expected;
  for (const auto& p : t.state().model->parameters()) expected.push_back(p.detach().clone());
  t.fit();
  auto* ema = dynamic_cast<algorithms::Ema*>(t.state().algorithms.at(0).get());
  ASSERT_NE(ema, nullptr);
  EXPECT_DOUBLE_EQ(ema->smoothing(), std::pow(2.0, -0.5));
  const double s = ema->smoothing();
  for (const auto& step : probe->params) {
    for (size_t i = 0; i < expected.size(); ++i) expected[i] = expected[i] * s + step[i] * (1 - s);
  }
  // The averages are kept per held tensor (the engine's flat vectors): read each parameter's range of them.
  std::map<std::string, at::Tensor> averaged;
  const auto held = t.state().held_layout();
  ASSERT_EQ(held.size(), ema->weights().size());
  for (size_t k = 0; k < held.size(); ++k) {
    for (const dist::ShardSpan& sp : held[k].spans) {
      averaged[sp.name] = ema->weights()[k].reshape({-1}).narrow(0, sp.offset, sp.numel).view(sp.shape);
    }
  }
  const auto named = t.state().model->named_parameters();
  ASSERT_EQ(named.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(at::allclose(averaged.at(named[i].key()), expected[i], 1e-5, 1e-6)) << named[i].key();
  }
  // Evaluation (after batches 2 and 4) saw averaged weights, and training continued with the raw ones.
  ASSERT_EQ(probe->eval_params.size(), 2u);
  EXPECT_FALSE(at::equal(probe->eval_params[1][0], probe->params[3][0]));
  EXPECT_TRUE(at::allclose(probe->eval_params[1][0], averaged.at(named[0].key())));
  EXPECT_TRUE(at::equal(t.state().model->parameters()[0], probe->params[3][0]));
}

TEST(Algorithms, LowPrecisionLayerNormSwitchesEveryNorm) {
  Trainer t(tiny_config(
      {"max_duration=1ba", "eval_interval=0", "model.norm_type=layernorm", "algorithms.low_precision_layernorm={}"}));
  int norms = 0;
  for (const auto& m : t.state().model->modules()) {
    if (auto* n = dynamic_cast<models::NormImpl*>(m.get())) {
      EXPECT_EQ(n->type, models::NormType::kLowPrecisionLayerNorm);
      ++norms;
    }
  }
  EXPECT_EQ(norms, 2 * 2 + 1);
}

TEST(Algorithms, SeqLengthWarmupRampsTheLength) {
  auto probe = std::make_shared<Probe>();
  Trainer t(tiny_config({"max_duration=10ba", "eval_interval=0", "algorithms.seq_length_warmup.duration=0.5",
                         "algorithms.seq_length_warmup.min_seq_length=8",
                         "algorithms.seq_length_warmup.max_seq_length=32", "algorithms.seq_length_warmup.step_size=8"}),
            {.algorithms = {}, .callbacks = {probe}});
  t.fit();
  // 5 warmup batches, (32 - 8) / 8 = 3 updates, one every 1 batch: 8, 16, 24, 32 (capped), 32, then 32.
  std::vector<int64_t> per_batch;
  for (size_t i = 0; i < probe->lengths.size(); i += 2) per_batch.push_back(probe->lengths[i]);  // 2 microbatches
  EXPECT_EQ(per_batch, (std::vector<int64_t>{8, 16, 24, 32, 32, 32, 32, 32, 32, 32}));
}

// ---- callbacks and precision ----

class Collect : public LoggerDestination {
 public:
  std::string name() const override { return "Collect"; }
  void log_metrics(const Metrics& m, int64_t step) override {
    for (const auto& [k, v] : m) last[k] = {step, v};
  }
  std::map<std::string, std::pair<int64_t, double>> last;
};

// Counts, independently of the speed monitor, the tokens each batch's forwards saw and when each batch ended.
class TokenClock : public Callback {
 public:
  std::string name() const override { return "TokenClock"; }
  void run_event(Event e, State& s, Logger& /*l*/) override {
    if (e == Event::kBeforeForward) tokens_in_batch += s.batch.input_ids.numel();
    if (e == Event::kBatchEnd) {
      ends.push_back(std::chrono::steady_clock::now());
      tokens.push_back(tokens_in_batch);
      tokens_in_batch = 0;
    }
  }
  int64_t tokens_in_batch = 0;
  std::vector<int64_t> tokens;
  std::vector<std::chrono::steady_clock::time_point> ends;
};

TEST(Callbacks, MonitorsLogConsistentValues) {
  auto sink = std::make_shared<Collect>();
  auto clock = std::make_shared<TokenClock>();
  Trainer t(tiny_config({"max_duration=6ba", "eval_interval=0", "callbacks.speed_monitor.window_size=2",
                         "callbacks.speed_monitor.gpu_flops_available=1e12", "callbacks.lr_monitor={}",
                         "callbacks.memory_monitor={}", "callbacks.runtime_estimator={}",
                         "scheduler.name=linear_decay_with_warmup", "scheduler.t_warmup=2ba"}),
            {.algorithms = {}, .callbacks = {clock, sink}});
  t.fit();
  auto value = [&](const std::string& k) {
    EXPECT_TRUE(sink->last.count(k)) << k;
    return sink->last[k].second;
  };
  // Every sample is 32 tokens (33 stored, truncated to max_seq_len): tokens/s = 32 x samples/s = 256 x batches/s.
  EXPECT_NEAR(value("throughput/tokens_per_sec"), 32 * value("throughput/samples_per_sec"), 1e-6);
  EXPECT_NEAR(value("throughput/samples_per_sec"), 8 * value("throughput/batches_per_sec"), 1e-6);
  const double flops_per_token = models::mpt_flops_per_token(
      std::dynamic_pointer_cast<models::MPTForCausalLMImpl>(t.state().model)->options(), 32);
  EXPECT_NEAR(value("throughput/flops_per_sec"), flops_per_token * value("throughput/tokens_per_sec"),
              1e-6 * value("throughput/flops_per_sec"));
  EXPECT_NEAR(value("throughput/device/mfu"), value("throughput/device/flops_per_sec") / 1e12, 1e-12);
  // Against tokens counted here and this test's own clock over the monitor's window (the last 2 batches): the same
  // rate, up to the moments at which each side reads the clock (microseconds in batches of milliseconds).
  ASSERT_EQ(clock->tokens.size(), 6u);
  EXPECT_EQ(clock->tokens[5], 8 * 32);
  const double window_s = std::chrono::duration<double>(clock->ends[5] - clock->ends[3]).count();
  const double tokens_per_s = static_cast<double>(clock->tokens[4] + clock->tokens[5]) / window_s;
  EXPECT_NEAR(value("throughput/tokens_per_sec"), tokens_per_s, 0.25 * tokens_per_s);
  EXPECT_NEAR(value("throughput/device/mfu"), flops_per_token * tokens_per_s / 1e12,
              0.25 * flops_per_token * tokens_per_s / 1e12);
  // lr of the next step (step 6) = schedule at batch 5: linear decay from 1 at batch 2 to 0 at batch 6.
  EXPECT_NEAR(value("lr-DecoupledAdamW/group0"), 0.01 * (1.0 - 3.0 / 4.0), 1e-12);
  EXPECT_GT(value("memory/rss_gb"), 0.01);
  EXPECT_GE(value("memory/peak_rss_gb"), value("memory/rss_gb"));
  EXPECT_EQ(value("time/remaining_estimate"), 0.0);    // at the end
  EXPECT_EQ(sink->last["loss/train/total"].first, 5);  // logged before the timestamp advanced past batch 5
}

// Whether every training forward's logits came out of a bf16 matrix product: then each value is representable in
// bf16 (as a bf16 tensor, or widened from one), which fp32 logits practically never all are.
class Bf16Logits : public Callback {
 public:
  std::string name() const override { return "Bf16Logits"; }
  void run_event(Event e, State& s, Logger& /*l*/) override {
    if (e != Event::kAfterForward) return;
    const at::Tensor o = s.outputs.detach();
    ++forwards;
    if (o.scalar_type() == at::kBFloat16 || at::equal(o.to(at::kBFloat16).to(o.scalar_type()), o)) ++bf16;
  }
  int forwards = 0, bf16 = 0;
};

TEST(Trainer, AmpBf16TrainsOnCpu) {
  auto logits = std::make_shared<Bf16Logits>();
  Trainer t(tiny_config({"max_duration=8ep", "eval_interval=0", "precision=amp_bf16"}),
            {.algorithms = {}, .callbacks = {logits}});
  const double before = t.eval().at("LanguageCrossEntropy");
  t.fit();
  const double after = t.eval().at("LanguageCrossEntropy");
  EXPECT_LT(after, before - 0.5);
  EXPECT_LT(after, std::log(64.0));
  for (const auto& p : t.state().model->parameters()) EXPECT_EQ(p.scalar_type(), at::kFloat);  // fp32 master weights
  // The forwards really ran in bf16 (not silently in fp32).
  ASSERT_GT(logits->forwards, 0);
  EXPECT_EQ(logits->bf16, logits->forwards);
}

TEST(Trainer, Fp32LogitsAreNotBf16) {  // the check above can tell the two apart
  auto logits = std::make_shared<Bf16Logits>();
  Trainer t(tiny_config({"max_duration=2ba", "eval_interval=0", "precision=fp32"}),
            {.algorithms = {}, .callbacks = {logits}});
  t.fit();
  ASSERT_GT(logits->forwards, 0);
  EXPECT_EQ(logits->bf16, 0);
}

// precision: auto follows the CPU: amp_bf16 where this CPU computes bf16 natively and faster than fp32, else fp32
// (TrainCli.OnACpuThatEmulatesBf16* checks the emulated side on every machine).
TEST(Trainer, AutoPrecisionFollowsTheCpusBf16) {
  auto logits = std::make_shared<Bf16Logits>();
  Trainer t(tiny_config({"max_duration=2ba", "eval_interval=0", "precision=auto", "device=cpu"}),
            {.algorithms = {}, .callbacks = {logits}});
  t.fit();
  const util::CpuBf16 cpu = util::probe_cpu_bf16();
  std::printf("this CPU: bf16 flag %d, %s\n", cpu.flag ? 1 : 0, cpu.rates().c_str());
  const bool bf16 = t.state().precision == core::Precision::kAmpBf16;
  EXPECT_TRUE(bf16 || t.state().precision == core::Precision::kFp32);
  if (!cpu.flag) {
    EXPECT_FALSE(bf16) << "no bf16 instructions: bf16 would be emulated";
  }
  // Far from the threshold (a quarter of fp32's rate) the measurement decides the same way each time.
  if (cpu.flag && cpu.bf16_flops > cpu.fp32_flops) {
    EXPECT_TRUE(bf16) << cpu.rates();
  }
  if (cpu.bf16_flops < cpu.fp32_flops / 10) {
    EXPECT_FALSE(bf16) << cpu.rates();
  }
  EXPECT_EQ(logits->bf16, bf16 ? logits->forwards : 0);
}

TEST(Trainer, AmpFp16WithLossScalingOnGpu) {
  if (util::device_info().cuda_devices == 0) GTEST_SKIP() << "no GPU: amp_fp16 runs only on CUDA";
  Trainer t(tiny_config({"max_duration=8ep", "eval_interval=0", "precision=amp_fp16"}));
  const double before = t.eval().at("LanguageCrossEntropy");
  t.fit();
  const double after = t.eval().at("LanguageCrossEntropy");
  EXPECT_LT(after, before - 0.5);
  EXPECT_LT(after, std::log(64.0));
}

// cuda_graphs' bookkeeping (trainer/step_graph.h), which needs no GPU: which batches warm up before a capture, and
// the static inputs a captured step reads, which every later batch is copied into (their memory never moves).
TEST(StepGraph, WarmsUpOnOneShapeThenCapturesItAndKeepsItsInputsInPlace) {
  using Mode = detail::StepGraph::Mode;
  auto batch = [](int64_t rows, int64_t first) {
    data::TokenBatch b;
    b.input_ids = at::arange(first, first + rows * 8, at::kLong).view({rows, 8});
    b.labels = b.input_ids.clone();
    b.samples = rows;
    return b;
  };
  detail::StepGraph g(at::kCPU, /*warmup_steps=*/2);
  EXPECT_EQ(g.mode_for(batch(4, 0), 2), Mode::kWarmup);
  EXPECT_EQ(g.mode_for(batch(4, 100), 2), Mode::kWarmup);
  // Another shape, or another microbatch size, starts the warmup over; so does the first shape coming back.
  EXPECT_EQ(g.mode_for(batch(3, 0), 2), Mode::kWarmup);
  EXPECT_EQ(g.mode_for(batch(4, 0), 1), Mode::kWarmup);
  EXPECT_EQ(g.mode_for(batch(4, 0), 2), Mode::kWarmup);
  EXPECT_EQ(g.mode_for(batch(4, 0), 2), Mode::kWarmup);
  EXPECT_EQ(g.mode_for(batch(4, 0), 2), Mode::kCapture);
  data::TokenBatch with_mask = batch(4, 0);
  with_mask.attention_mask = at::ones({4, 8}, at::kLong);
  EXPECT_EQ(g.mode_for(with_mask, 2), Mode::kWarmup);  // a mask is part of the shape
  data::TokenBatch shard = batch(4, 0);
  shard.targets = shard.labels;
  EXPECT_EQ(g.mode_for(shard, 2), Mode::kEager);  // a context-parallel shard is never captured

  const data::TokenBatch& first = g.load(batch(4, 0), 0.25);
  const void* ids = first.input_ids.data_ptr();
  const void* labels = first.labels.data_ptr();
  const data::TokenBatch& second = g.load(batch(4, 500), 1.0 / 3.0);
  EXPECT_EQ(second.input_ids.data_ptr(), ids);
  EXPECT_EQ(second.labels.data_ptr(), labels);
  EXPECT_TRUE(at::equal(second.input_ids, batch(4, 500).input_ids));
  EXPECT_TRUE(at::equal(second.labels, batch(4, 500).labels));
  EXPECT_FALSE(second.attention_mask.defined());
  // The scale the captured loss is multiplied by: the float an eager `loss * (1.0 / 3.0)` multiplies by.
  EXPECT_EQ(g.token_scale().scalar_type(), at::kFloat);
  EXPECT_EQ(g.token_scale().item<float>(), static_cast<float>(1.0 / 3.0));
  EXPECT_EQ(g.replays(), 0);
}

}  // namespace
}  // namespace tessera::trainer
