// Built-in callbacks: speed/MFU, learning rate, memory, runtime estimates, optimizer norms and early stopping.
#include "tessera/callbacks/callbacks.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "tessera/checkpoint/hf.h"
#include "tessera/core/model_registry.h"
#include "tessera/core/state.h"
#include "tessera/distributed/communicator.h"
#include "tessera/distributed/fsdp.h"
#include "tessera/models/blocks/layers.h"
#include "tessera/storage/storage.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"
#include "tessera/util/hf_hub.h"
#include "tessera/util/peak_flops.h"

// The CUDA caching allocator's statistics, when LibTorch was built with CUDA (the pinned wheel is).
#if __has_include(<c10/cuda/CUDACachingAllocator.h>)
#include <c10/cuda/CUDACachingAllocator.h>
#define TESSERA_WITH_CUDA_ALLOCATOR_STATS 1
#endif

namespace tessera::callbacks {
namespace {

using core::Event;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// VmRSS / VmHWM of this process in bytes (0 when /proc is unavailable).
std::pair<double, double> process_rss() {
  std::ifstream in("/proc/self/status");
  std::string line;
  double rss = 0, hwm = 0;
  while (std::getline(in, line)) {
    auto kb = [&](const char* key) { return std::stod(line.substr(std::string(key).size())) * 1024.0; };
    if (line.rfind("VmRSS:", 0) == 0) rss = kb("VmRSS:");
    if (line.rfind("VmHWM:", 0) == 0) hwm = kb("VmHWM:");
  }
  return {rss, hwm};
}

}  // namespace

double elapsed_fraction(const core::State& s) {
  const config::Time& max = s.max_duration;
  double done = static_cast<double>(s.timestamp.get(max.unit()));
  if (max.unit() == config::TimeUnit::kEpoch && s.dataloader_len && *s.dataloader_len > 0) {
    done += static_cast<double>(s.timestamp.batch_in_epoch) / static_cast<double>(*s.dataloader_len);
  }
  return max.value() > 0 ? done / max.value() : 1.0;
}

double in_time_unit(double seconds, const std::string& unit) {
  if (unit == "minutes") return seconds / 60.0;
  if (unit == "hours") return seconds / 3600.0;
  if (unit == "days") return seconds / 86400.0;
  return seconds;
}

void SpeedMonitor::run_event(Event event, core::State& s, core::Logger& logger) {
  if (event == Event::kFitStart) {
    if (o_.gpu_flops_available) {
      peak_ = *o_.gpu_flops_available;
    } else {
      // amp_fp8 counts against the bf16 peak, as MFU is quoted (its float8 GEMMs could reach twice that).
      const at::ScalarType dtype = core::autocast_dtype(s.precision);
      peak_ = util::measure_matmul_flops(dtype, s.device, 1024, 0.5);
      spdlog::info("speed_monitor: measured peak {:.1f} GFLOP/s ({} GEMM on {}) for MFU", peak_ / 1e9,
                   at::toString(dtype), s.device.str());
      if (dtype == at::kBFloat16 && s.device.is_cpu()) {
        // A CPU without native bf16 emulates it, ~50x slower than fp32: say so once, by precision: auto's rule.
        if (const util::CpuBf16 cpu = util::probe_cpu_bf16(); !cpu.native()) {
          spdlog::warn("speed_monitor: bf16 is emulated on this CPU: {}; use precision: fp32 (or auto)", cpu.rates());
        }
      }
    }
    return;
  }
  if (event == Event::kEvalStart) eval_started_ = now_seconds();
  if (event == Event::kEvalEnd) eval_seconds_ += now_seconds() - eval_started_;
  if (event != Event::kBatchEnd) return;
  const int64_t seq = s.batch.input_ids.size(1);
  const double batch_flops = s.model->flops_per_token(seq) * static_cast<double>(s.batch.samples * seq * s.world_size);
  total_flops_ += batch_flops;
  history_.push_back({s.timestamp.batch, s.timestamp.sample, s.timestamp.token, s.timestamp.total_wct, total_flops_});
  if (static_cast<int64_t>(history_.size()) > o_.window_size + 1) history_.pop_front();
  core::Metrics m;
  if (static_cast<int64_t>(history_.size()) == o_.window_size + 1) {
    const Point& a = history_.front();
    const Point& b = history_.back();
    const double dt = b.wct - a.wct;
    const double world = static_cast<double>(s.world_size);
    if (dt > 0) {
      const double bps = static_cast<double>(b.batch - a.batch) / dt;
      const double sps = static_cast<double>(b.sample - a.sample) / dt;
      const double tps = static_cast<double>(b.token - a.token) / dt;
      const double fps = (b.flops - a.flops) / dt;
      m["throughput/batches_per_sec"] = bps;
      m["throughput/samples_per_sec"] = sps;
      m["throughput/tokens_per_sec"] = tps;
      m["throughput/device/batches_per_sec"] = bps / world;
      m["throughput/device/samples_per_sec"] = sps / world;
      m["throughput/device/tokens_per_sec"] = tps / world;
      m["throughput/flops_per_sec"] = fps;
      m["throughput/device/flops_per_sec"] = fps / world;
      if (peak_ > 0) {
        m["throughput/device/mfu"] = fps / world / peak_;
        m["throughput/device/hfu"] = fps / world / peak_;  // no activation recomputation: HFU = MFU
      }
    }
  }
  m["time/train"] = in_time_unit(s.timestamp.total_wct, o_.time_unit);
  m["time/val"] = in_time_unit(eval_seconds_, o_.time_unit);
  m["time/total"] = in_time_unit(s.timestamp.total_wct + eval_seconds_, o_.time_unit);
  logger.log_metrics(m);
}

void LRMonitor::run_event(Event event, core::State& s, core::Logger& logger) {
  if (event != Event::kBatchEnd || !s.optimizer) return;
  const optim::OptimizerOptions& o = s.optimizer->options();
  logger.log_metrics({{fmt::format("lr-{}/group0", o.class_name.empty() ? o.name : o.class_name), s.current_lr()}});
}

void MemoryMonitor::run_event(Event event, core::State& s, core::Logger& logger) {
  if (event != Event::kAfterTrainBatch) return;
  constexpr double kGB = 1e9;
  const auto [rss, hwm] = process_rss();
  core::Metrics m{{"memory/rss_gb", rss / kGB}, {"memory/peak_rss_gb", hwm / kGB}};
#ifdef TESSERA_WITH_CUDA_ALLOCATOR_STATS
  if (s.device.is_cuda()) {
    using c10::CachingDeviceAllocator::StatType;
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(s.device.index());
    const auto agg = static_cast<size_t>(StatType::AGGREGATE);
    m["memory/current_allocated_mem"] = static_cast<double>(stats.allocated_bytes[agg].current) / kGB;
    m["memory/peak_allocated_mem"] = static_cast<double>(stats.allocated_bytes[agg].peak) / kGB;
    m["memory/current_reserved_mem"] = static_cast<double>(stats.reserved_bytes[agg].current) / kGB;
    m["memory/peak_reserved_mem"] = static_cast<double>(stats.reserved_bytes[agg].peak) / kGB;
    m["memory/alloc_retries"] = static_cast<double>(stats.num_alloc_retries);
  }
#else
  (void)s;
#endif
  logger.log_metrics(m);
}

void RuntimeEstimator::run_event(Event event, core::State& s, core::Logger& logger) {
  if (event != Event::kBatchEnd) return;
  if (s.timestamp.batch <= o_.skip_batches) return;
  const double frac = elapsed_fraction(s);
  if (!start_wct_) {
    start_wct_ = s.timestamp.total_wct;
    start_fraction_ = frac;
    return;
  }
  const double progressed = frac - start_fraction_;
  if (progressed <= 0) return;
  const double rate = (s.timestamp.total_wct - *start_wct_) / progressed;  // seconds per unit of duration
  logger.log_metrics({{"time/remaining_estimate", in_time_unit(rate * std::max(0.0, 1.0 - frac), o_.time_unit)}});
}

void OptimizerMonitor::run_event(Event event, core::State& s, core::Logger& logger) {
  if (event != Event::kBatchEnd || s.timestamp.batch % o_.batch_log_interval != 0) return;
  // The tensors this rank holds, each with the parameter ranges in it: one whole parameter per tensor in one process,
  // flat shards (dist::ParallelModel) with several ranks. Squares are summed per parameter name over this rank's
  // ranges, summed over the ranks that together hold every shard, and rooted: the values one process gets.
  using Held = core::HeldTensor;
  const std::vector<Held> held = s.held_layout();
  std::vector<std::string> names;
  std::map<std::string, int64_t> column;
  for (const auto& item : s.model->named_parameters()) {
    column[item.key()] = static_cast<int64_t>(names.size());
    names.push_back(item.key());
  }
  const int64_t n = static_cast<int64_t>(names.size());
  // Rows of squares, then rows counting the ranges seen (a parameter is logged when any rank had a range of it).
  enum Row : int64_t { kGrad, kParam, kMoment, kSecondMoment, kRows };
  std::vector<at::Tensor> parts[kRows];
  std::vector<int64_t> cols[kRows];
  auto add = [&](Row row, const Held& h, const at::Tensor& values) {
    const at::Tensor flat = values.detach().reshape({-1});
    for (const dist::ShardSpan& span : h.spans) {
      parts[row].push_back(flat.narrow(0, span.offset, span.numel).to(at::kDouble).square().sum());
      cols[row].push_back(column.at(span.name));
    }
  };
  for (const Held& h : held) {
    if (h.tensor.requires_grad() && h.tensor.grad().defined()) add(kGrad, h, h.tensor.grad());
  }
  if (o_.log_optimizer_metrics && s.optimizer) {
    const std::vector<at::Tensor>& params = s.optimizer->params();
    std::map<const void*, const Held*> held_of;
    for (const Held& h : held) held_of[h.tensor.unsafeGetTensorImpl()] = &h;
    for (const auto& [key, tensor] : s.optimizer->state()) {
      const size_t dot = key.find('.');
      if (dot == std::string::npos) continue;  // "step"
      const size_t i = std::stoul(key.substr(0, dot));
      auto it = i < params.size() ? held_of.find(params[i].unsafeGetTensorImpl()) : held_of.end();
      if (it == held_of.end()) continue;
      const std::string slot = key.substr(dot + 1);
      if (slot == "exp_avg" || slot == "momentum_buffer") add(kMoment, *it->second, tensor);
      if (slot == "exp_avg_sq") add(kSecondMoment, *it->second, tensor);
    }
    for (const at::Tensor& p : params) {
      if (auto it = held_of.find(p.unsafeGetTensorImpl()); it != held_of.end()) add(kParam, *it->second, p);
    }
  }
  const at::TensorOptions opts = at::TensorOptions().dtype(at::kDouble).device(held.at(0).tensor.device());
  at::Tensor sums = at::zeros({2 * kRows, n}, opts);
  for (int64_t row = 0; row < kRows; ++row) {
    if (parts[row].empty()) continue;
    const at::Tensor index = at::tensor(cols[row], at::kLong).to(opts.device());
    sums[row].index_add_(0, index, at::stack(parts[row]));
    sums[kRows + row].index_add_(0, index, at::ones({index.numel()}, opts));
  }
  const at::Tensor total = s.sum_over_shards(sums).cpu().contiguous();
  const auto v = total.accessor<double, 2>();
  const char* prefix[kRows] = {"l2_norm/grad/", "l2_norm/param/", "l2_norm/moment/", "l2_norm/second_moment_sqrt/"};
  core::Metrics m;
  double global_sq = 0;
  for (int64_t row = 0; row < kRows; ++row) {
    for (int64_t c = 0; c < n; ++c) {
      if (v[kRows + row][c] == 0) continue;  // no rank holds this parameter's gradient or state
      const double norm = std::sqrt(v[row][c]);
      m[prefix[row] + std::string("model.") + names[static_cast<size_t>(c)]] =
          row == kSecondMoment ? std::sqrt(norm) : norm;
      if (row == kGrad) global_sq += v[row][c];
    }
  }
  m["l2_norm/grad/global"] = std::sqrt(global_sq);
  logger.log_metrics(m);
}

double monitored_value(const MonitoredMetric& metric, const core::State& s) {
  if (metric.dataloader_label == "train") return s.train_loss;
  auto label = s.eval_metrics.find(metric.dataloader_label);
  if (label == s.eval_metrics.end()) {
    throw Error("callbacks", fmt::format("no evaluation with dataloader_label `{}` has run yet (monitor {})",
                                         metric.dataloader_label, metric.monitor));
  }
  auto it = label->second.find(metric.monitor);
  if (it == label->second.end()) {
    throw Error("callbacks",
                fmt::format("evaluation `{}` has no metric `{}`", metric.dataloader_label, metric.monitor));
  }
  return it->second;
}

void EarlyStopper::update(core::State& s) {
  const double value = monitored_value(o_.metric, s);
  const bool better = o_.metric.less ? value < best_.value_or(value) : value > best_.value_or(value);
  if (!best_ || (better && std::fabs(value - *best_) > std::fabs(o_.min_delta))) {
    best_ = value;
    best_at_ = s.timestamp;
  }
  const int64_t since = o_.patience.unit() == config::TimeUnit::kEpoch ? s.timestamp.epoch - best_at_.epoch
                                                                       : s.timestamp.batch - best_at_.batch;
  if (static_cast<double>(since) > o_.patience.value() && !s.stop_requested()) {
    spdlog::info("early_stopper: {} has not improved on {} (at batch {}) for {}; stopping", o_.metric.monitor, *best_,
                 best_at_.batch, o_.patience.str());
    s.stop_training();
  }
}

void EarlyStopper::run_event(Event event, core::State& s, core::Logger& /*logger*/) {
  const bool train = o_.metric.dataloader_label == "train";
  if (event == Event::kEvalEnd && !train) update(s);
  if (event == Event::kEpochEnd && train) update(s);
  if (event == Event::kBatchEnd && train && o_.patience.unit() == config::TimeUnit::kBatch) update(s);
}

void ThresholdStopper::run_event(Event event, core::State& s, core::Logger& /*logger*/) {
  const bool train = o_.metric.dataloader_label == "train";
  const bool check = (event == Event::kEvalEnd && !train) || (event == Event::kEpochEnd && train) ||
                     (event == Event::kBatchEnd && train && o_.stop_on_batch);
  if (!check) return;
  const double value = monitored_value(o_.metric, s);
  if (o_.metric.less ? value < o_.threshold : value > o_.threshold) {
    spdlog::info("threshold_stopper: {} = {} is {} {}; stopping", o_.metric.monitor, value,
                 o_.metric.less ? "below" : "above", o_.threshold);
    s.stop_training();
  }
}

namespace {
std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}
}  // namespace

