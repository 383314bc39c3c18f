// `profiler:`: Composer's cyclic schedule over LibTorch's Kineto profiler, a trace per rank and cycle, and the time
// split of each traced window.
#include "tessera/callbacks/profiler.h"

#include <ATen/record_function.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <regex>
#include <set>

#include "tessera/core/state.h"
#include "tessera/storage/storage.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"
#include "tessera/util/path_pattern.h"

namespace tessera::callbacks {
namespace {

namespace fs = std::filesystem;
constexpr const char* kStepPrefix = "ProfilerStep#";  // torch.profiler's step scopes, which TensorBoard's plugin reads

// First match wins (lower-cased names): the order resolves overlaps, as in benchmarks/gpu_profile.py.
const std::vector<std::pair<std::string, std::regex>>& categories() {
  static const auto* table = new std::vector<std::pair<std::string, std::regex>>{
      {"data", std::regex("tessera/data|dataloader")},
      {"communication",
       std::regex("nccl|gloo|c10d|record_param_comms|all_?reduce|all_?gather|reduce_?scatter|broadcast|all_?to_?all")},
      {"optimizer", std::regex("tessera/optimizer|adam|lion|fused_adamw|multi_tensor|_foreach|_amp_|sgd")},
      {"attention", std::regex("flash|fmha|attention|sdpa|_efficient_attention|cudnn.*mha")},
      {"loss", std::regex("tessera/loss|log_softmax|softmax|nll_loss|cross_entropy|logsumexp")},
      {"gemm", std::regex("gemm|nvjet|xmma|cutlass|cublas|sm90_|sm100_|_mm_|matmul|scaled_mm|addmm|\\bmm\\b|::mm$|bmm|"
                          "linear")},
      {"norm", std::regex("layer_norm|layernorm|rms_?norm|norm_kernel|batch_norm")},
      {"embedding", std::regex("embedding|index_select|indexing_backward|index_put")},
      {"reduction", std::regex("reduce_kernel|reduction|sum|mean|amax|max")},
      {"elementwise",
       std::regex("elementwise|vectorized|unrolled|copy|fill|where|mul|add|gelu|silu|cat|clamp|pow|exp|div|sub|neg|"
                  "to_copy|zero_")},
  };
  return *table;
}

class Profiler : public core::Callback {
 public:
  Profiler(ProfilerOptions o, const core::RunContext& run) : o_(std::move(o)), run_(run) {
    folder_ = util::fill_path_pattern(o_.folder, run_.run_name, run_.rank);
    std::error_code ec;
    if (!o_.overwrite && fs::is_directory(folder_, ec)) {
      for (const auto& e : fs::directory_iterator(folder_, ec)) {
        if (e.path().string().ends_with(".pt.trace.json")) {
          throw ConfigError("profiler", fmt::format("{} already holds traces ({}); set "
                                                    "profiler.torch_prof_overwrite: true or choose another "
                                                    "torch_prof_folder",
                                                    folder_, e.path().filename().string()));
        }
      }
    }
  }
  std::string name() const override { return "Profiler"; }

  void run_event(core::Event e, core::State& s, core::Logger& logger) override {
    using core::Event;
    switch (e) {
      case Event::kFitStart:
        resumption_ = s.timestamp.batch_in_epoch;
        break;
      case Event::kEpochEnd:
        resumption_ = 0;  // skip_first counts from the resumed batch in the epoch resumed only
        break;
      case Event::kBeforeDataloader:
        action_ = cyclic_schedule(o_, s.timestamp.batch_in_epoch, s.dataloader_len, resumption_);
        if (action_ == ProfilerAction::kSkip) break;
        start(s, action_ != ProfilerAction::kWarmup);
        if (recording_) {
          open(fmt::format("{}{}", kStepPrefix, s.timestamp.batch + 1));
          open("tessera/data");
        }
        break;
      case Event::kAfterDataloader:
        close_to(1);
        break;
      case Event::kBeforeLoss:
        open("tessera/loss");
        break;
      case Event::kAfterLoss:
        close_to(1);
        break;
      case Event::kAfterTrainBatch:
        open("tessera/optimizer");
        break;
      case Event::kBatchEnd:
        close_to(0);
        if (action_ == ProfilerAction::kActiveAndSave) save(s, logger);
        break;
      case Event::kFitEnd:
        close_to(0);
        if (recording_) save(s, logger);  // a cycle the run's end cut short
        break;
      default:
        break;
    }
  }

