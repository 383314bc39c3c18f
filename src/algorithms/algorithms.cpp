// Built-in algorithms.
#include "tessera/algorithms/algorithms.h"

#include "tessera/distributed/fsdp.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <map>
#include <numeric>

#include "tessera/checkpoint/safetensors.h"
#include "tessera/core/state.h"
#include "tessera/models/blocks/layers.h"
#include "tessera/models/capabilities.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"

namespace tessera::algorithms {
namespace {

// Sums of squares of `x`, a parameter's elements laid out from offset `lead` inside `rows` rows of `row_len`, per row.
at::Tensor row_squares(const at::Tensor& x, int64_t lead, int64_t rows, int64_t row_len) {
  const at::Tensor xf = x.to(at::kFloat);
  if (lead == 0 && x.numel() == rows * row_len) return xf.view({rows, row_len}).square().sum(1);
  at::Tensor padded = at::zeros({rows * row_len}, xf.options());
  padded.narrow(0, lead, x.numel()).copy_(xf);
  return padded.view({rows, row_len}).square().sum(1);
}

// Rows of a parameter for adaptive clipping: the whole tensor for 0-d/1-d, else one per index of the first dimension
// (the norm over the remaining dimensions, as Composer's AGC takes it).
int64_t agc_rows(const std::vector<int64_t>& shape) {
  return shape.size() <= 1 ? 1 : shape[0];
}

// Adaptive gradient clipping over the ranges of each parameter this rank holds (whole parameters in one process,
// pieces of flat shards with sharding): per-row sums of squares of gradient and weight over this rank's ranges, one
// sum over the shard group, then each held element's gradient scaled by its row's min(1, threshold * |w| / |g|).
void adaptive_clip(core::State& state, double threshold) {
  // Row offsets of every parameter in one vector, in the model's order (the same on every rank).
  std::map<std::string, int64_t> base;
  int64_t total_rows = 0;
  for (const auto& [name, shape] : state.parallel->parameter_shapes()) {  // whole shapes, also of split parameters
    base[name] = total_rows;
    total_rows += agc_rows(shape);
  }
  struct Piece {
    at::Tensor grad, param;  // flat views of this range
    int64_t row = 0;         // global index of the first row it touches
    int64_t rows = 1;        // rows it touches
    int64_t lead = 0;        // its first element's position inside the first row
    int64_t row_len = 1;
  };
  std::vector<Piece> pieces;
  for (const core::HeldTensor& h : state.held_layout()) {
    if (!h.tensor.grad().defined()) continue;
    const at::Tensor g = h.tensor.mutable_grad().view({-1});
    const at::Tensor w = h.tensor.detach().view({-1});
    for (const dist::ShardSpan& sp : h.spans) {
      int64_t numel = 1;
      for (int64_t d : sp.shape) numel *= d;
      if (sp.numel == 0 || numel == 0) continue;
      // A column window (a tensor-parallel slice of a matrix's columns) holds part of each of its rows.
      const int64_t row_len = sp.cols > 0 ? sp.cols : numel / agc_rows(sp.shape);
      const int64_t first = sp.start / row_len;
      pieces.push_back({g.narrow(0, sp.offset, sp.numel), w.narrow(0, sp.offset, sp.numel), base.at(sp.name) + first,
                        (sp.start + sp.numel - 1) / row_len - first + 1, sp.start - first * row_len, row_len});
    }
  }
  if (pieces.empty()) return;
  const at::TensorOptions opts = at::TensorOptions().dtype(at::kFloat).device(pieces[0].grad.device());
  at::Tensor sums = at::zeros({2, total_rows}, opts);  // [gradient; weight] squares per row
  for (const Piece& p : pieces) {
    sums[0].narrow(0, p.row, p.rows).add_(row_squares(p.grad, p.lead, p.rows, p.row_len));
    sums[1].narrow(0, p.row, p.rows).add_(row_squares(p.param, p.lead, p.rows, p.row_len));
  }
  sums = state.sum_over_shards(sums.reshape({-1})).view({2, total_rows}).sqrt();
  const at::Tensor coef = at::clamp_max(at::nan_to_num(sums[1] * threshold / sums[0], 1.0), 1.0);
  for (Piece& p : pieces) {
    const at::Tensor c = coef.narrow(0, p.row, p.rows).to(p.grad.scalar_type());
    if (p.lead == 0 && p.grad.numel() == p.rows * p.row_len) {
      p.grad.view({p.rows, p.row_len}).mul_(c.unsqueeze(1));
    } else {
      p.grad.mul_(c.repeat_interleave(p.row_len).narrow(0, p.lead, p.grad.numel()));
    }
  }
}

}  // namespace

bool GradientClipping::match(core::Event event, const core::State& /*state*/) const {
  return event == core::Event::kAfterTrainBatch;
}

void GradientClipping::apply(core::Event /*event*/, core::State& state, core::Logger& /*logger*/) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> params;
  for (const at::Tensor& p : state.trainable_parameters()) {
    if (p.grad().defined()) params.push_back(p);
  }
  if (params.empty()) return;
  const double thr = o_.clipping_threshold;
  if (o_.clipping_type == "norm") {
    // Multi-tensor kernels (torch's clip_grad_norm_ with foreach): one launch for every gradient of a dtype, and
    // no host synchronisation (the coefficient stays on the device).
    std::map<at::ScalarType, std::vector<at::Tensor>> grads;
    for (const at::Tensor& p : params) grads[p.grad().scalar_type()].push_back(p.grad());
    std::vector<at::Tensor> norms;
    for (const auto& [dtype, g] : grads) {
      for (const at::Tensor& n : at::_foreach_norm(g, 2, at::kFloat)) norms.push_back(n);
    }
    // With sharded gradients each rank holds a part: the global norm sums the squares over the shard group.
    const at::Tensor local_sq = at::stack(norms).square().sum().reshape({1});
    const at::Tensor total = state.sum_over_shards(local_sq).sqrt().squeeze();
    last_norm_ = total;
    const at::Tensor coef = at::clamp_max(thr / (total + 1e-6), 1.0);
    for (auto& [dtype, g] : grads) at::_foreach_mul_(g, coef.to(dtype));
  } else if (o_.clipping_type == "value") {
    for (at::Tensor& p : params) p.mutable_grad().clamp_(-thr, thr);
  } else {  // adaptive
    adaptive_clip(state, thr);
  }
}

