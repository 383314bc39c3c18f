// The training loop (Composer's Trainer._train_loop / _train_batch / _eval_loop, for one process per rank).
#include "tessera/trainer/trainer.h"

#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string_view>

#include "tessera/algorithms/algorithms.h"
#include "tessera/callbacks/callbacks.h"
#include "tessera/callbacks/checkpoint_saver.h"
#include "tessera/data/loader.h"
#include "tessera/distributed/communicator.h"
#include "tessera/distributed/fsdp.h"
#include "tessera/distributed/pipeline.h"
#include "tessera/eval/eval_recipe.h"
#include "tessera/loggers/loggers.h"
#include "tessera/models/blocks/float8.h"
#include "tessera/models/capabilities.h"
#include "tessera/models/context_parallel.h"
#include "tessera/models/loss.h"
#include "tessera/models/metric.h"
#include "tessera/trainer/preflight.h"
#include "tessera/trainer/step_graph.h"
#include "tessera/trainer/trainer_support.h"
#include "tessera/util/device.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"
#include "tessera/util/heartbeat.h"
#include "tessera/util/hf_hub.h"
#include "tessera/util/preemption.h"

namespace tessera::trainer {

using detail::count_tokens;
using detail::data_rank;
using detail::data_world;
using detail::sum_over_ranks;
using detail::to_device;

using callbacks::load_checkpoint;
using callbacks::load_newest_checkpoint;
using callbacks::LoadedCheckpoint;
using callbacks::LoadOptions;
using core::Event;
using core::Metrics;
using core::Precision;
using core::State;

namespace {

using config::Time;
using config::TimeUnit;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

namespace detail {

int64_t data_rank(const State& s, const dist::ShardingOptions& o) {
  return o.data_rank(s.rank, s.world_size);
}
int64_t data_world(const State& s, const dist::ShardingOptions& o) {
  return o.data_world(s.world_size);
}

std::vector<double> sum_over_ranks(const State& s, const std::vector<double>& values) {
  at::Tensor t = at::tensor(values, at::kDouble).to(s.device);
  s.comm->all_reduce(t).wait();
  t = t.cpu();
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

int64_t count_tokens(const data::TokenBatch& b) {
  return b.labels.ne(data::kIgnoreLabel).sum().item<int64_t>();
}

data::TokenBatch slice(const data::TokenBatch& b, int64_t start, int64_t end) {
  data::TokenBatch out;
  out.input_ids = b.input_ids.slice(0, start, end);
  out.labels = b.labels.slice(0, start, end);
  out.samples = end - start;
  if (b.attention_mask.defined()) out.attention_mask = b.attention_mask.slice(0, start, end);
  if (b.sequence_id.defined()) out.sequence_id = b.sequence_id.slice(0, start, end);
  return out;
}

models::ForwardOptions forward_options(const data::TokenBatch& b) {
  models::ForwardOptions fo;
  if (b.attention_mask.defined()) fo.attention_mask = b.attention_mask;
  if (b.sequence_id.defined()) fo.sequence_id = b.sequence_id;
  return fo;
}

data::TokenBatch to_device(data::TokenBatch b, const at::Device& device, bool non_blocking) {
  if (!device.is_cuda()) return b;
  for (at::Tensor* t : {&b.input_ids, &b.labels, &b.attention_mask, &b.sequence_id}) {
    if (!t->defined()) continue;
    // A non-blocking copy is asynchronous only from page-locked memory (from pageable memory the host waits for it):
    // through the caching host allocator, whose block is reused only once the copy has run.
    *t = non_blocking && t->is_cpu() ? t->pin_memory().to(device, /*non_blocking=*/true) : t->to(device, non_blocking);
  }
  return b;
}

}  // namespace detail

namespace {

// The global L2 norm of the gradients the step used (after gradient_clipping), summed over the ranks that hold them:
// logged every step as l2_norm/grad/global, the value Composer's optimizer_monitor logs at its intervals. Multi-tensor
// kernels (one launch per dtype); every rank takes part (the sum over gradient shards is a collective). NaN when no
// parameter has a gradient.
double global_grad_norm(const State& state) {
  at::NoGradGuard no_grad;
  std::map<at::ScalarType, std::vector<at::Tensor>> grads;
  for (const at::Tensor& p : state.trainable_parameters()) {
    if (p.grad().defined()) grads[p.grad().scalar_type()].push_back(p.grad());
  }
  if (grads.empty()) return std::nan("");
  std::vector<at::Tensor> norms;
  for (const auto& [dtype, g] : grads) {
    for (const at::Tensor& n : at::_foreach_norm(g, 2, at::kFloat)) norms.push_back(n);
  }
  const at::Tensor local_sq = at::stack(norms).square().sum().reshape({1});
  return state.sum_over_shards(local_sq).sqrt().item<double>();
}

// The GPU of a rank: its local rank's, or the only one it sees when the launcher gave each task a GPU of its own
// (Slurm's --gpus-per-task=1: SLURM_GPUS_PER_TASK=1, CUDA_VISIBLE_DEVICES naming that GPU).
at::Device cuda_device_of(const dist::Rendezvous& rv, int visible, const std::string& recipe) {
  const char* per_task = std::getenv("SLURM_GPUS_PER_TASK");  // "[type:]count"
  if (visible == 1 && per_task != nullptr) {
    const std::string_view count = std::string_view(per_task).substr(std::string_view(per_task).rfind(':') + 1);
    if (count == "1") return {at::kCUDA, 0};
  }
  if (rv.local_rank >= visible) {
    throw ConfigError("recipe",
                      fmt::format("{}: rank {} (local rank {}) has no GPU of its own: this node has {} GPU(s) "
                                  "and {} processes; launch at most {} per node, or set device: cpu",
                                  recipe, rv.rank, rv.local_rank, visible, rv.local_world_size, visible));
  }
  return {at::kCUDA, static_cast<c10::DeviceIndex>(rv.local_rank)};
}

}  // namespace

Trainer::Trainer(TrainConfig config, TrainerParts parts) : cfg_(std::move(config)), logger_(state_) {
  // From the start, so that a signal during start-up is not lost either: training stops after its first batch.
  if (cfg_.save_folder && !cfg_.preemption_signals.empty()) {
    preemption_ = std::make_unique<util::PreemptionHandler>(cfg_.preemption_signals);
  }
  setup_ranks();
  build_data();  // before the model, so that a missing or corrupt dataset fails first
  build_icl_tasks();
  build_model();
  build_components(std::move(parts));
  engine_ = std::make_unique<core::Engine>(state_, logger_);
  engine_->run_event(Event::kInit);  // model surgery (alibi, lora, ...) happens here
  if (state_.precision == Precision::kAmpFp8) {
    const int64_t layers = models::apply_float8(*state_.model);
    if (state_.rank == 0) spdlog::info("precision: amp_fp8: {} Linear layers compute their GEMMs in float8", layers);
  }
  setup_microbatching();
  shard_model();  // after INIT's surgery, before the optimizer sees the parameters
  state_.optimizer = optim::make_optimizer(cfg_.optimizer, state_.trainable_parameters());
  // Reseed so that INIT-time randomness does not change what training draws; a resumed run then restores the RNG.
  // A tensor-parallel group's ranks draw the same numbers: they compute the same activations outside the split layers.
  at::manual_seed(static_cast<uint64_t>(cfg_.seed + data_rank(state_, cfg_.fsdp)));
  engine_->run_event(Event::kBeforeLoad);
  load_initial_checkpoint();
  engine_->run_event(Event::kAfterLoad);
  setup_cuda_graphs();
  logger_.log_hyperparameters(recorded_config(cfg_));
}

void Trainer::setup_ranks() {
  // Threads: LibTorch's default can be 1 inside some environments; use every core this process may run on unless
  // the user pinned a count with OMP_NUM_THREADS.
  if (std::getenv("OMP_NUM_THREADS") == nullptr) at::set_num_threads(util::available_cores());
  // Before anything starts CUDA: the caching allocator and the driver read these once (the environment wins).
  std::string alloc_conf;
  if (cfg_.max_split_size_mb) alloc_conf = fmt::format("max_split_size_mb:{}", *cfg_.max_split_size_mb);
  if (cfg_.expandable_segments) alloc_conf += std::string(alloc_conf.empty() ? "" : ",") + "expandable_segments:True";
  if (!alloc_conf.empty()) setenv("PYTORCH_CUDA_ALLOC_CONF", alloc_conf.c_str(), 0);
  if (cfg_.cuda_load_lazy) setenv("CUDA_MODULE_LOADING", "LAZY", 0);
  const util::DeviceInfo dev = util::device_info();
  if (cfg_.device == "gpu" && dev.cuda_devices == 0) {
    throw ConfigError("recipe", fmt::format("{}: device: gpu, but {}", cfg_.recipe_path, util::describe(dev)));
  }
  const bool use_gpu = cfg_.device == "gpu" || (cfg_.device == "auto" && dev.cuda_devices > 0);
  state_.device = use_gpu ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  state_.precision = cfg_.precision_auto ? core::auto_precision(state_.device) : cfg_.precision;
  loss_scaler_ = LossScaler(state_.precision == Precision::kAmpFp16);
  if (state_.precision == Precision::kAmpFp16 && !state_.device.is_cuda()) {
    throw ConfigError("recipe", fmt::format("{}: precision: amp_fp16 needs a GPU (loss scaling is for CUDA); use "
                                            "amp_bf16 or fp32 on CPU",
                                            cfg_.recipe_path));
  }
  if (state_.precision == Precision::kAmpFp8) {
    if (const std::string why = models::float8_unsupported_reason(state_.device); !why.empty()) {
      throw ConfigError("recipe", fmt::format("{}: precision: amp_fp8: {}; use amp_bf16", cfg_.recipe_path, why));
    }
    if (cfg_.fsdp.tensor_parallel_degree > 1) {
      throw ConfigError("recipe",
                        fmt::format("{}: precision: amp_fp8 with parallelism.tensor_parallel_degree {}: "
                                    "not supported yet (the split layers' GEMMs are not float8); use amp_bf16",
                                    cfg_.recipe_path, cfg_.fsdp.tensor_parallel_degree));
    }
  }
  if (cfg_.deterministic_mode) {
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 0);
    at::globalContext().setDeterministicAlgorithms(true, false);
  }
  state_.run_name = cfg_.run_name;
  state_.tokenizer_name = cfg_.tokenizer.name;
  state_.seed = cfg_.seed;
  state_.max_duration = cfg_.max_duration;
  state_.max_seq_len = cfg_.max_seq_len;
  state_.scheduler = optim::scheduler_registry().build(cfg_.scheduler.name, cfg_.scheduler);
  if (const std::string why = state_.scheduler->check(cfg_.max_duration); !why.empty()) {
    throw ConfigError("recipe", fmt::format("{}: {}", cfg_.recipe_path, why));
  }
  // Ranks: the launcher's environment (torchrun's variables), or one process.
  rendezvous_ = dist::rendezvous_from_env();
  state_.rank = rendezvous_.rank;
  state_.world_size = rendezvous_.world_size;
  // Every input and output, before anything is connected, built or written: all problems at once, exit 2.
  if (cfg_.preflight) require_preflight(cfg_, {.rank = state_.rank, .probe_writes = state_.rank == 0});
  // One GPU per process, chosen by the local rank (torchrun's convention): before connecting when the launcher said
  // which ranks share this machine, else once the rendezvous found out.
  const bool cuda = state_.device.is_cuda();
  if (cuda && rendezvous_.placement_known) {
    state_.device = cuda_device_of(rendezvous_, dev.cuda_devices, cfg_.recipe_path);
  }
  // Tensor- and context-parallel groups read one batch each, as do a rank's peers in the other pipeline stages: the
  // data-parallel ranks are world / (P x T x C).
  const int64_t tp = cfg_.fsdp.batch_replicas();
  if (state_.world_size % (tp * cfg_.fsdp.pipeline_degree()) != 0) {
    throw ConfigError("recipe",
                      fmt::format("{}: parallelism.pipeline_parallel_degree {} x tensor_parallel_degree {} x "
                                  "context_parallel_degree {} does not divide the {} ranks",
                                  cfg_.recipe_path, cfg_.fsdp.pipeline_degree(), cfg_.fsdp.tensor_parallel_degree,
                                  cfg_.fsdp.context_parallel_degree, state_.world_size));
  }
  if (cfg_.global_train_batch_size % data_world(state_, cfg_.fsdp) != 0) {
    throw ConfigError("recipe",
                      fmt::format("{}: global_train_batch_size {} does not divide over {} data-parallel ranks",
                                  cfg_.recipe_path, cfg_.global_train_batch_size, data_world(state_, cfg_.fsdp)));
  }
  state_.comm = dist::Communicator::connect(rendezvous_, state_.device, cfg_.dist_timeout);
  const bool found = !rendezvous_.placement_known;
  rendezvous_ = state_.comm->rendezvous();
  if (cuda && found) state_.device = cuda_device_of(rendezvous_, dev.cuda_devices, cfg_.recipe_path);
  state_.local_rank = rendezvous_.local_rank;
  state_.local_world_size = rendezvous_.local_world_size;
  if (state_.world_size > 1) {
    spdlog::info("rank {} of {} (node {}, local rank {}{}), {} collectives", state_.rank, state_.world_size,
                 rendezvous_.node_rank(), rendezvous_.local_rank, found ? ", found by the rendezvous" : "",
                 state_.comm->backend_name());
  }
  if (tp > 1 && state_.local_world_size % tp != 0) {
    throw ConfigError("recipe", fmt::format("{}: parallelism.tensor_parallel_degree x context_parallel_degree {}: "
                                            "tensor- and context-parallel groups stay within a node, and nodes of {} "
                                            "ranks do not hold whole groups",
                                            cfg_.recipe_path, tp, state_.local_world_size));
  }
  state_.device_train_batch_size = cfg_.global_train_batch_size / data_world(state_, cfg_.fsdp);
}

const data::Tokenizer& Trainer::tokenizer(const std::string& needed_by) {
  if (tokenizer_) return *tokenizer_;
  std::filesystem::path tok;
  try {
    tok = util::resolve_hf_tokenizer(cfg_.tokenizer.name);
  } catch (const Error& e) {
    throw ConfigError("recipe", fmt::format("{}: {} need{} a tokenizer: tokenizer.name: {}", cfg_.recipe_path,
                                            needed_by, needed_by == "icl_tasks" ? "" : "s", e.message()));
  }
  tokenizer_ = data::Tokenizer::from_file(tok);
  return *tokenizer_;
}

std::unique_ptr<data::BatchIterator> Trainer::open_train_epoch() {
  return train_loader_->open(state_.timestamp);
}

std::unique_ptr<data::BatchIterator> Trainer::open_eval() {
  return eval_loader_->open(config::Timestamp{});
}

void Trainer::build_data() {
  if (cfg_.train_loader.tokens.max_seq_len != cfg_.max_seq_len) {
    spdlog::warn("train_loader.dataset.max_seq_len ({}) differs from max_seq_len ({})",
                 cfg_.train_loader.tokens.max_seq_len, cfg_.max_seq_len);
  }
  const dist::Rendezvous& rv = rendezvous_;
  data::LoaderContext ctx;
  const int64_t tp = cfg_.fsdp.batch_replicas();  // a stage's ranks that read the same samples
  ctx.world_size = data_world(state_, cfg_.fsdp);
  ctx.rank = data_rank(state_, cfg_.fsdp);
  ctx.num_nodes = rv.num_nodes();
  ctx.node_rank = rv.node_rank();
  ctx.local_world_size = rv.local_world_size / tp;
  ctx.local_rank = rv.local_rank / tp;
  if (const int64_t pp = cfg_.fsdp.pipeline_degree(); pp > 1) {
    // The stages (outermost in the mesh) read the same samples: within a node when it holds every stage, else on
    // nodes as many apart as a stage has.
    if (rv.local_world_size % (tp * pp) == 0) {
      ctx.local_world_size = rv.local_world_size / (tp * pp);
      ctx.local_rank = (rv.local_rank % (rv.local_world_size / pp)) / tp;
    } else {
      ctx.num_nodes = rv.num_nodes() / pp;
      ctx.node_rank = rv.node_rank() % ctx.num_nodes;
    }
  }
  auto tokenizer_for = [this](const std::string& loader) {
    return [this, loader] { return tokenizer("the " + loader + " loader"); };
  };
  ctx.split = "train_loader";
  ctx.device_batch_size = state_.device_train_batch_size;
  ctx.tokenizer = tokenizer_for(cfg_.train_loader.name);
  train_loader_ = data::loader_registry().build(cfg_.train_loader.name, cfg_.train_loader, ctx);
  state_.dataloader_len = train_loader_->batches_per_epoch();
  if (cfg_.eval_loader) {
    ctx.split = "eval_loader";
    ctx.device_batch_size = cfg_.device_eval_batch_size;
    ctx.tokenizer = tokenizer_for(cfg_.eval_loader->name);
    eval_loader_ = data::loader_registry().build(cfg_.eval_loader->name, *cfg_.eval_loader, ctx);
  }
}

void Trainer::build_icl_tasks() {
  if (cfg_.icl_tasks_path) {
    icl_tasks_ = eval::load_icl_tasks(*cfg_.icl_tasks_path);
  } else {
    const std::string base = std::filesystem::path(cfg_.recipe_path).parent_path().string();
    for (const auto& t : cfg_.icl_tasks) icl_tasks_.push_back(eval::parse_icl_task(t.raw, base));
  }
  if (icl_tasks_.empty()) return;
  // ICL prompts are as long as icl_seq_len (default: the model's context) unless a task says otherwise.
  // Each evaluator's batches per rank, as Composer's fit() decides them.
  for (auto& t : icl_tasks_) {
    if (t.max_seq_len == 0) t.max_seq_len = cfg_.icl_seq_len.value_or(cfg_.max_seq_len);
    t.subset_num_batches = eval::icl_subset_num_batches_for(t.has_categories, cfg_.icl_subset_num_batches,
                                                            cfg_.eval_subset_num_batches, false);
  }
  if (cfg_.eval_gauntlet) {
    gauntlet_ =
        eval::gauntlet_from(*cfg_.eval_gauntlet, std::filesystem::path(cfg_.recipe_path).parent_path().string());
  }
  (void)tokenizer("icl_tasks");  // loaded now, so that a missing tokenizer fails at start-up
}

void Trainer::build_model() {
  at::manual_seed(static_cast<uint64_t>(cfg_.seed));
  // `meta` under FSDP: the sharding engine materialises one unit at a time (a model larger than one rank's memory);
  // otherwise (one rank: LLM Foundry reverts meta to cpu) the whole model is built on the device.
  const bool deferred = cfg_.model.init_device == "meta" && dist::applies_fsdp(state_.world_size);
  state_.model = models::model_registry().build(cfg_.model.name, cfg_.model,
                                                deferred                  ? "meta"
                                                : state_.device.is_cuda() ? "cuda"
                                                                          : "cpu",
                                                static_cast<uint64_t>(cfg_.seed));
}

void Trainer::build_components(TrainerParts parts) {
  const core::RunContext run{state_.run_name, state_.rank, state_.world_size};
  // Loggers first, then callbacks (Composer: state.callbacks = loggers + callbacks). Metrics are reduced over the
  // ranks before they are logged, so only rank 0 prints them.
  if ((cfg_.log_to_console || cfg_.progress_bar) && state_.rank == 0) {
    loggers::ConsoleOptions console;
    console.interval = cfg_.console_log_interval;
    console.progress_bar = cfg_.progress_bar;
    console.verbose = cfg_.console_verbose;
    console.outputs = [this] { return written_outputs(); };
    state_.callbacks.push_back(loggers::make_console_logger(std::move(console)));
  }
  for (auto& c : config::build_components(cfg_.loggers, loggers::logger_registry(), run)) {
    state_.callbacks.push_back(std::move(c));
  }
  for (auto& c : config::build_components(cfg_.callbacks, callbacks::callback_registry(), run)) {
    state_.callbacks.push_back(std::move(c));
  }
  if (cfg_.profiler) state_.callbacks.push_back(callbacks::make_profiler(*cfg_.profiler, run));
  if (cfg_.save_folder) {
    callbacks::SaveOptions so = cfg_.save;
    so.folder = util::fill_path_pattern(*cfg_.save_folder, state_.run_name, 0);
    so.overwrite = so.overwrite || cfg_.autoresume;  // resuming writes on into the folder
    so.timeout = cfg_.dist_timeout;
    saver_ = std::make_shared<callbacks::CheckpointSaver>(so, [this] { return resumption_state(); });
    state_.callbacks.push_back(saver_);
  }
  loss_ = parts.loss;
  if (!loss_ && cfg_.loss) loss_ = models::loss_registry().build(cfg_.loss->name, *cfg_.loss);
  metrics_ = config::build_components(cfg_.metrics, models::metric_registry());
  metrics_.insert(metrics_.end(), parts.metrics.begin(), parts.metrics.end());
  state_.algorithms = config::build_components(cfg_.algorithms, algorithms::algorithm_registry(), run);
  // Components that read or replace whole parameter tensors, which sharding turns into flat shards.
  std::vector<std::string> unsupported;
  for (size_t i = 0; i < state_.algorithms.size(); ++i) {
    if (!state_.algorithms[i]->supports_sharded_parameters())
      unsupported.push_back("algorithms." + cfg_.algorithms[i].name);
  }
  for (auto& a : parts.algorithms) {
    if (!a->supports_sharded_parameters()) unsupported.push_back(a->name());
    state_.algorithms.push_back(std::move(a));
  }
  if (dist::applies_fsdp(state_.world_size) && !unsupported.empty()) {
    throw ConfigError("recipe", fmt::format("{}: not supported yet with more than one rank: {}", cfg_.recipe_path,
                                            fmt::join(unsupported, ", ")));
  }
  for (auto& c : parts.callbacks) state_.callbacks.push_back(std::move(c));
  for (auto& c : state_.callbacks) {
    if (auto d = std::dynamic_pointer_cast<core::LoggerDestination>(c)) logger_.add_destination(d);
  }
}

void Trainer::setup_microbatching() {
  oom_retry_ = OutOfMemoryRetry(cfg_.device_train_microbatch_size.automatic);
  state_.device_train_microbatch_size =
      oom_retry_.enabled() ? state_.device_train_batch_size
                           : std::min(cfg_.device_train_microbatch_size.samples, state_.device_train_batch_size);
  if (oom_retry_.enabled() && state_.rank == 0) {
    spdlog::info(
        "device_train_microbatch_size: auto starts from the whole device batch ({} samples) and halves it "
        "when a batch runs out of memory{}",
        state_.device_train_batch_size,
        state_.device.is_cuda() ? "" : " (on CPU only a failed allocation counts, e.g. under ulimit -v)");
  }
}

void Trainer::shard_model() {
  dist::ParallelOptions po;
  // Pipeline parallelism: the outermost mesh dimension. Stage s is ranks [s * W / P, (s + 1) * W / P); the engine
  // shards within the stage, and each rank's pipeline group holds its peers at the same position of every stage.
  std::shared_ptr<dist::Communicator> comm = state_.comm;
  if (const int stages = static_cast<int>(cfg_.fsdp.pipeline_degree()); stages > 1) {
    const int per_stage = state_.world_size / stages;
    for (int s = 0; s < stages; ++s) {
      std::vector<int> ranks;
      for (int r = 0; r < per_stage; ++r) ranks.push_back(s * per_stage + r);
      if (auto g = state_.comm->new_group(ranks)) comm = g;
    }
    for (int r = 0; r < per_stage; ++r) {
      std::vector<int> ranks;
      for (int s = 0; s < stages; ++s) ranks.push_back(s * per_stage + r);
      if (auto g = state_.comm->new_group(ranks)) po.pipeline.group = g;
    }
    // What stages do not run yet, refused before anything is built on them.
    const auto refuse = [&](const std::string& what) {
      throw ConfigError("recipe", fmt::format("{}: parallelism.pipeline_parallel_degree {} with {}: not supported yet",
                                              cfg_.recipe_path, stages, what));
    };
    if (models::active_params(*state_.model) < state_.model->num_params()) refuse("a mixture of experts");
    for (const auto& p : state_.model->named_parameters()) {
      if (!p.value().requires_grad()) refuse(fmt::format("frozen parameters ({}; LoRA)", p.key()));
    }
    if (has_eval() && (!cfg_.eval_interval.is_zero() || cfg_.eval_first)) {
      refuse("evaluation during training (set eval_interval: 0 and eval_first: false)");
    }
    if (cfg_.cuda_graphs) refuse("cuda_graphs");
    const int64_t blocks = state_.model->num_units() - 1;
    if (blocks < stages) {
      throw ConfigError("recipe", fmt::format("{}: parallelism.pipeline_parallel_degree {}: the model has {} blocks, "
                                              "fewer than the stages",
                                              cfg_.recipe_path, stages, blocks));
    }
    po.pipeline.stage = state_.rank / per_stage;
    po.pipeline.stages = stages;
    std::tie(po.pipeline.first_block, po.pipeline.last_block) = dist::stage_blocks(blocks, po.pipeline.stage, stages);
    if (state_.rank == 0) {
      std::vector<std::string> split;
      for (int s = 0; s < stages; ++s) {
        const auto [first, last] = dist::stage_blocks(blocks, s, stages);
        split.push_back(fmt::format("stage {}: blocks {}-{}{}{}", s, first - 1, last - 1, s == 0 ? " + embeddings" : "",
                                    s == stages - 1 ? " + head" : ""));
      }
      spdlog::info("pipeline: {} stages of {} rank(s), schedule {}, {}", stages, per_stage, cfg_.fsdp.pipeline_schedule,
                   fmt::join(split, "; "));
    }
  }
  // Every world size runs through the sharding engine; one rank (per stage) gets DDP's options (sharding_for_world).
  po.sharding = dist::sharding_for_world(cfg_.fsdp, comm->size());
  std::tie(po.param_dtype, po.reduce_dtype) =
      dist::mixed_precision_dtypes(po.sharding.mixed_precision, core::autocast_dtype(state_.precision));
  // HYBRID_SHARD's shard groups: the node, or fsdp_config's data_parallel_shard_degree (Composer's device mesh).
  po.ranks_per_node = static_cast<int>(dist::shard_group_size(po.sharding, comm->size(), state_.local_world_size));
  po.overlap = cfg_.fsdp.overlap_communication;
  po.device = state_.device;
  po.init_seed = static_cast<uint64_t>(cfg_.seed);
  po.agree_on_oom = oom_retry_.enabled();
  state_.parallel = dist::parallelize(*state_.model, po, comm);
}

nlohmann::json Trainer::resumption_state() const {
  const config::Timestamp& t = state_.timestamp;
  return {{"config", recorded_config(cfg_)},
          {"dataset", {{"train", train_loader_->state(t)}}},
          {"trainer",
           {{"loss_scale", loss_scaler_.loss_scale()},
            {"good_steps", loss_scaler_.good_steps()},
            {"device_train_microbatch_size", state_.device_train_microbatch_size}}}};
}

void Trainer::load_initial_checkpoint() {
  // autoresume: the newest valid checkpoint of this run wins over load_path (which only seeds the first start).
  std::optional<LoadedCheckpoint> resumed;
  LoadOptions lo;
  lo.strict_model_weights = cfg_.load.strict_model_weights;
  if (cfg_.autoresume) {
    const std::string folder = util::fill_path_pattern(*cfg_.save_folder, state_.run_name, 0);
    resumed = load_newest_checkpoint(state_, folder, cfg_.save.latest_filename, lo);
    if (!resumed && state_.rank == 0) spdlog::info("autoresume: no checkpoint in {} yet; starting fresh", folder);
  }
  const bool resuming = resumed.has_value();
  // A fresh start: load_path, else the pretrained weights of an hf_causal_lm model (all of them: strict).
  std::optional<std::string> initial = cfg_.load_path;
  if (!initial && cfg_.model.pretrained_weights) {
    initial = cfg_.model.pretrained_weights;
    lo.strict_model_weights = true;
  }
  if (!resuming && !initial) return;
  if (!resuming) lo.weights_only = cfg_.load.weights_only;
  const LoadedCheckpoint loaded = resuming ? *std::move(resumed) : load_checkpoint(state_, *initial, lo);
  if (loaded.full_state) {
    const nlohmann::json& m = loaded.metadata;
    if (m.contains("dataset") && m["dataset"].contains("train")) {
      train_loader_->load_state(m["dataset"]["train"], state_.timestamp, loaded.path);
    }
    if (m.contains("trainer")) {
      loss_scaler_.restore(m["trainer"].value("loss_scale", loss_scaler_.loss_scale()),
                           m["trainer"].value("good_steps", loss_scaler_.good_steps()));
      if (oom_retry_.enabled()) {
        state_.device_train_microbatch_size =
            std::min(state_.device_train_batch_size,
                     m["trainer"].value("device_train_microbatch_size", state_.device_train_microbatch_size));
      }
    }
  }
  if (state_.rank == 0) {
    spdlog::info("{} {} at epoch {}, batch {}{}", resuming ? "resumed from" : "loaded", loaded.path,
                 state_.timestamp.epoch, state_.timestamp.batch, loaded.full_state ? "" : " (weights only)");
  }
  last_checkpoint_ = loaded.path;
}

std::vector<std::string> Trainer::written_outputs() const {
  std::vector<std::string> out;
  if (saver_ && !saver_->saved().empty()) out.push_back("checkpoint  " + saver_->saved().back());
  for (const auto& c : state_.callbacks) {
    if (const auto* hf = dynamic_cast<const callbacks::HfCheckpointer*>(c.get()); hf && !hf->last_export().empty()) {
      out.push_back("HF export   " + hf->last_export());
    }
    if (const auto* jsonl = dynamic_cast<const loggers::JsonlLogger*>(c.get()))
      out.push_back("metrics     " + jsonl->path());
  }
  return out;
}

Trainer::~Trainer() {
  graph_.reset();  // its memory before the allocator's users go
  if (engine_) engine_->close();
}

void Trainer::fit() {
  engine_->run_event(Event::kFitStart);
  if (cfg_.eval_first && state_.timestamp.batch == 0 && has_eval_loader()) eval();
  while (!state_.reached_max_duration() && !state_.stop_requested()) {
    if (state_.timestamp.batch_in_epoch == 0) engine_->run_event(Event::kEpochStart);
    // A run resumed from a checkpoint of an epoch's last batch has nothing left to load in that epoch.
    bool epoch_done = state_.timestamp.batch_in_epoch >= *state_.dataloader_len;
    std::unique_ptr<data::BatchIterator> loader;
    if (!epoch_done) loader = open_train_epoch();
    while (!epoch_done) {
      const auto started = Clock::now();
      engine_->run_event(Event::kBeforeDataloader);
      std::optional<data::TokenBatch> next = loader->next();
      if (!next) {
        epoch_done = true;
        break;
      }
      // Tokens counted on the host before the copy (on the device a count would wait for the GPU), and again only if
      // an algorithm replaced the batch (sequence-length warmup truncates it at AFTER_DATALOADER).
      const int64_t host_tokens = count_tokens(*next), host_loss_tokens = data::loss_token_count(*next);
      state_.batch = to_device(std::move(*next), state_.device, /*non_blocking=*/true);
      const data::TokenBatch sent = state_.batch;
      engine_->run_event(Event::kAfterDataloader);
      engine_->run_event(Event::kBatchStart);
      const bool unchanged = state_.batch.input_ids.is_same(sent.input_ids) &&
                             state_.batch.labels.is_same(sent.labels) && !state_.batch.targets.defined();
      int64_t samples = state_.batch.samples, tokens = unchanged ? host_tokens : count_tokens(state_.batch);
      const int64_t batch_loss_tokens = unchanged ? host_loss_tokens : data::loss_token_count(state_.batch);
      // The timestamp counts every rank's samples and tokens; the loss is normalised by every rank's loss tokens.
      // The same all-reduce tells every rank whether any rank received a preemption signal, so that all stop after
      // the same batch.
      const int signal = preemption_ ? util::PreemptionHandler::received() : 0;
      const std::vector<double> sums =
          sum_over_ranks(state_, {static_cast<double>(samples), static_cast<double>(tokens),
                                  static_cast<double>(batch_loss_tokens), signal != 0 ? 1.0 : 0.0});
      // A tensor- or context-parallel group's ranks read one batch, as do the pipeline stages: it counts once.
      const double copies = static_cast<double>(cfg_.fsdp.batch_replicas() * cfg_.fsdp.pipeline_degree());
      samples = static_cast<int64_t>(sums[0] / copies);
      tokens = static_cast<int64_t>(sums[1] / copies);
      loss_tokens_ = sums[2];
      if (sums[3] > 0 && !state_.preempted()) {
        state_.stop_training(State::StopReason::kPreempted);
        if (signal != 0) {
          spdlog::warn("rank {}: received {}; every rank finishes batch {}, saves a checkpoint and stops", state_.rank,
                       util::signal_name(signal), state_.timestamp.batch + 1);
        }
      }
      train_batch();
      if (state_.rollback_requested) rollback();
      const double grad_norm = global_grad_norm(state_);
      Metrics m{{"loss/train/total", state_.train_loss}};
      log_mixture_of_experts(m);
      if (cfg_.device_train_microbatch_size.automatic) {
        m["trainer/device_train_microbatch_size"] = static_cast<double>(state_.device_train_microbatch_size);
      }
      logger_.log_metrics(m);
      state_.previous_timestamp = state_.timestamp;
      state_.timestamp.to_next_batch(samples, tokens, seconds_since(started));
      // At the step optimizer_monitor logs it (BATCH_END's; the loss goes at the step before, as in Composer).
      if (!std::isnan(grad_norm)) logger_.log_metrics({{"l2_norm/grad/global", grad_norm}});
      engine_->run_event(Event::kBatchEnd);
      util::heartbeat(fmt::format("batch {}", state_.timestamp.batch));
      if (eval_due_at_batch_end() && !state_.preempted()) run_eval();  // a preemption saves first, as soon as it can
      engine_->run_event(Event::kBatchCheckpoint);
      if (state_.timestamp.batch_in_epoch == *state_.dataloader_len) {
        epoch_done = true;
        break;
      }
      if (state_.reached_max_duration() || state_.stop_requested()) break;
    }
    if (!epoch_done) break;
    state_.previous_timestamp = state_.timestamp;
    state_.timestamp.to_next_epoch();
    engine_->run_event(Event::kEpochEnd);
    if (eval_due_at_epoch_end()) run_eval();
    engine_->run_event(Event::kEpochCheckpoint);
  }
  engine_->run_event(Event::kFitEnd);
  if (state_.preempted()) {
    if (state_.rank == 0) {
      spdlog::warn("{}: stopped after batch {}{}",
                   state_.stop_reason >= State::StopReason::kUnhealthy ? "health monitor" : "preempted",
                   state_.timestamp.batch,
                   saver_ && !saver_->saved().empty() ? "; resume from " + saver_->saved().back() : "");
    }
    return;
  }
  // The final evaluation, unless the last interval already ended here.
  if (has_eval() && !cfg_.eval_interval.is_zero() && last_eval_batch_ != state_.timestamp.batch) run_eval();
}

void Trainer::rollback() {
  state_.rollback_requested = false;
  if (graph_) graph_->reset();  // captured again after its warmup, over the restored weights
  LoadOptions lo;
  lo.restore_progress = false;  // time, RNG and data go on: the batches since the checkpoint are not replayed
  lo.strict_model_weights = true;
  std::optional<LoadedCheckpoint> loaded;
  if (saver_) {
    saver_->wait();
    loaded = load_newest_checkpoint(state_, saver_->options().folder, cfg_.save.latest_filename, lo);
  }
  if (!loaded && last_checkpoint_) loaded = load_checkpoint(state_, *last_checkpoint_, lo);
  if (!loaded)
    throw Error("train", fmt::format("batch {}: a rollback was requested but there is no checkpoint to roll "
                                     "back to (set save_folder)",
                                     state_.timestamp.batch));
  if (state_.rank == 0) {
    spdlog::warn("batch {}: rolled the model and optimizer back to {}; training continues with the next batch",
                 state_.timestamp.batch, loaded->path);
  }
}

}  // namespace tessera::trainer