  void close(core::State& s, core::Logger& /*logger*/) override {
    scopes_.clear();
    if (prepared_ || recording_) (void)torch::autograd::profiler::disableProfiler();  // an error ended the run
    prepared_ = recording_ = false;
    (void)s;
  }

 private:
  void start(const core::State& s, bool record) {
    namespace prof = torch::profiler::impl;
    const prof::ProfilerConfig config(prof::ProfilerState::KINETO, o_.record_shapes, o_.profile_memory, o_.with_stack,
                                      o_.with_flops);
    std::set<prof::ActivityType> activities{prof::ActivityType::CPU};
    if (s.device.is_cuda()) activities.insert(prof::ActivityType::CUDA);
    if (!prepared_) {
      torch::autograd::profiler::prepareProfiler(config, activities);
      prepared_ = true;
    }
    if (record && !recording_) {
      torch::autograd::profiler::enableProfiler(config, activities);
      recording_ = true;
    }
  }

  // Scopes that mark the step and its phases in the trace (only while recording: RecordFunction is inactive else).
  void open(const std::string& name) {
    if (!recording_) return;
    auto scope = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
    if (scope->isActive()) scope->before(name);
    scopes_.push_back(std::move(scope));
  }
  void close_to(size_t depth) {
    while (scopes_.size() > depth) scopes_.pop_back();  // ends the scope
  }

  void save(core::State& s, core::Logger& logger) {
    if (s.device.is_cuda()) torch::cuda::synchronize();  // the window's last kernels have run
    const std::unique_ptr<torch::autograd::profiler::ProfilerResult> result =
        torch::autograd::profiler::disableProfiler();
    prepared_ = recording_ = false;
    const std::string file = util::fill_path_pattern(o_.filename, run_.run_name, run_.rank, s.timestamp.batch);
    const std::string path = storage::join(folder_, file);
    fs::create_directories(fs::path(path).parent_path());
    result->save(path);
    written_.push_back(path);
    while (o_.num_traces_to_keep >= 0 && written_.size() > static_cast<size_t>(o_.num_traces_to_keep)) {
      std::error_code ec;
      fs::remove(written_.front(), ec);
      written_.pop_front();
    }
    std::vector<TraceEvent> events;
    for (const auto& ev : result->events()) {
      const bool device = ev.deviceType() != c10::DeviceType::CPU;
      events.push_back({ev.name(), ev.startNs(), ev.endNs(), ev.startThreadId(), device});
    }
    const TimeSplit split = time_split(events);
    if (split.window_seconds <= 0) return;
    core::Metrics m{{"profile/window_seconds", split.window_seconds}};
    if (split.steps > 0) m["profile/step_seconds"] = split.window_seconds / static_cast<double>(split.steps);
    std::vector<std::pair<double, std::string>> shares;
    for (const auto& [category, seconds] : split.seconds) {
      m["profile/fraction/" + category] = seconds / split.window_seconds;
      shares.emplace_back(seconds / split.window_seconds, category);
    }
    logger.log_metrics(m);
    if (run_.rank == 0) {
      std::sort(shares.rbegin(), shares.rend());
      std::string line;
      for (const auto& [share, category] : shares) {
        if (share >= 0.005) line += fmt::format("{}{} {:.0f}%", line.empty() ? "" : ", ", category, 100 * share);
      }
      spdlog::info("profiler: {} ({} steps, {:.3f} s): {}", path, split.steps, split.window_seconds, line);
    }
  }

