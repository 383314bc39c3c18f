// Trial runs of a job's configurations, their cache, and the model calibrated by them.
#include "tessera/planner/profiler.h"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "tessera/util/device.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"
#include "tessera/util/hashing.h"
#include "tessera/util/heartbeat.h"
#include "tessera/util/subprocess.h"

namespace tessera::planner {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  }
  return "unknown cpu";
}

// What a measurement depends on besides the job and the configuration.
std::string hardware(const Cluster& cluster) {
  if (cluster.device_kind == "cpu") return fmt::format("cpu: {} ({} cores)", cpu_model(), allowed_cpus().size());
  return fmt::format("{}: {}", cluster.device_kind, util::describe(util::device_info()));
}

// The steps between a trial's checkpoints: the job's interval when it is short enough to measure, else 0 (no saves).
int64_t trial_save_interval(const JobProfile& job, const ProfileOptions& o) {
  return job.save_interval_steps > 0 && job.save_interval_steps <= o.max_save_interval_steps ? job.save_interval_steps
                                                                                             : 0;
}

std::string cache_key(const JobSpec& spec, const JobProfile& job, const Candidate& c, const Cluster& cluster,
                      const ProfileOptions& o) {
  std::string material = util::read_file(spec.recipe, "plan");
  for (const std::string& s : spec.overrides) material += "\n" + s;
  material += fmt::format("\n{} devices {}\n{}\nwarmup {} measure {} s, {} steps, saves every {} steps", c.devices,
                          c.describe(), hardware(cluster), o.warmup_steps, o.measure_s, o.measure_steps,
                          trial_save_interval(job, o));
  return util::hex_digest("xxh64", material);
}

Json load_cache(const std::string& path) {
  if (path.empty() || !fs::exists(path)) return Json::object();
  try {
    Json j = Json::parse(util::read_file(path, "plan"));
    if (j.is_object()) return j;
  } catch (const std::exception& e) {
    spdlog::warn("[plan] profile cache {} is unreadable ({}); starting a new one", path, e.what());
  }
  return Json::object();
}

void save_cache(const std::string& path, const Json& cache) {
  if (path.empty()) return;
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path());
  util::write_file_atomically(path, cache.dump(1) + "\n", "plan");
}

