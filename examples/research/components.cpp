// The research components: a model, its HF model_type, a loss, a metric, a schedule, an algorithm and a callback, each
// registered by name when this code is loaded. research_lm links it; libresearch_lm_plugin.so is the same code as a
// plug-in, which Tessera's installed tools load with --plugin (docs/api.md#plug-ins). The model is a small transformer
// that is not MPT (parallel attention + MLP residual blocks, GPT-J style, with a weight-tied head), written in plain
// LibTorch against the model protocol (models::CausalLM); the loss is focal loss, the metric top-k accuracy; the
// schedule halves the rate every few batches; the algorithm (`token_dropout`) replaces a fraction of the input tokens
// at AFTER_DATALOADER; the callback (`kill_after`) kills rank 1 once to test recovery.
#include <fmt/format.h>
#include <signal.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "tessera/algorithms/options.h"
#include "tessera/callbacks/options.h"
#include "tessera/config/reader.h"
#include "tessera/core/callback.h"
#include "tessera/core/state.h"
#include "tessera/models/causal_lm.h"
#include "tessera/models/loss.h"
#include "tessera/models/metric.h"
#include "tessera/optim/scheduler.h"
#include "tessera/util/error.h"

using namespace tessera;

namespace {

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
  // x: (B, T, C) -> (B, T, C). `mask`: undefined (causal attention), or (B, 1, T, T) bool, true = may attend.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& mask = {}) {
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
    const at::Tensor h = ln(x);
    // (B, T, 3C) -> 3 x (B, H, T, C / H)
    auto parts = qkv(h).view({b, t, 3, heads_, c / heads_}).permute({2, 0, 3, 1, 4}).unbind(0);
    const at::Tensor y =
        at::scaled_dot_product_attention(parts[0], parts[1], parts[2],
                                         mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt, 0.0,
                                         /*is_causal=*/!mask.defined())
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