void HfCheckpointer::run_event(Event event, core::State& s, core::Logger& logger) {
  const config::Time& iv = o_.save_interval;
  bool due = false;
  if (event == Event::kBatchEnd) due = iv.unit() == config::TimeUnit::kBatch && s.timestamp.batch % iv.count() == 0;
  if (event == Event::kEpochEnd) due = iv.unit() == config::TimeUnit::kEpoch && s.timestamp.epoch % iv.count() == 0;
  if ((event == Event::kBatchEnd || event == Event::kEpochEnd) && iv.unit() == config::TimeUnit::kDuration) {
    // Composer's `dur` interval: each time the elapsed fraction of max_duration passes a multiple of it (1dur: at
    // the end).
    const config::TimeUnit unit = s.max_duration.unit();
    const double total = s.max_duration.value();
    if (total > 0 && unit != config::TimeUnit::kDuration) {
      const double now = static_cast<double>(s.timestamp.get(unit)) / total;
      const double before = static_cast<double>(s.previous_timestamp.get(unit)) / total;
      due = std::floor(now / iv.value() + 1e-9) > std::floor(before / iv.value() + 1e-9);
    }
  }
  if (event == Event::kFitEnd) due = !s.preempted();  // a preempted run has not ended: it resumes later
  if (event == Event::kFitStart) {
    // A model transformers cannot load as the same function is refused now, not at the first save hours later.
    try {
      (void)s.model->hf_format(at::kFloat);
    } catch (const Error& e) {
      throw ConfigError("hf_checkpointer", e.message());
    }
    if (!o_.mlflow_registered_model_name.empty() && s.rank == 0) {
      bool registry = false;
      for (const auto& d : logger.destinations()) registry |= dynamic_cast<core::ModelRegistry*>(d.get()) != nullptr;
      if (!registry) {
        throw ConfigError("hf_checkpointer",
                          "mlflow_registered_model_name is set, but no mlflow logger is configured "
                          "(add loggers: mlflow: ..., or remove mlflow_registered_model_name)");
      }
    }
  }
  if (event == Event::kFitEnd && due) {
    save(s, logger, true);  // the final folder, registered when asked (even if this batch's folder exists already)
  } else if (due && s.timestamp.batch != last_saved_batch_) {
    save(s, logger, false);
  }
}