std::string tail_of(const fs::path& log, size_t bytes) {
  std::ifstream in(log, std::ios::binary | std::ios::ate);
  if (!in) return "";
  const std::streamoff size = in.tellg();
  in.seekg(std::max<std::streamoff>(0, size - static_cast<std::streamoff>(bytes)));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// One trial of a wave, while it runs.
struct Running {
  Trial* trial = nullptr;
  const JobSpec* spec = nullptr;
  int64_t save_every = 0;  // steps between the trial's checkpoints (0: none); the measured stretch is whole intervals
  std::string key;
  fs::path dir;
  pid_t pid = -1;
  double launched = 0;                           // Unix time
  std::vector<std::pair<int64_t, double>> seen;  // (batch, Unix time) from rank 0's heartbeats
  std::optional<util::ExitStatus> exit;
};

// Reads rank 0's heartbeat ("<time> batch <N>"); records a batch not seen before.
void read_heartbeat(Running& r) {
  std::ifstream in(r.dir / "heartbeats" / "rank0");
  std::string time;
  std::string word;
  int64_t batch = -1;
  if (!(in >> time >> word >> batch) || word != "batch") return;
  if (r.seen.empty() || batch > r.seen.back().first) r.seen.emplace_back(batch, std::stod(time));
}

pid_t start_trial(Running& r, const Cluster& cluster, const ProfileOptions& o, const std::vector<int>& devices) {
  fs::remove_all(r.dir);
  fs::create_directories(r.dir / "heartbeats");
  const Candidate& c = r.trial->config;
  util::SpawnOptions s;
  s.argv = {o.train_bin, "--recipe", r.spec->recipe, "--nproc-per-node", std::to_string(c.devices)};
  s.argv.insert(s.argv.end(), r.spec->overrides.begin(), r.spec->overrides.end());
  for (const std::string& x : configuration_overrides(c)) s.argv.push_back(x);
  // Long enough never to end by itself: the wave stops it once measured.
  for (const char* x : {"max_duration=1000000000ba", "callbacks={}", "loggers={}", "eval_interval=1000000000ba",
                        "eval_first=false", "autoresume=false", "progress_bar=false", "log_to_console=false"}) {
    s.argv.emplace_back(x);
  }
  if (r.save_every > 0) {
    s.argv.push_back("save_folder=" + (r.dir / "ckpt").string());
    s.argv.push_back(fmt::format("save_interval={}ba", r.save_every));
  } else {
    s.argv.emplace_back("save_folder=null");
  }
  s.argv.push_back("run_name=trial-" + r.key);
  s.output_path = (r.dir / "trial.log").string();
  s.env.emplace_back(util::kHeartbeatDirEnv, (r.dir / "heartbeats").string());
  if (cluster.device_kind == "cpu") {
    s.cpus = devices;
    s.env.emplace_back("OMP_NUM_THREADS", "1");  // a device is a core: one rank, one thread
    s.env.emplace_back("CUDA_VISIBLE_DEVICES", "");
  } else {
    std::string visible;
    for (int d : devices) visible += fmt::format("{}{}", visible.empty() ? "" : ",", d);
    s.env.emplace_back("CUDA_VISIBLE_DEVICES", visible);
  }
  r.launched = unix_now();
  return util::spawn(s);
}

// The largest peak resident set (VmHWM) of process `pid` and its children (a launcher's ranks), in bytes.
double peak_rss_of_tree(pid_t pid) {
  const auto vm_hwm = [](const fs::path& proc) {
    std::ifstream in(proc / "status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) * 1024.0;  // kB
    }
    return 0.0;
  };
  double peak = vm_hwm(fs::path("/proc") / std::to_string(pid));
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "stat");
    std::string stat;
    std::getline(in, stat);
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    std::string state;
    pid_t parent = 0;
    rest >> state >> parent;
    if (parent == pid) peak = std::max(peak, vm_hwm(e.path()));
  }
  return peak;
}

// The first batch seen at or after Unix time `from`, if any.
const std::pair<int64_t, double>* first_after(const Running& r, double from) {
  for (const auto& b : r.seen) {
    if (b.second >= from) return &b;
  }
  return nullptr;
}

// The batches of the measured stretch from `first`: the most whole save intervals (whole batches without saves) seen
// so far.
int64_t stretch_batches(const Running& r, const std::pair<int64_t, double>& first) {
  const int64_t every = std::max<int64_t>(1, r.save_every);
  return (r.seen.back().first - first.first) / every * every;
}

// The Unix time at which `batch` was reached, interpolated between the heartbeats seen around it (the poll may miss
// a batch); `batch` lies within the batches seen.
double time_at(const Running& r, int64_t batch) {
  const auto after = std::lower_bound(r.seen.begin(), r.seen.end(), batch,
                                      [](const std::pair<int64_t, double>& b, int64_t x) { return b.first < x; });
  if (after->first == batch || after == r.seen.begin()) return after->second;
  const auto before = std::prev(after);
  const double f = static_cast<double>(batch - before->first) / static_cast<double>(after->first - before->first);
  return before->second + f * (after->second - before->second);
}

