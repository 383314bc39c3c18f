// The research components: a model, its HF model_type, a data loader, a loss, a metric, a schedule, an algorithm and a
// callback, each registered by name when this code is loaded. research_lm links it; libresearch_lm_plugin.so is the
// same code as a plug-in, which Tessera's installed tools load with --plugin (docs/api.md#plug-ins). The model is a
// small transformer that is not MPT (parallel attention + MLP residual blocks, GPT-J style, with a weight-tied head),
// written against the model protocol (models::CausalLM) from Tessera's shared blocks (models/layers.h), so it builds on
// `meta`; the loader (`copy_task`) makes a synthetic copying task on the fly, with its own sample order and resumable
// position; the loss is focal loss, the metric top-k accuracy; the schedule halves the rate every few batches; the
// algorithm (`token_dropout`) replaces a fraction of the input tokens at AFTER_DATALOADER; the callback (`kill_after`)
// kills rank 1 once to test recovery.
#include <fmt/format.h>
#include <signal.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/container/modulelist.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "tessera/algorithms/options.h"
#include "tessera/callbacks/options.h"
#include "tessera/config/reader.h"
#include "tessera/core/callback.h"
#include "tessera/core/state.h"
#include "tessera/data/data_loader.h"
#include "tessera/models/blocks/attention.h"
#include "tessera/models/blocks/layers.h"
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

// x + proj(attention(ln(x))) + fc_out(gelu(fc_in(ln(x)))): attention and MLP read the same normalised input. Built
// from Tessera's shared blocks (models/layers.h), which create their parameters with the given TensorOptions, so the
// model can be built on `meta` (shapes only) and materialised unit by unit by the sharding engine.
class ParallelBlockImpl : public torch::nn::Module {
 public:
  ParallelBlockImpl(const ParallelBlockLMOptions& o, const at::TensorOptions& t) : heads_(o.n_heads) {
    ln = register_module("ln", models::Norm(o.d_model, models::NormType::kLayerNorm, 1e-5, true, t));
    qkv = register_module("qkv", models::Linear(o.d_model, 3 * o.d_model, true, t));
    proj = register_module("proj", models::Linear(o.d_model, o.d_model, true, t));
    fc_in = register_module("fc_in", models::Linear(o.d_model, 4 * o.d_model, true, t));
    fc_out = register_module("fc_out", models::Linear(4 * o.d_model, o.d_model, true, t));
  }
  // x: (B, T, C) -> (B, T, C). `mask`: undefined (causal attention), or (B, 1, T, past + T) bool, true = may attend.
  // With `cache`, this chunk's keys and values are appended to it and attention covers the cached ones too.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& mask, models::LayerCache* cache) {
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
    const at::Tensor h = ln(x);
    // (B, T, 3C) -> 3 x (B, H, T, C / H)
    auto parts = qkv(h).view({b, t, 3, heads_, c / heads_}).permute({2, 0, 3, 1, 4}).unbind(0);
    at::Tensor k = parts[1], v = parts[2];
    models::append_to_cache(cache, k, v);
    const at::Tensor y = at::scaled_dot_product_attention(
                             parts[0], k, v, mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt, 0.0,
                             /*is_causal=*/!mask.defined())
                             .transpose(1, 2)
                             .reshape({b, t, c});
    return x + proj(y) + fc_out(at::gelu(fc_in(h)));
  }

  models::Norm ln{nullptr};
  models::Linear qkv{nullptr}, proj{nullptr}, fc_in{nullptr}, fc_out{nullptr};

 private:
  int64_t heads_;
};
TORCH_MODULE(ParallelBlock);