// ---- alibi ----

namespace {

void truncate_batch(core::State& s, int64_t length) {
  if (length >= s.batch.input_ids.size(1)) return;
  s.batch.input_ids = s.batch.input_ids.slice(1, 0, length);
  s.batch.labels = s.batch.labels.slice(1, 0, length);
}

bool ends_with_component(const std::string& name, const std::string& suffix) {
  return name == suffix ||
         (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
          name[name.size() - suffix.size() - 1] == '.');
}

}  // namespace

bool Alibi::match(core::Event e, const core::State& /*s*/) const {
  return e == core::Event::kInit || (e == core::Event::kAfterDataloader && o_.train_sequence_length_scaling < 1);
}

void Alibi::apply(core::Event e, core::State& s, core::Logger& /*logger*/) {
  if (e == core::Event::kAfterDataloader) {
    truncate_batch(
        s, static_cast<int64_t>(static_cast<double>(s.batch.input_ids.size(1)) * o_.train_sequence_length_scaling));
    return;
  }
  const auto* surgery = models::capability<models::AlibiSurgery>(*s.model);
  if (surgery == nullptr) {
    throw ConfigError("algorithms",
                      fmt::format("alibi: model family \"{}\" does not support ALiBi surgery", s.model->family()));
  }
  s.model = surgery->with_alibi(o_.alibi_bias_max, o_.max_sequence_length.value_or(s.model->max_seq_len()),
                                static_cast<uint64_t>(s.seed));
}

// ---- lora ----