// Runs the trials of one wave side by side (`devices[i]`: trial i's devices) until each has `measure_steps` batches
// and `measure_s` seconds past the moment every one of them finished its warm-up, or until `time_limit_s`.
void run_wave(std::vector<Running>& wave, const std::vector<std::vector<int>>& devices, const Cluster& cluster,
              const ProfileOptions& o, double time_limit_s) {
  const auto started = Clock::now();
  for (size_t i = 0; i < wave.size(); ++i) wave[i].pid = start_trial(wave[i], cluster, o, devices[i]);
  double window = 0;  // Unix time from which every trial is past its warm-up; 0 until then
  bool measured = false;
  bool out_of_time = false;
  bool all_alive = true;
  while (!measured && !out_of_time && all_alive) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    bool all_warm = true;
    for (Running& r : wave) {
      read_heartbeat(r);
      if (!r.exit) r.exit = util::poll_exit(r.pid);
      all_alive = all_alive && !r.exit;
      all_warm = all_warm && !r.seen.empty() && r.seen.back().first >= o.warmup_steps;
    }
    if (all_warm && window == 0) window = unix_now();
    if (window > 0) {
      measured = unix_now() - window >= o.measure_s;
      for (const Running& r : wave) {
        const auto* first = first_after(r, window);
        const int64_t n = first == nullptr ? 0 : stretch_batches(r, *first);
        measured = measured && n >= o.measure_steps && n >= r.save_every;
      }
    }
    out_of_time = std::chrono::duration<double>(Clock::now() - started).count() > time_limit_s;
  }
  for (Running& r : wave) {
    Trial& t = *r.trial;
    if (!r.exit) {
      t.peak_rss_bytes = peak_rss_of_tree(r.pid);
      util::signal_group(r.pid, SIGKILL);  // its ranks follow (they die with their launcher)
      r.exit = util::wait_exit(r.pid);
    } else {
      t.error = fmt::format("`train` {} before it was measured (log: {}):\n{}", r.exit->describe(),
                            (r.dir / "trial.log").string(), tail_of(r.dir / "trial.log", 2000));
    }
    std::error_code ec;
    fs::remove_all(r.dir / "ckpt", ec);  // a trial's checkpoints are only there to be timed
    t.wall_s = unix_now() - r.launched;
    t.peak_rss_bytes = std::max(t.peak_rss_bytes, r.exit->max_rss_bytes);
    if (!t.error.empty()) continue;
    if (!measured) {
      t.error = out_of_time ? fmt::format("stopped after {:.0f} s, the budget left (log: {})", time_limit_s,
                                          (r.dir / "trial.log").string())
                            : "stopped when another trial of its wave failed";
      continue;
    }
    // The measured stretch: from the first batch seen after the window opened, over whole save intervals.
    const auto* first = first_after(r, window);
    const int64_t n = stretch_batches(r, *first);
    t.step_s = (time_at(r, first->first + n) - first->second) / static_cast<double>(n);
    const auto& early = r.seen.front();
    t.startup_s = std::max(0.0, early.second - r.launched - static_cast<double>(early.first) * t.step_s);
    t.ok = t.step_s > 0;
    if (!t.ok) t.error = "measured no time per step";
  }
}

// Configurations to try, in order: per device count (ascending), the model's fastest `per_device_count`.
std::vector<Candidate> to_try(const std::vector<Candidate>& all, int64_t per_device_count) {
  std::map<int64_t, std::vector<Candidate>> by_devices;
  for (const Candidate& c : all) by_devices[c.devices].push_back(c);
  std::vector<Candidate> out;
  for (auto& [devices, list] : by_devices) {
    std::stable_sort(list.begin(), list.end(), [](const Candidate& a, const Candidate& b) {
      if (a.step_s != b.step_s) return a.step_s < b.step_s;
      return a.microbatch > b.microbatch;
    });
    for (size_t i = 0; i < list.size() && static_cast<int64_t>(i) < per_device_count; ++i) out.push_back(list[i]);
  }
  return out;
}

bool same_configuration(const Candidate& a, const Candidate& b) {
  return a.devices == b.devices && a.strategy == b.strategy &&
         a.activation_checkpointing == b.activation_checkpointing && a.microbatch == b.microbatch;
}