void HfCheckpointer::save(core::State& s, core::Logger& logger, bool final) {
  const bool register_model = final && !o_.mlflow_registered_model_name.empty();
  // The final batch's folder may be written already (save_interval hit it): then it is exported again only for the
  // registry, into a temporary folder.
  const bool already_written = s.timestamp.batch == last_saved_batch_;
  if (already_written && !register_model) return;
  last_saved_batch_ = s.timestamp.batch;
  const std::vector<std::pair<std::string, at::Tensor>> weights = s.parallel->full_state_dict();  // every rank
  if (s.rank == 0) {
    std::string name = replace_all(o_.huggingface_folder_name, "{batch}", std::to_string(s.timestamp.batch));
    name = replace_all(name, "{epoch}", std::to_string(s.timestamp.epoch));
    name = replace_all(name, "{run_name}", s.run_name);
    const std::string root = storage::join(util::fill_path_pattern(o_.save_folder, s.run_name, s.rank), "huggingface");
    const std::string dir = storage::join(root, name);
    const bool remote = storage::is_remote(dir);
    const bool exists = remote ? !storage::list(dir + "/").empty() : std::filesystem::exists(dir);
    if (exists && !o_.overwrite && !already_written) {
      throw Error("hf_checkpointer", fmt::format("{} exists and overwrite is false", dir));
    }
    const std::shared_ptr<models::CausalLM> copy = s.model->rebuild("cpu", std::nullopt);  // every weight copied below
    {
      at::NoGradGuard no_grad;
      std::map<std::string, at::Tensor> by_name(weights.begin(), weights.end());
      for (auto& item : copy->named_parameters()) item.value().copy_(by_name.at(item.key()));
      // LoRA adapters are folded into the exported weights (W + scale B A), so the folder computes the adapted
      // model's function (the adapters alone go to the lora algorithm's save_path, in PEFT's layout).
      const auto params = copy->named_parameters();
      for (const auto& item : s.model->named_modules()) {
        auto linear = std::dynamic_pointer_cast<models::LinearImpl>(item.value());
        if (!linear || !linear->lora_A.defined()) continue;
        at::Tensor w = params[item.key() + ".weight"];
        const at::Tensor delta = at::matmul(by_name.at(item.key() + ".lora_B").to(at::kFloat),
                                            by_name.at(item.key() + ".lora_A").to(at::kFloat)) *
                                 linear->lora_scale;
        w.add_(delta.to(w.dtype()));
      }
    }
    const at::ScalarType dtype = o_.precision == "bfloat16"  ? at::kBFloat16
                                 : o_.precision == "float16" ? at::kHalf
                                                             : at::kFloat;
    // Written complete into a temporary folder first: beside the destination (then renamed), or for an object store
    // in $TMPDIR (then uploaded, config.json last: a reader waiting for it finds the weights in place).
    std::optional<util::TempFolder> staging;
    std::filesystem::path tmp;
    if (remote || already_written) {
      staging.emplace("tessera-hf-export");
      tmp = staging->path;
    } else {
      tmp = std::filesystem::path(root) / ("." + name + ".tmp");
      std::filesystem::remove_all(tmp);
      std::filesystem::create_directories(tmp);
    }
    std::optional<std::filesystem::path> tokenizer;
    if (!s.tokenizer_name.empty()) {
      try {
        tokenizer = util::resolve_hf_tokenizer(s.tokenizer_name);
      } catch (const Error& e) {
        spdlog::warn("hf_checkpointer: the tokenizer is not copied: {}", e.message());
      }
    }
    checkpoint::save_hf_model(*copy, tmp.string(), dtype, uint64_t{5} << 30, checkpoint::HfLayout::kTransformers,
                              tokenizer, o_.transformers_version);
    if (register_model) {
      for (const auto& d : logger.destinations()) {
        if (auto* registry = dynamic_cast<core::ModelRegistry*>(d.get())) {
          spdlog::info("hf_checkpointer: {}",
                       registry->log_model(tmp.string(), "final_model_checkpoint", o_.mlflow_registered_model_name,
                                           o_.mlflow_logging_config));
        }
      }
    }
    if (!already_written) {  // (else this batch's folder is in place; the copy was for the registry)
      if (remote) {
        storage::upload_tree(tmp.string(), dir, {"config.json"}, /*replace=*/true);  // overwrite: no leftovers
      } else {
        std::filesystem::remove_all(dir);
        std::filesystem::rename(tmp, dir);
      }
      spdlog::info("hf_checkpointer: wrote {}", dir);
    }
    last_export_ = dir;
  }
  if (s.comm) s.comm->barrier();
}