  // ids: (B, T) -> logits (B, T, V). Units: 0 = embeddings, final norm and the tied head; 1..L = the blocks. With a
  // padding mask (left-padded prompts: ICL evaluation, fine-tuning batches), positions count real tokens only and no
  // query attends to padding, so a padded sequence's logits are those of the sequence alone.
  at::Tensor forward(const at::Tensor& ids, const models::ForwardOptions& fo = {}) override {
    if (fo.cache || fo.sequence_id) {
      throw Error("parallel_block_lm", "packed sequences and KV caches are not implemented");
    }
    const int64_t t = ids.size(1);
    at::Tensor positions = at::arange(t, ids.options()).expand({ids.size(0), t});
    at::Tensor mask;
    if (fo.attention_mask) {
      const at::Tensor real = fo.attention_mask->to(at::kBool);
      positions = (real.to(at::kLong).cumsum(1) - 1).clamp_min(0);
      const at::Tensor causal = at::ones({t, t}, ids.options().dtype(at::kBool)).tril();
      // Causal, not onto padding keys; each query may see itself, so a padding row is never all masked (its output
      // is ignored).
      mask = (causal.unsqueeze(0) & real.unsqueeze(1)) | at::eye(t, ids.options().dtype(at::kBool)).unsqueeze(0);
      mask = mask.unsqueeze(1);
    }
    at::Tensor x = models::run_unit(
        runner_, 0, [this, positions](const at::Tensor& in) { return wte(in) + wpe(positions); }, ids);
    for (size_t i = 0; i < blocks->size(); ++i) {
      auto block = blocks[i]->as<ParallelBlockImpl>();
      x = models::run_unit(
          runner_, static_cast<int64_t>(i) + 1, [block, mask](const at::Tensor& h) { return block->forward(h, mask); },
          x);
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

  // Its own HF-format description: checkpoints store it, so that the tools and export_checkpoint_to_hf rebuild the
  // model through models::hf_model_type_registry() (registered below); parameter names are the folder's names.
  bool has_hf_format() const override { return true; }
  nlohmann::ordered_json hf_config(at::ScalarType dtype) const override {
    return {{"model_type", "parallel_block_lm"},
            {"d_model", o_.d_model},
            {"n_heads", o_.n_heads},
            {"n_layers", o_.n_layers},
            {"vocab_size", o_.vocab_size},
            {"max_seq_len", o_.max_seq_len},
            {"torch_dtype", models::hf_torch_dtype(dtype)}};
  }

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

// ---- the loss: focal loss ------------------------------------------------------------------------------------------

// Focal loss (Lin et al.) on next-token prediction: -(1 - p_y)^gamma * log p_y, summed over the loss tokens, as the
// trainer expects of every loss (models/loss.h).
class FocalLoss : public models::Loss {
 public:
  explicit FocalLoss(double gamma) : gamma_(gamma) {}
  at::Tensor sum(const at::Tensor& logits, const data::TokenBatch& batch) const override {
    const at::Tensor targets = models::next_token_targets(batch.labels);
    const at::Tensor keep = targets.ne(data::kIgnoreLabel).to(at::kFloat);
    const at::Tensor logp = at::log_softmax(logits.to(at::kFloat).reshape({-1, logits.size(2)}), -1)
                                .gather(1, targets.clamp_min(0).unsqueeze(1))
                                .squeeze(1);
    return (-(1 - logp.exp()).pow(gamma_) * logp * keep).sum();
  }

 private:
  double gamma_;
};

// ---- the metric: top-k accuracy ------------------------------------------------------------------------------------

// Whether the next token is among the k most likely, over the loss tokens; summed over ranks by the trainer.
class TopKAccuracy : public models::EvalMetric {
 public:
  explicit TopKAccuracy(int64_t k) : k_(k) {}
  std::string name() const override { return fmt::format("Top{}Accuracy", k_); }
  size_t num_sums() const override { return 2; }  // hits, counted
  void update(const at::Tensor& logits, const data::TokenBatch& batch, double* sums) const override {
    const at::Tensor targets = models::next_token_targets(batch.labels);
    const at::Tensor keep = targets.ne(data::kIgnoreLabel);
    const at::Tensor top = std::get<1>(logits.reshape({-1, logits.size(2)}).topk(k_, -1));
    const at::Tensor hit = top.eq(targets.unsqueeze(1)).any(1).logical_and(keep);
    sums[0] += static_cast<double>(hit.sum().item<int64_t>());
    sums[1] += static_cast<double>(keep.sum().item<int64_t>());
  }
  double compute(const double* sums) const override { return sums[1] > 0 ? sums[0] / sums[1] : 0.0; }

 private:
  int64_t k_;
};

// ---- the algorithm: token dropout --------------------------------------------------------------------------------

// Replaces each input token (not the label) with `replacement` with probability p, at AFTER_DATALOADER. The draws come
// from a generator seeded by (seed, batch, rank), so a resumed run replaces the same tokens as an uninterrupted one.
struct TokenDropoutOptions {
  double p = 0.1;
  int64_t replacement = 0;
  uint64_t seed = 7;
};

class TokenDropout : public core::Algorithm {
 public:
  explicit TokenDropout(TokenDropoutOptions o) : o_(o) {}
  std::string name() const override { return "TokenDropout"; }
  bool match(core::Event e, const core::State&) const override { return e == core::Event::kAfterDataloader; }
  void apply(core::Event, core::State& s, core::Logger& logger) override {
    const uint64_t seed = o_.seed ^ (static_cast<uint64_t>(s.timestamp.batch) << 16) ^ static_cast<uint64_t>(s.rank);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    const at::Tensor drop = at::empty(s.batch.input_ids.sizes(), at::kFloat).bernoulli_(o_.p, gen).to(at::kBool);
    s.batch.input_ids = s.batch.input_ids.masked_fill(drop.to(s.batch.input_ids.device()), o_.replacement);
    logger.log_metrics({{"token_dropout/replaced", static_cast<double>(drop.sum().item<int64_t>())}});
  }

 private:
  TokenDropoutOptions o_;
};

// ---- the callback: rank 1 kills itself once ------------------------------------------------------------------------

// On the job's first start, rank 1 kills itself (SIGKILL: no cleanup) after batch `after` (0: never); on a restart,
// rank 0 writes the batch training resumed from to `resumed_at`.
struct KillAfterOptions {
  int64_t after = 0;
  std::string resumed_at;
};

class KillAfter : public core::Callback {
 public:
  explicit KillAfter(KillAfterOptions o) : o_(std::move(o)) {}
  std::string name() const override { return "KillAfter"; }
  void run_event(core::Event e, core::State& s, core::Logger&) override {
    const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
    const bool first = restart == nullptr || std::string(restart) == "0";
    if (e == core::Event::kBatchCheckpoint && s.timestamp.batch == o_.after && s.rank == 1 && first) {
      std::cerr << fmt::format("rank 1: killing myself after batch {}\n", o_.after);
      raise(SIGKILL);
    }
    if (e == core::Event::kFitStart && s.rank == 0 && !first && !o_.resumed_at.empty()) {
      std::ofstream(o_.resumed_at) << s.timestamp.batch;
    }
  }

 private:
  KillAfterOptions o_;
};

// ---- registration: each component under the name research.yaml uses ------------------------------------------------

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
  models::hf_model_type_registry().add(
      "parallel_block_lm",
      [](const nlohmann::json& config, const std::string& where, const std::string& device,
         std::optional<uint64_t> seed) -> std::shared_ptr<models::CausalLM> {
        ParallelBlockLMOptions o;
        try {
          o.d_model = config.at("d_model").get<int64_t>();
          o.n_heads = config.at("n_heads").get<int64_t>();
          o.n_layers = config.at("n_layers").get<int64_t>();
          o.vocab_size = config.at("vocab_size").get<int64_t>();
          o.max_seq_len = config.at("max_seq_len").get<int64_t>();
        } catch (const nlohmann::json::exception& e) {
          throw Error("parallel_block_lm", fmt::format("{}: {}", where, e.what()));
        }
        auto model = std::make_shared<ParallelBlockLM>(o, device);
        if (seed) model->init_weights(*seed);
        return model;
      });
  models::loss_registry().add(
      "focal",
      [](config::Section& s) {
        const double gamma = s.get_double("gamma", 2.0);
        s.check(gamma >= 0, "gamma", "must be non-negative");
        s.finish();
        return models::LossOptions{"focal", gamma};
      },
      [](const models::LossOptions& o) -> std::shared_ptr<const models::Loss> {
        return std::make_shared<FocalLoss>(std::any_cast<double>(o.options));
      });
  models::metric_registry().add(
      "top_k_accuracy",
      [](config::Section& s) -> std::any {
        const int64_t k = s.get_int("k", 5);
        s.check(k > 0, "k", "must be positive");
        s.finish();
        return k;
      },
      [](const std::any& k) -> std::shared_ptr<const models::EvalMetric> {
        return std::make_shared<TopKAccuracy>(std::any_cast<int64_t>(k));
      });
  algorithms::algorithm_registry().add(
      "token_dropout",
      [](config::Section& s) -> std::any {
        TokenDropoutOptions o;
        o.p = s.get_double("p", o.p);
        s.check(o.p >= 0 && o.p < 1, "p", "must be in [0, 1)");
        o.replacement = s.get_int("replacement", o.replacement);
        o.seed = static_cast<uint64_t>(s.get_int("seed", static_cast<int64_t>(o.seed)));
        s.finish();
        return o;
      },
      core::construct<core::Algorithm, TokenDropout, TokenDropoutOptions>());
  callbacks::callback_registry().add(
      "kill_after",
      [](config::Section& s) -> std::any {
        KillAfterOptions o;
        o.after = s.get_int("after", o.after);
        o.resumed_at = s.get_string("resumed_at", o.resumed_at);
        s.finish();
        return o;
      },
      core::construct<core::Callback, KillAfter, KillAfterOptions>());
}

// Registered when the program starts or the plug-in is loaded (its static initialisers run then).
[[maybe_unused]] const bool kRegistered = (register_components(), true);

}  // namespace