// The job's configurations: the profiled ones measured, the rest from the model with its compute rate scaled so that
// it predicts the job's profiled configuration on the fewest devices (where communication matters least), and the
// median measured startup.
std::vector<Candidate> calibrate(const JobProfile& job, const Cluster& cluster, const std::vector<Candidate>& all,
                                 const std::vector<Trial>& trials) {
  const Trial* anchor = nullptr;
  std::vector<double> startups;
  for (const Trial& t : trials) {
    if (!t.ok) continue;
    startups.push_back(t.startup_s);
    if (anchor == nullptr || t.config.devices < anchor->config.devices) anchor = &t;
  }
  Cluster calibrated = cluster;
  if (anchor != nullptr) {
    // step = compute + max(0, comm - overlap * compute): the compute that gives the measured step.
    const Candidate& m = anchor->config;
    double compute = anchor->step_s;
    if (m.communication_s > cluster.overlap * compute) {
      compute = (anchor->step_s - m.communication_s) / (1 - cluster.overlap);
    }
    if (compute > 0 && m.compute_s > 0) calibrated.mfu = cluster.mfu * m.compute_s / compute;
    std::sort(startups.begin(), startups.end());
    calibrated.startup_s = startups[startups.size() / 2];
  }
  std::vector<Candidate> out;
  for (const Candidate& c : all) {
    Candidate x = model_candidate(job, calibrated, c.devices, c.strategy, c.activation_checkpointing, c.microbatch,
                                  c.tensor_parallel, c.context_parallel);
    for (const Trial& t : trials) {
      if (!same_configuration(t.config, c)) continue;
      if (!t.ok) {
        x.fits = false;  // it failed to run here: never chosen
        break;
      }
      x.profiled = true;
      x.step_s = t.step_s;
      x.startup_s = t.startup_s;
      x.duration_s = x.startup_s + static_cast<double>(job.steps) * x.step_s;
      // On CPU the measured peak decides over the estimate.
      if (cluster.device_kind == "cpu" && t.peak_rss_bytes > cluster.memory_bytes * cluster.usable_memory) {
        x.fits = false;
      }
    }
    out.push_back(x);
  }
  return out;
}

}  // namespace

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.push_back(c);
  }
  return out;
}

std::vector<std::string> configuration_overrides(const Candidate& c) {
  return {fmt::format("fsdp_config.sharding_strategy={}", dist::to_string(c.strategy)),
          fmt::format("fsdp_config.activation_checkpointing={}", c.activation_checkpointing ? "true" : "false"),
          fmt::format("device_train_microbatch_size={}", c.microbatch)};
}