std::vector<std::string> attach_lora(models::CausalLM& model, const LoraOptions& o, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<std::string> adapted;
  at::NoGradGuard no_grad;
  for (const auto& item : model.named_modules()) {
    auto linear = std::dynamic_pointer_cast<models::LinearImpl>(item.value());
    if (!linear) continue;
    const bool wanted = std::any_of(o.target_modules.begin(), o.target_modules.end(),
                                    [&](const std::string& t) { return ends_with_component(item.key(), t); });
    if (!wanted || linear->lora_A.defined()) continue;
    if (linear->weight.is_meta()) {
      throw ConfigError("algorithms",
                        "lora: the model is on meta (model.init_device: meta with more than one rank is "
                        "built one unit at a time after INIT, where the adapters are attached); use "
                        "model.init_device: cpu with lora");
    }
    const at::TensorOptions opts = linear->weight.options().dtype(at::kFloat);
    const double bound = 1.0 / std::sqrt(static_cast<double>(linear->in_features));
    at::Tensor a = at::empty({o.r, linear->in_features}, opts.device(at::kCPU)).uniform_(-bound, bound, gen);
    linear->attach_lora(a.to(opts.device()), at::zeros({linear->out_features, o.r}, opts),
                        o.lora_alpha / static_cast<double>(o.r), o.lora_dropout);
    adapted.push_back(item.key());
  }
  if (adapted.empty()) {
    throw ConfigError("algorithms", fmt::format("lora: no Linear module matches target_modules [{}]",
                                                fmt::join(o.target_modules, ", ")));
  }
  for (auto& p : model.named_parameters()) {
    const bool adapter = p.key().find(".lora_A") != std::string::npos || p.key().find(".lora_B") != std::string::npos;
    p.value().set_requires_grad(adapter);
  }
  return adapted;
}

void merge_lora(models::CausalLM& model) {
  at::NoGradGuard no_grad;
  for (const auto& item : model.named_modules()) {
    auto linear = std::dynamic_pointer_cast<models::LinearImpl>(item.value());
    if (!linear || !linear->lora_A.defined()) continue;
    linear->weight.add_((at::matmul(linear->lora_B, linear->lora_A) * linear->lora_scale).to(linear->weight.dtype()));
    linear->detach_lora();
  }
}

void save_lora_adapters(const std::vector<std::pair<std::string, at::Tensor>>& weights, const LoraOptions& o,
                        const std::string& dir) {
  std::map<std::string, at::Tensor> tensors;
  for (const auto& [k, w] : weights) {
    for (const char* which : {"lora_A", "lora_B"}) {
      const std::string suffix = std::string(".") + which;
      if (k.size() > suffix.size() && k.compare(k.size() - suffix.size(), suffix.size(), suffix) == 0) {
        tensors["base_model.model." + k + ".weight"] = w.detach().to(at::kCPU);
      }
    }
  }
  std::filesystem::create_directories(dir);
  checkpoint::save_safetensors(dir + "/adapter_model.safetensors", tensors, {{"format", "pt"}});
  const nlohmann::ordered_json config = {{"peft_type", "LORA"},
                                         {"task_type", "CAUSAL_LM"},
                                         {"r", o.r},
                                         {"lora_alpha", o.lora_alpha},
                                         {"lora_dropout", o.lora_dropout},
                                         {"target_modules", o.target_modules},
                                         {"bias", "none"},
                                         {"fan_in_fan_out", false}};
  util::write_file_atomically(dir + "/adapter_config.json", config.dump(2) + "\n", "lora");
}

bool Lora::match(core::Event e, const core::State& s) const {
  return e == core::Event::kInit || (e == core::Event::kFitEnd && o_.save_path && !s.preempted());
}