// ---- run_timeout
// ------------------------------------------------------------------------------------------------------

struct RunTimeout::Timer {
  std::mutex mutex;
  std::condition_variable cv;
  bool cancelled = false;
  std::thread thread;
};

RunTimeout::RunTimeout(RunTimeoutOptions o) : o_(o) {}

RunTimeout::~RunTimeout() {
  cancel();
}

void RunTimeout::run_event(core::Event event, core::State& /*state*/, core::Logger& /*logger*/) {
  if (event != core::Event::kFitEnd || timer_) return;
  timer_ = std::make_unique<Timer>();
  Timer* t = timer_.get();
  const double timeout = o_.timeout;
  t->thread = std::thread([t, timeout] {
    std::unique_lock lock(t->mutex);
    if (t->cv.wait_for(lock, std::chrono::duration<double>(timeout), [t] { return t->cancelled; })) return;
    spdlog::error("run_timeout: the process is still running {} s after the end of training; interrupting it", timeout);
    spdlog::default_logger()->flush();
    std::signal(SIGINT, SIG_DFL);  // whatever handler the run installed, the interrupt ends the process
    std::raise(SIGINT);
  });
}

void RunTimeout::cancel() {
  if (!timer_) return;
  {
    const std::lock_guard lock(timer_->mutex);
    timer_->cancelled = true;
  }
  timer_->cv.notify_all();
  if (timer_->thread.joinable()) timer_->thread.join();
  timer_.reset();
}

void RunTimeout::close(core::State& /*state*/, core::Logger& /*logger*/) {
  cancel();
}

}  // namespace tessera::callbacks