std::vector<std::vector<Candidate>> profile_jobs(const std::vector<JobSpec>& specs, const std::vector<JobProfile>& jobs,
                                                 const Cluster& cluster, const ProfileOptions& o,
                                                 ProfileReport& report) {
  if (cluster.nodes != 1) {
    throw ConfigError("plan", fmt::format("profiling runs trials on this machine: the cluster has {} nodes (describe "
                                          "one node, or plan without --profile)",
                                          cluster.nodes));
  }
  std::vector<int> devices = o.cpus.empty() ? allowed_cpus() : o.cpus;
  if (cluster.device_kind != "cpu") {
    devices.clear();
    for (int d = 0; d < util::device_info().cuda_devices; ++d) devices.push_back(d);
  }
  if (static_cast<int64_t>(devices.size()) < cluster.devices_per_node) {
    throw ConfigError("plan", fmt::format("the cluster has {} {} devices per node, this machine offers {}",
                                          cluster.devices_per_node, cluster.device_kind, devices.size()));
  }
  devices.resize(static_cast<size_t>(cluster.devices_per_node));

  // Every job's trials; the cached ones are known already.
  Json cache = load_cache(o.cache_path);
  std::vector<std::vector<Candidate>> all(jobs.size());
  std::vector<std::vector<Trial>> trials(jobs.size());
  std::vector<std::vector<std::string>> keys(jobs.size());
  for (size_t j = 0; j < jobs.size(); ++j) {
    all[j] = enumerate_candidates(jobs[j], cluster);
    for (const Candidate& c : to_try(all[j], o.per_device_count)) {
      Trial t;
      t.job = specs[j].name;
      t.config = c;
      const std::string key = cache_key(specs[j], jobs[j], c, cluster, o);
      if (cache.contains(key)) {
        const Json& hit = cache[key];
        t.cached = true;
        t.ok = hit.value("ok", false);
        t.step_s = hit.value("step_s", 0.0);
        t.startup_s = hit.value("startup_s", 0.0);
        t.peak_rss_bytes = hit.value("peak_rss_bytes", 0.0);
        t.error = hit.value("error", std::string());
      }
      trials[j].push_back(t);
      keys[j].push_back(key);
    }
  }
  // Waves: the widest trials first, each wave filled with what fits on the devices left (first fit).
  std::vector<std::pair<size_t, size_t>> todo;  // (job, trial)
  for (size_t j = 0; j < jobs.size(); ++j) {
    for (size_t k = 0; k < trials[j].size(); ++k) {
      if (!trials[j][k].cached) todo.emplace_back(j, k);
    }
  }
  std::stable_sort(todo.begin(), todo.end(), [&](const auto& a, const auto& b) {
    return trials[a.first][a.second].config.devices > trials[b.first][b.second].config.devices;
  });
  std::vector<bool> started(todo.size(), false);
  for (size_t first = 0; first < todo.size(); ++first) {
    if (started[first]) continue;
    const double left = o.budget_s - report.spent_s;
    if (left <= 0) {
      report.budget_exhausted = true;
      break;
    }
    std::vector<Running> wave;
    std::vector<std::vector<int>> slices;
    size_t used = 0;
    for (size_t i = first; i < todo.size(); ++i) {
      const auto [j, k] = todo[i];
      const size_t need = static_cast<size_t>(trials[j][k].config.devices);
      if (started[i] || used + need > devices.size()) continue;
      started[i] = true;
      Running r;
      r.trial = &trials[j][k];
      r.spec = &specs[j];
      r.save_every = trial_save_interval(jobs[j], o);
      r.key = keys[j][k];
      r.dir = fs::path(o.work_dir) / "trials" / fmt::format("{}-{}", specs[j].name, r.key);
      wave.push_back(std::move(r));
      slices.emplace_back(devices.begin() + static_cast<std::ptrdiff_t>(used),
                          devices.begin() + static_cast<std::ptrdiff_t>(used + need));
      used += need;
    }
    std::string what;
    for (const Running& r : wave) {
      what += fmt::format("{}{} on {} ({})", what.empty() ? "" : "; ", r.trial->job, r.trial->config.devices,
                          r.trial->config.describe());
    }
    spdlog::info("[plan] trials side by side: {}", what);
    const auto t0 = Clock::now();
    run_wave(wave, slices, cluster, o, left);
    report.spent_s += std::chrono::duration<double>(Clock::now() - t0).count();
    for (const Running& r : wave) {
      const Trial& t = *r.trial;
      if (!t.ok) {
        spdlog::warn("[plan] trial of {} ({} devices, {}) failed: {}", t.job, t.config.devices, t.config.describe(),
                     t.error);
      }
      if (!t.ok && t.error.rfind("stopped ", 0) == 0) continue;  // cut short: it says nothing; not cached
      cache[r.key] = {{"job", t.job},
                      {"devices", t.config.devices},
                      {"configuration", t.config.describe()},
                      {"ok", t.ok},
                      {"step_s", t.step_s},
                      {"startup_s", t.startup_s},
                      {"peak_rss_bytes", t.peak_rss_bytes},
                      {"error", t.error},
                      {"hardware", hardware(cluster)}};
    }
    save_cache(o.cache_path, cache);
  }

  std::vector<std::vector<Candidate>> out(jobs.size());
  for (size_t j = 0; j < jobs.size(); ++j) {
    std::vector<Trial> known;  // cached or run (not those the budget left out)
    for (const Trial& t : trials[j]) {
      if (t.cached || t.wall_s > 0) known.push_back(t);
    }
    out[j] = calibrate(jobs[j], cluster, all[j], known);
    for (Trial& t : known) {
      for (const Candidate& x : out[j]) {
        if (x.profiled && same_configuration(t.config, x)) t.config.modelled_step_s = x.modelled_step_s;
      }
      report.trials.push_back(t);
    }
  }
  // The calibrated model's error at every profiled point.
  double sum = 0;
  double largest = 0;
  int n = 0;
  for (const Trial& t : report.trials) {
    if (!t.ok || t.config.modelled_step_s <= 0) continue;
    const double e = std::abs(t.config.modelled_step_s - t.step_s) / t.step_s;
    sum += e;
    largest = std::max(largest, e);
    ++n;
  }
  report.model_error_mean = n > 0 ? sum / n : 0;
  report.model_error_max = largest;
  return out;
}

}  // namespace tessera::planner