void Lora::apply(core::Event e, core::State& s, core::Logger& /*logger*/) {
  if (e == core::Event::kFitEnd) {
    const auto weights = s.parallel->full_state_dict();  // collective: every rank
    if (s.rank == 0) save_lora_adapters(weights, o_, *o_.save_path);
    return;
  }
  const auto adapted = attach_lora(*s.model, o_, static_cast<uint64_t>(s.seed) + 1);
  spdlog::info("lora: adapters (r={}) on {} modules; {} trainable parameters", o_.r, adapted.size(), [&] {
    int64_t n = 0;
    for (const auto& p : s.model->parameters()) n += p.requires_grad() ? p.numel() : 0;
    return n;
  }());
}

// ---- ema ----

Ema::Ema(EmaOptions o) : o_(std::move(o)) {
  const double interval = o_.update_interval ? o_.update_interval->value() : 1.0;
  smoothing_ = o_.smoothing ? *o_.smoothing : std::pow(2.0, -interval / o_.half_life.value());
}

bool Ema::match(core::Event e, const core::State& /*s*/) const {
  using core::Event;
  return e == Event::kFitStart || e == Event::kBatchEnd || e == Event::kEpochEnd || e == Event::kEvalStart ||
         e == Event::kEvalEnd;
}

void Ema::swap(core::State& s) {
  at::NoGradGuard no_grad;
  const auto params = s.held_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor tmp = params[i].detach().clone();
    params[i].detach().copy_(ema_[i]);
    ema_[i].copy_(tmp);
  }
  swapped_ = !swapped_;
}

std::optional<core::ComponentState> Ema::state_dict(const core::State& /*state*/) const {
  if (ema_.empty()) return std::nullopt;
  // Saved while swapped in (a checkpoint during evaluation): ema_ holds the training weights then.
  if (swapped_) throw Error("ema", "cannot checkpoint during evaluation (the averaged weights are swapped in)");
  return core::ComponentState{nlohmann::json::object(), ema_};
}

void Ema::load_state_dict(const core::ComponentState& saved, core::State& /*state*/) {
  ema_.clear();
  for (const at::Tensor& t : saved.per_parameter) ema_.push_back(t.clone());
}

void Ema::apply(core::Event e, core::State& s, core::Logger& /*logger*/) {
  using core::Event;
  const config::Time& start = o_.ema_start;
  const bool started =
      start.unit() == config::TimeUnit::kDuration
          ? !s.timestamp.before(config::Time(std::trunc(start.value() * s.max_duration.value()), s.max_duration.unit()))
          : !s.timestamp.before(start);
  if (e == Event::kFitStart) {
    if (ema_.empty()) {
      // The held tensors: whole parameters, or flat shards (EMA is elementwise, so averaging them averages the model).
      for (const auto& p : s.held_parameters()) ema_.push_back(p.detach().clone());
    }
    return;
  }
  if (e == Event::kEvalStart) {
    if (started && !ema_.empty() && !swapped_) swap(s);
    return;
  }
  if (e == Event::kEvalEnd) {
    if (swapped_) swap(s);
    return;
  }
  const config::TimeUnit unit = o_.update_interval ? o_.update_interval->unit() : o_.half_life.unit();
  const int64_t every = o_.update_interval ? std::max<int64_t>(1, o_.update_interval->count()) : 1;
  const bool due = (e == Event::kBatchEnd && unit == config::TimeUnit::kBatch && s.timestamp.batch % every == 0) ||
                   (e == Event::kEpochEnd && unit == config::TimeUnit::kEpoch && s.timestamp.epoch % every == 0);
  if (!due || !started || ema_.empty()) return;
  at::NoGradGuard no_grad;
  const auto params = s.held_parameters();
  for (size_t i = 0; i < params.size(); ++i) ema_[i].mul_(smoothing_).add_(params[i].detach(), 1.0 - smoothing_);
}

// ---- low_precision_layernorm ----

bool LowPrecisionLayerNorm::match(core::Event e, const core::State& /*s*/) const {
  return e == core::Event::kInit;
}

void LowPrecisionLayerNorm::apply(core::Event /*e*/, core::State& s, core::Logger& /*logger*/) {
  models::use_low_precision_norms(*s.model);
}