  ProfilerOptions o_;
  core::RunContext run_;
  std::string folder_;
  int64_t resumption_ = 0;
  ProfilerAction action_ = ProfilerAction::kSkip;
  bool prepared_ = false;
  bool recording_ = false;
  std::vector<std::unique_ptr<at::RecordFunction>> scopes_;
  std::deque<std::string> written_;
};

// Union length of intervals.
double union_ns(std::vector<std::pair<uint64_t, uint64_t>> spans) {
  std::sort(spans.begin(), spans.end());
  double total = 0;
  uint64_t start = 0, end = 0;
  bool open = false;
  for (const auto& [a, b] : spans) {
    if (!open || a > end) {
      if (open) total += static_cast<double>(end - start);
      start = a;
      end = b;
      open = true;
    } else {
      end = std::max(end, b);
    }
  }
  if (open) total += static_cast<double>(end - start);
  return total;
}

}  // namespace

std::string time_category(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const auto& [label, pattern] : categories()) {
    if (std::regex_search(lower, pattern)) return label;
  }
  return "";
}

TimeSplit time_split(const std::vector<TraceEvent>& events) {
  TimeSplit out;
  std::vector<const TraceEvent*> steps;
  for (const TraceEvent& e : events) {
    if (!e.device && e.name.starts_with(kStepPrefix)) steps.push_back(&e);
  }
  out.steps = static_cast<int64_t>(steps.size());
  std::vector<const TraceEvent*> device;
  for (const TraceEvent& e : events) {
    // The scopes' copies on the device timeline (user annotations) are not device work.
    if (e.device && e.end_ns > e.start_ns && !e.name.starts_with(kStepPrefix) && !e.name.starts_with("tessera/")) {
      device.push_back(&e);
    }
  }
  if (!device.empty()) {
    // Device time: kernels by name over the window from the first device activity to the last.
    uint64_t first = UINT64_MAX, last = 0;
    std::vector<std::pair<uint64_t, uint64_t>> spans;
    for (const TraceEvent* e : device) {
      first = std::min(first, e->start_ns);
      last = std::max(last, e->end_ns);
      spans.emplace_back(e->start_ns, e->end_ns);
      const std::string c = time_category(e->name);
      out.seconds[c.empty() ? "other" : c] += static_cast<double>(e->end_ns - e->start_ns) * 1e-9;
    }
    out.window_seconds = static_cast<double>(last - first) * 1e-9;
    out.seconds["idle"] = std::max(0.0, out.window_seconds - union_ns(spans) * 1e-9);
    return out;
  }
  if (steps.empty()) return out;
  // Host time: the training thread's operators inside the steps, each one's self time in the category of its
  // outermost categorised enclosing event (the step itself aside), the steps' own self time as idle.
  const uint64_t thread = steps.front()->thread;
  std::vector<const TraceEvent*> ops;
  for (const TraceEvent& e : events) {
    if (!e.device && e.thread == thread && e.end_ns >= e.start_ns) ops.push_back(&e);
  }
  std::sort(ops.begin(), ops.end(), [](const TraceEvent* a, const TraceEvent* b) {
    return a->start_ns != b->start_ns ? a->start_ns < b->start_ns : a->end_ns > b->end_ns;
  });
  struct Open {
    const TraceEvent* event;
    std::string category;  // the outermost categorised one on the way here ("" none; "idle" for a step)
    double children = 0;   // ns
  };
  std::vector<Open> stack;
  auto finish = [&](const Open& o) {
    const double self = static_cast<double>(o.event->end_ns - o.event->start_ns) - o.children;
    out.seconds[o.category.empty() ? "other" : o.category] += std::max(0.0, self) * 1e-9;
  };
  for (const TraceEvent* e : ops) {
    while (!stack.empty() && stack.back().event->end_ns <= e->start_ns) {
      const Open done = stack.back();
      stack.pop_back();
      finish(done);
    }
    const bool step = e->name.starts_with(kStepPrefix);
    if (!stack.empty()) stack.back().children += static_cast<double>(e->end_ns - e->start_ns);
    const bool in_step = step || std::any_of(stack.begin(), stack.end(),
                                             [](const Open& o) { return o.event->name.starts_with(kStepPrefix); });
    if (!in_step) continue;
    std::string category = step ? "idle" : "";
    for (const Open& o : stack) {
      if (!o.category.empty() && o.category != "idle") {
        category = o.category;
        break;
      }
    }
    if (!step && category.empty()) category = time_category(e->name);
    stack.push_back({e, category, 0});
  }
  while (!stack.empty()) {
    const Open done = stack.back();
    stack.pop_back();
    finish(done);
  }
  for (const TraceEvent* s : steps) out.window_seconds += static_cast<double>(s->end_ns - s->start_ns) * 1e-9;
  return out;
}