class ParallelBlockLM : public models::CausalLM {
 public:
  ParallelBlockLM(const ParallelBlockLMOptions& o, const std::string& device) : o_(o) {
    const at::TensorOptions t = at::TensorOptions().dtype(at::kFloat).device(at::Device(device));
    wte = register_module("wte", models::Embedding(o.vocab_size, o.d_model, t));
    wpe = register_module("wpe", models::Embedding(o.max_seq_len, o.d_model, t));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < o.n_layers; ++i) blocks->push_back(ParallelBlock(o, t));
    ln_f = register_module("ln_f", models::Norm(o.d_model, models::NormType::kLayerNorm, 1e-5, true, t));
  }

  // ids: (B, T) -> logits (B, T, V). Units: 0 = embeddings, final norm and the tied head; 1..L = the blocks. With a
  // padding mask (left-padded prompts: ICL evaluation, fine-tuning batches), positions count real tokens only and no
  // query attends to padding, so a padded sequence's logits are those of the sequence alone. With a KV cache
  // (generation), each call adds its chunk's keys and values and attends over everything cached. The masks and
  // positions come from Tessera's shared attention helpers (models/attention.h).
  at::Tensor forward(const at::Tensor& ids, const models::ForwardOptions& fo = {}) override {
    if (fo.sequence_id) throw Error("parallel_block_lm", "packed sequences are not implemented");
    models::KVCache* cache = fo.cache;
    const int64_t t = ids.size(1), past = cache ? cache->length : 0;
    const at::Tensor key_mask = models::key_padding_mask(ids, fo);  // (B, past + t), or undefined: no padding
    const at::Tensor positions = models::positions_after_padding(key_mask, past, t, ids.options());
    at::Tensor mask;
    if (key_mask.defined() || past > 0) {
      const auto lopts = ids.options().dtype(at::kLong);
      const at::Tensor qpos = at::arange(past, past + t, lopts).unsqueeze(1), kpos = at::arange(past + t, lopts);
      // Causal, not onto padding keys; each query may see itself, so a padding row is never all masked (its output
      // is ignored).
      mask = (kpos <= qpos).unsqueeze(0);  // (1, t, past + t)
      if (key_mask.defined()) mask = mask & key_mask.unsqueeze(1);
      mask = (mask | (kpos == qpos).unsqueeze(0)).unsqueeze(1);
    }
    if (cache && cache->layers.empty()) cache->layers.resize(blocks->size());
    at::Tensor x = models::run_unit(
        runner_, 0, [this, positions](const at::Tensor& in) { return wte(in) + wpe(positions); }, ids);
    for (size_t i = 0; i < blocks->size(); ++i) {
      auto block = blocks[i]->as<ParallelBlockImpl>();
      models::LayerCache* layer_cache = cache ? &cache->layers[i] : nullptr;
      x = models::run_unit(
          runner_, static_cast<int64_t>(i) + 1,
          [block, mask, layer_cache](const at::Tensor& h) { return block->forward(h, mask, layer_cache); }, x);
    }
    if (cache) {
      cache->length = past + t;
      if (key_mask.defined()) cache->attention_mask = key_mask;
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
  // initialising one unit at a time (a sharded build from `meta`) gives the values of a whole-model init.
  void init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select = nullptr) override {
    at::NoGradGuard no_grad;
    for (const auto& item : named_modules()) {
      if (select && !select(item.key())) continue;
      at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(models::module_seed(seed, item.key()));
      if (auto* norm = item.value()->as<models::NormImpl>()) {
        norm->weight.fill_(1.0);
        norm->bias.zero_();
      } else if (auto* lin = item.value()->as<models::LinearImpl>()) {
        models::normal_from(lin->weight, 0.0, 0.02, gen);
        lin->bias.zero_();
      } else if (auto* emb = item.value()->as<models::EmbeddingImpl>()) {
        models::normal_from(emb->weight, 0.0, 0.02, gen);
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

  models::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  models::Norm ln_f{nullptr};

 private:
  ParallelBlockLMOptions o_;
  std::shared_ptr<models::UnitRunner> runner_;
};

// ---- the data loader: a synthetic copying task ----------------------------------------------------------------------

// Sample i of epoch e: `length` tokens, a random first half in [1, vocab) and its copy as the second half, drawn from
// a generator seeded by (seed, e, i), so every rank, epoch and restart sees the same samples. Rank r of W takes
// samples r, r + W, ... of the epoch's shuffled order, in batches of the device batch size (a short last batch is
// dropped). The loss is on the copy only (labels: kIgnoreLabel on the first half), so what it learns is to copy.
struct CopyTaskOptions {
  int64_t samples = 512;  // per epoch
  int64_t length = 64;
  int64_t vocab = 128;
  uint64_t seed = 5;
};

class CopyTaskLoader : public data::DataLoader {
 public:
  CopyTaskLoader(CopyTaskOptions o, const data::LoaderContext& ctx) : o_(o), ctx_(ctx) {
    batches_ = o_.samples / (ctx.world_size * ctx.device_batch_size);
    if (batches_ == 0) {
      throw Error("copy_task", fmt::format("{}: {} samples make no batch of {} on each of {} ranks", ctx.split,
                                           o_.samples, ctx.device_batch_size, ctx.world_size));
    }
  }

  std::optional<int64_t> batches_per_epoch() const override { return batches_; }

  std::unique_ptr<data::BatchIterator> open(const config::Timestamp& at) override {
    return std::make_unique<Epoch>(*this, at.epoch, at.batch_in_epoch);
  }

  nlohmann::json state(const config::Timestamp& at) const override {
    return {{"copy_task", {{"epoch", at.epoch}, {"batch_in_epoch", at.batch_in_epoch}}}};
  }
  void load_state(const nlohmann::json& state, const config::Timestamp& at, const std::string& where) override {
    if (!state.contains("copy_task") || state["copy_task"].value("epoch", -1) != at.epoch ||
        state["copy_task"].value("batch_in_epoch", -1) != at.batch_in_epoch) {
      throw Error("copy_task", fmt::format("{}: the checkpoint's loader state {} is not copy_task's at epoch {}, "
                                           "batch {}",
                                           where, state.dump(), at.epoch, at.batch_in_epoch));
    }
  }

 private:
  class Epoch : public data::BatchIterator {
   public:
    Epoch(const CopyTaskLoader& l, int64_t epoch, int64_t batch) : l_(l), epoch_(epoch), batch_(batch) {
      at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(l.o_.seed * 1000003 + static_cast<uint64_t>(epoch));
      order_ = at::randperm(l.o_.samples, gen, at::kLong);
    }
    std::optional<data::TokenBatch> next() override {
      if (batch_ >= l_.batches_) return std::nullopt;
      const int64_t b = l_.ctx_.device_batch_size, w = l_.ctx_.world_size, half = l_.o_.length / 2;
      std::vector<at::Tensor> rows;
      for (int64_t j = 0; j < b; ++j) {
        const int64_t i = order_[(batch_ * b + j) * w + l_.ctx_.rank].item<int64_t>();
        at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(
            l_.o_.seed ^ (static_cast<uint64_t>(epoch_) << 32) ^ static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull);
        const at::Tensor first = at::randint(1, l_.o_.vocab, {half}, gen, at::kLong);
        rows.push_back(at::cat({first, first}));
      }
      ++batch_;
      data::TokenBatch out;
      out.input_ids = at::stack(rows);
      out.labels = out.input_ids.clone();
      out.labels.narrow(1, 0, half).fill_(data::kIgnoreLabel);
      out.samples = b;
      return out;
    }

   private:
    const CopyTaskLoader& l_;
    int64_t epoch_, batch_;
    at::Tensor order_;
  };

  CopyTaskOptions o_;
  data::LoaderContext ctx_;
  int64_t batches_ = 0;
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
  // A checkpoint folder whose save must be complete (its metadata.json written) before the kill: checkpoints are
  // written in the background, and a kill while one is in flight abandons it (the restart then resumes from the one
  // before), which on a loaded machine would make the resume point a matter of timing.
  std::string wait_for;
};

class KillAfter : public core::Callback {
 public:
  explicit KillAfter(KillAfterOptions o) : o_(std::move(o)) {}
  std::string name() const override { return "KillAfter"; }
  void run_event(core::Event e, core::State& s, core::Logger&) override {
    const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
    const bool first = restart == nullptr || std::string(restart) == "0";
    if (e == core::Event::kBatchCheckpoint && s.timestamp.batch == o_.after && s.rank == 1 && first) {
      if (!o_.wait_for.empty()) {
        // Up to 10 minutes (a hung save fails the test at the resume point, not here).
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(10);
        while (!std::filesystem::exists(std::filesystem::path(o_.wait_for) / "metadata.json") &&
               std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      }
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
        const std::string init_device = s.get_choice("init_device", "cpu", {"cpu", "meta", "cuda"});
        s.finish();
        return models::ModelOptions{"parallel_block_lm", o, o.max_seq_len, init_device, {}};
      },
      [](const models::ModelOptions& m, const std::string& device, uint64_t seed) -> std::shared_ptr<models::CausalLM> {
        auto model = std::make_shared<ParallelBlockLM>(std::any_cast<const ParallelBlockLMOptions&>(m.options), device);
        if (device != "meta") model->init_weights(seed);
        return model;
      });
  data::loader_registry().add(
      "copy_task",
      [](config::Section& s) {
        data::LoaderOptions o;
        o.name = "copy_task";
        CopyTaskOptions c;
        c.samples = s.get_int("samples", c.samples);
        c.length = s.get_int("length", c.length);
        c.vocab = s.get_int("vocab", c.vocab);
        c.seed = static_cast<uint64_t>(s.get_int("seed", static_cast<int64_t>(c.seed)));
        s.check(c.length >= 2 && c.length % 2 == 0, "length", "must be even and at least 2");
        s.check(c.vocab >= 2, "vocab", "must be at least 2");
        o.tokens.max_seq_len = c.length;  // what the trainer checks against the model's context
        o.extra = c;
        s.finish();
        return o;
      },
      [](const data::LoaderOptions& o, const data::LoaderContext& ctx) -> std::unique_ptr<data::DataLoader> {
        return std::make_unique<CopyTaskLoader>(std::any_cast<const CopyTaskOptions&>(o.extra), ctx);
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
        o.wait_for = s.get_string("wait_for", o.wait_for);
        s.finish();
        return o;
      },
      core::construct<core::Callback, KillAfter, KillAfterOptions>());
}

// Registered when the program starts or the plug-in is loaded (its static initialisers run then).
[[maybe_unused]] const bool kRegistered = (register_components(), true);

}  // namespace