// ---- seq_length_warmup ----

bool SeqLengthWarmup::match(core::Event e, const core::State& /*s*/) const {
  return e == core::Event::kAfterDataloader;
}

int64_t SeqLengthWarmup::length_at(int64_t batch, int64_t total_batches) const {
  const auto warmup = static_cast<int64_t>(static_cast<double>(total_batches) * o_.duration);
  if (batch >= warmup) return o_.max_seq_length;
  const int64_t updates = std::max<int64_t>(1, (o_.max_seq_length - o_.min_seq_length) / o_.step_size);
  const int64_t every = std::max<int64_t>(1, warmup / updates);
  const int64_t len = o_.step_size * (batch / every) + o_.min_seq_length;
  return std::clamp(len, o_.min_seq_length, o_.max_seq_length);
}

void SeqLengthWarmup::apply(core::Event /*e*/, core::State& s, core::Logger& /*logger*/) {
  int64_t total = 0;
  switch (s.max_duration.unit()) {
    case config::TimeUnit::kBatch:
      total = s.max_duration.count();
      break;
    case config::TimeUnit::kEpoch:
      total = s.max_duration.count() * s.dataloader_len.value_or(0);
      break;
    default:
      throw ConfigError("algorithms", "seq_length_warmup: max_duration must be in ep or ba");
  }
  truncate_batch(s, length_at(s.timestamp.batch, total));
}

bool LossSpikeDetection::match(core::Event e, const core::State& /*s*/) const {
  return e == core::Event::kAfterTrainBatch;
}

void LossSpikeDetection::apply(core::Event /*e*/, core::State& s, core::Logger& logger) {
  const double loss = s.train_loss;  // the mean over every rank's batch: all ranks decide alike
  const bool finite = std::isfinite(loss);
  double mean = 0;
  for (double l : window_) mean += l;
  if (!window_.empty()) mean /= static_cast<double>(window_.size());
  const bool spike =
      !finite || (static_cast<int64_t>(window_.size()) >= o_.min_history && loss > o_.outlier_multiplier * mean);
  if (!spike) {
    consecutive_ = 0;
    window_.push_back(loss);
    if (static_cast<int64_t>(window_.size()) > o_.window_size) window_.pop_front();
    return;
  }
  ++consecutive_;
  logger.log_metrics({{"loss_spike/detected", 1.0}});
  const int64_t batch = s.timestamp.batch + 1;
  if (finite && consecutive_ < o_.patience) {
    spdlog::warn("batch {}: loss {:.4f} is above {} x the recent mean {:.4f} ({} of {} before acting)", batch, loss,
                 o_.outlier_multiplier, mean, consecutive_, o_.patience);
    return;
  }
  const std::string what =
      finite ? fmt::format("loss {:.4f} is above {} x the recent mean {:.4f}", loss, o_.outlier_multiplier, mean)
             : fmt::format("loss is {}", loss);
  consecutive_ = 0;
  s.skip_optimizer_step = true;
  if (o_.response == "rollback") {
    s.rollback_requested = true;
    spdlog::warn("batch {}: {}: skipping the step and rolling back to the newest checkpoint", batch, what);
  } else if (o_.response == "stop") {
    s.stop_training();
    spdlog::error("batch {}: {}: skipping the step and stopping training", batch, what);
  } else {
    spdlog::warn("batch {}: {}: skipping the step", batch, what);
  }
}

std::optional<core::ComponentState> LossSpikeDetection::state_dict(const core::State& /*s*/) const {
  core::ComponentState st;
  st.values = {{"window", std::vector<double>(window_.begin(), window_.end())}, {"consecutive", consecutive_}};
  return st;
}

void LossSpikeDetection::load_state_dict(const core::ComponentState& saved, core::State& /*s*/) {
  const auto w = saved.values.at("window").get<std::vector<double>>();
  window_.assign(w.begin(), w.end());
  consecutive_ = saved.values.value("consecutive", int64_t{0});
}

}  // namespace tessera::algorithms