ProfilerAction cyclic_schedule(const ProfilerOptions& o, int64_t batch_in_epoch, std::optional<int64_t> dataloader_len,
                               int64_t resumption_batch_in_epoch) {
  const int64_t cycle = o.wait + o.warmup + o.active;
  const int64_t skip = o.skip_first + resumption_batch_in_epoch;
  if (batch_in_epoch < skip) return ProfilerAction::kSkip;
  if (o.repeat != 0 && batch_in_epoch >= cycle * o.repeat + skip) return ProfilerAction::kSkip;
  const int64_t position = (batch_in_epoch - skip) % cycle;
  if (position < o.wait) return ProfilerAction::kSkip;
  if (position < o.wait + o.warmup) return ProfilerAction::kWarmup;
  const bool last_in_epoch = dataloader_len && batch_in_epoch == *dataloader_len - 1;
  if (position == cycle - 1 || last_in_epoch) return ProfilerAction::kActiveAndSave;
  return ProfilerAction::kActive;
}

ProfilerOptions parse_profiler_options(config::Section& s) {
  ProfilerOptions o;
  config::Section sched = s.section("schedule");
  if (!sched.present()) s.fail("schedule", "missing required key (skip_first, wait, warmup, active, repeat)");
  o.skip_first = sched.get_int("skip_first", o.skip_first);
  o.wait = sched.get_int("wait", o.wait);
  o.warmup = sched.get_int("warmup", o.warmup);
  o.active = sched.get_int("active", o.active);
  o.repeat = sched.get_int("repeat", o.repeat);
  for (const auto& [key, value] : {std::pair<const char*, int64_t>{"skip_first", o.skip_first},
                                   {"wait", o.wait},
                                   {"warmup", o.warmup},
                                   {"repeat", o.repeat}}) {
    sched.check(value >= 0, key, "must not be negative");
  }
  sched.check(o.active >= 1, "active", "must be at least 1 (the batches recorded per cycle)");
  sched.finish();
  o.folder = s.get_string("torch_prof_folder", o.folder);
  s.check(!storage::is_remote(o.folder), "torch_prof_folder", "must be a local folder (traces are written locally)");
  o.filename = s.get_string("torch_prof_filename", o.filename);
  s.check(!o.filename.empty(), "torch_prof_filename", "must not be empty");
  o.overwrite = s.get_bool("torch_prof_overwrite", o.overwrite);
  o.record_shapes = s.get_bool("torch_prof_record_shapes", o.record_shapes);
  o.profile_memory = s.get_bool("torch_prof_profile_memory", o.profile_memory);
  o.with_stack = s.get_bool("torch_prof_with_stack", o.with_stack);
  o.with_flops = s.get_bool("torch_prof_with_flops", o.with_flops);
  o.num_traces_to_keep = s.get_int("torch_prof_num_traces_to_keep", o.num_traces_to_keep);
  s.check(o.num_traces_to_keep >= -1, "torch_prof_num_traces_to_keep", "must be -1 (all) or a count");
  // Composer's system profiler and upload names: off (false, null) is what Tessera does; on is not supported yet.
  for (const char* key : {"sys_prof_cpu", "sys_prof_memory", "sys_prof_disk", "sys_prof_net"}) {
    if (s.get_bool(key, false)) s.not_supported(key, "Composer's system profiler");
  }
  s.get_double("sys_prof_stats_thread_interval_seconds", 0.5);
  for (const char* key : {"torch_prof_remote_file_name", "torch_prof_memory_filename",
                          "torch_prof_memory_remote_file_name", "json_trace_handler"}) {
    if (s.has(key)) s.not_supported(key);
    s.raw(key);
  }
  if (s.get_bool("torch_prof_use_gzip", false)) s.not_supported("torch_prof_use_gzip");
  s.finish();
  return o;
}

std::shared_ptr<core::Callback> make_profiler(ProfilerOptions options, const core::RunContext& run) {
  return std::make_shared<Profiler>(std::move(options), run);
}

}  // namespace tessera::callbacks
