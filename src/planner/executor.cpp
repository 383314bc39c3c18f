// The plan's executor: jobs started on their devices at their planned times, watched, and re-planned.
#include "tessera/planner/executor.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "tessera/checkpoint/checkpoint.h"
#include "tessera/planner/profiler.h"
#include "tessera/util/device.h"
#include "tessera/util/error.h"
#include "tessera/util/nvml.h"
#include "tessera/util/preemption.h"
#include "tessera/util/subprocess.h"

namespace tessera::planner {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

enum class State { kPending, kRunning, kStopping, kDone, kFailed };

// What the executor knows of one job.
struct Live {
  State state = State::kPending;
  // Where and when it is to run next (physical devices, seconds since the start); option -1: not placed.
  int option = -1;
  std::vector<int64_t> devices;
  double plan_start = 0;
  double plan_end = 0;
  // The attempt that runs (or is stopping), on run_devices; its metrics start at metrics_offset of the job's file.
  pid_t pid = -1;
  int run_option = -1;
  std::vector<int64_t> run_devices;
  std::streamoff metrics_offset = 0;
  double started = 0;
  int64_t first_seen_step = -1;  // the first batch its metrics showed, and when
  double first_seen_at = 0;
  int64_t last_step = 0;
  std::string stop_reason;
  bool stop_killed = false;  // stopped with SIGKILL (its device was lost), not asked to checkpoint
  int retries = 0;
  std::vector<ExecAttempt> attempts;
};

// The batch of the newest published checkpoint in `folder` (0 when there is none).
int64_t checkpoint_step(const std::string& folder) {
  if (!fs::exists(folder)) return 0;
  static const std::regex kBatch("ba([0-9]+)$");
  for (const std::string& dir : checkpoint::checkpoint_candidates(folder, "latest")) {
    std::smatch m;
    const std::string name = fs::path(dir).filename().string();
    if (std::regex_search(name, m, kBatch)) return std::stoll(m[1].str());
  }
  return 0;
}

std::streamoff size_of(const fs::path& p) {
  std::error_code ec;
  const auto n = fs::file_size(p, ec);
  return ec ? 0 : static_cast<std::streamoff>(n);
}

// The last batch a metrics.jsonl names after byte `offset` (-1 when none); reads only the file's tail.
int64_t last_logged_batch(const fs::path& metrics, std::streamoff offset) {
  std::ifstream in(metrics, std::ios::binary | std::ios::ate);
  if (!in) return -1;
  const std::streamoff size = in.tellg();
  const std::streamoff from = std::max<std::streamoff>(offset, size - 4096);
  if (from >= size) return -1;
  in.seekg(from);
  std::string tail(static_cast<size_t>(size - from), '\0');
  in.read(tail.data(), static_cast<std::streamsize>(tail.size()));
  const size_t at = tail.rfind("\"batch\":");
  if (at == std::string::npos) return -1;
  return std::strtoll(tail.c_str() + at + 8, nullptr, 10);
}

template <typename T>
std::string device_list(const std::vector<T>& devices) {
  std::string out;
  for (T d : devices) out += fmt::format("{}{}", out.empty() ? "" : ",", d);
  return out;
}

constexpr int64_t kHardwareXids[] = {48, 63, 64, 74, 79, 92, 94, 95, 119, 120};

class Executor {
 public:
  Executor(const std::vector<ExecJob>& jobs, const Cluster& cluster, const ExecOptions& o)
      : jobs_(jobs), cluster_(cluster), o_(o), live_(jobs.size()), t0_(Clock::now()) {
    if (cluster.nodes != 1) {
      throw ConfigError("plan", fmt::format("--run runs jobs on this machine: the cluster has {} nodes (describe this "
                                            "machine as one node)",
                                            cluster.nodes));
    }
    cpu_ = cluster.device_kind == "cpu";
    if (!o.devices.empty()) {
      phys_ = o.devices;
    } else if (cpu_) {
      phys_ = allowed_cpus();
    } else {
      for (int d = 0; d < util::device_info().cuda_devices; ++d) phys_.push_back(d);
    }
    if (static_cast<int64_t>(phys_.size()) < cluster.devices_per_node) {
      throw ConfigError("plan", fmt::format("the cluster has {} {} devices, this machine offers {}",
                                            cluster.devices_per_node, cluster.device_kind, phys_.size()));
    }
    phys_.resize(static_cast<size_t>(cluster.devices_per_node));
    if (!cpu_ && !phys_.empty()) {
      // GPU loss detection: NVML, read once a second for each GPU the plan holds.
      std::string why;
      nvml_ = util::Nvml::open(&why);
      if (nvml_ == nullptr) spdlog::warn("[plan] NVML unavailable ({}): lost GPUs will not be detected", why);
      const int most = *std::max_element(phys_.begin(), phys_.end());
      bus_ids_.resize(static_cast<size_t>(most) + 1);
      ecc_.assign(static_cast<size_t>(most) + 1, -1);
      for (int d : phys_) bus_ids_[static_cast<size_t>(d)] = util::cuda_pci_bus_id(d);
    }
  }

  ~Executor() {
    for (Live& l : live_) {
      if (l.pid > 0) {
        util::signal_group(l.pid, SIGKILL);
        util::wait_exit(l.pid);
      }
    }
  }
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  ExecReport run(const Schedule& plan) {
    ExecReport report;
    report.planned_makespan_s = plan.makespan_s();
    for (const Placement& p : plan.placements) {
      Live& l = live_[static_cast<size_t>(p.job)];
      l.option = p.option;
      for (int64_t d : p.devices) l.devices.push_back(phys_[static_cast<size_t>(d)]);
      l.plan_start = p.start_s;
      l.plan_end = p.end_s;
    }
    for (size_t i = 0; i < jobs_.size(); ++i) {
      fs::create_directories(job_dir(i));
      report.jobs.push_back({jobs_[i].spec.name,
                             live_[i].plan_start,
                             live_[i].plan_end,
                             0,
                             0,
                             false,
                             {},
                             jobs_[i].plan.profile.deadline_s});
    }
    event(fmt::format("plan: {} jobs on devices {}, makespan {:.1f} s", jobs_.size(), device_list(phys_),
                      plan.makespan_s()));
    bool replan_needed = false;
    double last_replan = -1e9;
    while (std::any_of(live_.begin(), live_.end(),
                       [](const Live& l) { return l.state != State::kDone && l.state != State::kFailed; })) {
      const double now = elapsed();
      if (cpu_ ? lose_devices() : lose_gpus(now)) replan_needed = true;
      for (size_t i = 0; i < live_.size(); ++i) replan_needed = reap(i, now) || replan_needed;
      // Departures of running jobs from their planned ends, at most one re-plan every few seconds.
      if (o_.replan && now - last_replan > 5) {
        for (size_t i = 0; i < live_.size(); ++i) {
          const Live& l = live_[i];
          if (l.state != State::kRunning) continue;
          const double predicted = now + remaining_s(i, now);
          if (departs(l, predicted)) {
            event(fmt::format("{} is predicted to end at {:.1f} s, planned {:.1f} s", name(i), predicted, l.plan_end));
            replan_needed = true;
            break;
          }
        }
      }
      const bool stopping =
          std::any_of(live_.begin(), live_.end(), [](const Live& l) { return l.state == State::kStopping; });
      const bool unplaced = std::any_of(live_.begin(), live_.end(),
                                        [](const Live& l) { return l.state == State::kPending && l.option < 0; });
      // Without re-planning, the plan is solved again only when a job lost its devices.
      if (((replan_needed && o_.replan) || unplaced) && !stopping) {
        replan(now);
        ++report.replans;
        replan_needed = false;
        last_replan = now;
      }
      for (size_t i = 0; i < live_.size(); ++i) maybe_start(i, elapsed());
      std::this_thread::sleep_for(std::chrono::duration<double>(o_.poll_s));
    }
    report.ok = true;
    for (size_t i = 0; i < live_.size(); ++i) {
      ExecJobReport& r = report.jobs[i];
      r.attempts = live_[i].attempts;
      r.done = live_[i].state == State::kDone;
      report.ok = report.ok && r.done;
      if (!r.attempts.empty()) {
        r.start_s = r.attempts.front().start_s;
        r.end_s = r.attempts.back().end_s;
        report.makespan_s = std::max(report.makespan_s, r.end_s);
      }
    }
    report.events = events_;
    return report;
  }

 private:
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }
  const std::string& name(size_t i) const { return jobs_[i].spec.name; }
  fs::path job_dir(size_t i) const { return fs::path(o_.work_dir) / name(i); }
  std::string ckpt_dir(size_t i) const { return (job_dir(i) / "ckpt").string(); }
  fs::path metrics_path(size_t i) const { return job_dir(i) / "metrics.jsonl"; }
  const Candidate& option(size_t i, int o) const { return jobs_[i].plan.options[static_cast<size_t>(o)]; }

  void event(const std::string& what) {
    const std::string line = fmt::format("[{:7.1f} s] {}", elapsed(), what);
    spdlog::info("[plan] {}", line);
    events_.push_back(line);
  }

  bool departs(const Live& l, double end) const {
    const double allowed = std::max(o_.min_departure_s, o_.tolerance * (l.plan_end - l.plan_start));
    return std::abs(end - l.plan_end) > allowed;
  }

  int64_t remaining_steps(size_t i, int64_t done) const {
    return std::max<int64_t>(0, jobs_[i].plan.profile.steps - done);
  }

  // Seconds a running job still needs: its startup left, then its steps at the rate it shows (once it has shown a
  // few steps; its option's step time before that).
  double remaining_s(size_t i, double now) {
    Live& l = live_[i];
    const int64_t step = last_logged_batch(metrics_path(i), l.metrics_offset);
    if (step >= 0 && step != l.last_step) {
      l.last_step = step;
      if (l.first_seen_step < 0) {
        l.first_seen_step = step;
        l.first_seen_at = now;
      }
    }
    const Candidate& c = option(i, l.run_option);
    double per_step = c.step_s;
    if (l.first_seen_step >= 0 && l.last_step - l.first_seen_step >= 3) {
      per_step = (now - l.first_seen_at) / static_cast<double>(l.last_step - l.first_seen_step);
    }
    const double startup_left = l.first_seen_step < 0 ? std::max(0.0, l.started + c.startup_s - now) : 0.0;
    return startup_left + static_cast<double>(remaining_steps(i, std::max<int64_t>(l.last_step, 0))) * per_step;
  }

  // Devices that left this process's CPU affinity set: their jobs are stopped, and they are planned on no more.
  bool lose_devices() {
    const std::vector<int> allowed = allowed_cpus();
    std::vector<int> lost;
    for (int d : phys_) {
      if (std::find(allowed.begin(), allowed.end(), d) == allowed.end()) lost.push_back(d);
    }
    if (lost.empty()) return false;
    drop_devices(lost,
                 fmt::format("device{} {} left this process's CPU set", lost.size() == 1 ? "" : "s", device_list(lost)),
                 /*kill=*/false);
    return true;
  }

  // GPUs NVML reads as lost or failing (gpu_loss_reason): their jobs are killed (a failing GPU cannot be trusted to
  // save), resume from their latest checkpoints elsewhere, and the GPUs are planned on no more.
  bool lose_gpus(double now) {
    if (nvml_ == nullptr || now - last_gpu_read_ < 1.0) return false;
    last_gpu_read_ = now;
    std::vector<int> lost;
    std::vector<std::string> why;
    for (int d : phys_) {
      const size_t at = static_cast<size_t>(d);
      if (at >= bus_ids_.size() || bus_ids_[at].empty()) continue;
      std::string reason;
      try {
        const util::GpuHealth h = nvml_->read(bus_ids_[at]);
        reason = gpu_loss_reason(h, ecc_[at]);
        ecc_[at] = h.ecc_uncorrected;
      } catch (const Error& e) {
        if (nvml_error_means_gpu_lost(e.what())) {
          reason = e.what();
        } else if (!nvml_warned_) {
          spdlog::warn("[plan] reading GPU {} through NVML: {}", d, e.what());
          nvml_warned_ = true;
        }
      }
      if (!reason.empty()) {
        lost.push_back(d);
        why.push_back(fmt::format("GPU {} ({}): {}", d, bus_ids_[at], reason));
      }
    }
    if (lost.empty()) return false;
    drop_devices(lost, fmt::format("lost {}", fmt::join(why, "; ")), /*kill=*/true);
    return true;
  }

  // Takes `lost` out of the plan: the jobs running on them are stopped (killed with `kill`), the pending ones placed
  // there are placed again.
  void drop_devices(const std::vector<int>& lost, const std::string& what, bool kill) {
    for (int d : lost) phys_.erase(std::find(phys_.begin(), phys_.end(), d));
    event(fmt::format("{}; {} left", what, phys_.size()));
    for (size_t i = 0; i < live_.size(); ++i) {
      Live& l = live_[i];
      const std::vector<int64_t>& held = l.state == State::kPending ? l.devices : l.run_devices;
      const bool hit = std::any_of(held.begin(), held.end(),
                                   [&](int64_t d) { return std::find(lost.begin(), lost.end(), d) != lost.end(); });
      if (!hit) continue;
      if (l.state == State::kRunning) {
        stop(i, "device lost", kill);
        l.option = -1;
      } else if (l.state == State::kPending) {
        l.option = -1;
      }
    }
  }

  // SIGTERM: `train` saves a checkpoint and exits 75 (preemption). SIGKILL (`kill`): it resumes from its latest.
  void stop(size_t i, const std::string& reason, bool kill = false) {
    Live& l = live_[i];
    l.state = State::kStopping;
    l.stop_reason = reason;
    l.stop_killed = kill;
    util::signal_group(l.pid, kill ? SIGKILL : SIGTERM);
    event(fmt::format("{}: {} it ({}); {}", name(i), kill ? "killing" : "stopping", reason,
                      kill ? "it resumes from its latest checkpoint" : "it saves a checkpoint"));
  }

  // Whether job i's attempt ended and the plan needs revisiting.
  bool reap(size_t i, double now) {
    Live& l = live_[i];
    if (l.state != State::kRunning && l.state != State::kStopping) return false;
    const std::optional<util::ExitStatus> st = util::poll_exit(l.pid);
    if (!st) return false;
    l.pid = -1;
    ExecAttempt& a = l.attempts.back();
    a.end_s = now;
    a.to_step = std::max<int64_t>(a.from_step, last_logged_batch(metrics_path(i), l.metrics_offset));
    if (st->code == 0) {
      l.state = State::kDone;
      a.outcome = "done";
      event(fmt::format("{} done (planned end {:.1f} s)", name(i), l.plan_end));
      return o_.replan && departs(l, now);
    }
    const bool stopped = l.state == State::kStopping && (st->code == util::kExitPreempted || l.stop_killed);
    a.outcome = stopped ? l.stop_reason : "failed: " + st->describe();
    if (!stopped) {
      if (l.retries >= o_.max_retries) {
        l.state = State::kFailed;
        event(fmt::format("{} {} after {} restarts: given up (log: {})", name(i), st->describe(), l.retries,
                          (job_dir(i) / fmt::format("attempt-{}.log", l.attempts.size())).string()));
        return o_.replan;
      }
      ++l.retries;
      event(fmt::format("{} {}; it will resume from its checkpoint (restart {}/{})", name(i), st->describe(), l.retries,
                        o_.max_retries));
      if (!o_.replan) l.plan_start = now;  // again where it was, at once
    }
    l.state = State::kPending;
    return stopped ? l.option < 0 : o_.replan;
  }

  void maybe_start(size_t i, double now) {
    Live& l = live_[i];
    if (l.state != State::kPending || l.option < 0 || now + 1e-3 < l.plan_start) return;
    for (int64_t d : l.devices) {
      if (std::find(phys_.begin(), phys_.end(), d) == phys_.end()) return;
      for (const Live& other : live_) {
        if ((other.state == State::kRunning || other.state == State::kStopping) &&
            std::find(other.run_devices.begin(), other.run_devices.end(), d) != other.run_devices.end()) {
          return;
        }
      }
    }
    const Candidate& c = option(i, l.option);
    const ExecJob& j = jobs_[i];
    util::SpawnOptions s;
    s.argv = {o_.train_bin, "--recipe", j.spec.recipe, "--nproc-per-node", std::to_string(l.devices.size())};
    s.argv.insert(s.argv.end(), j.spec.overrides.begin(), j.spec.overrides.end());
    if (!j.spec.max_duration.empty()) s.argv.push_back("max_duration=" + j.spec.max_duration);
    for (const std::string& x : configuration_overrides(c)) s.argv.push_back(x);
    s.argv.push_back("run_name=" + j.spec.name);
    s.argv.push_back("save_folder=" + ckpt_dir(i));
    s.argv.push_back("autoresume=true");
    s.argv.push_back(fmt::format("loggers.jsonl={{filename: {}}}", metrics_path(i).string()));
    s.argv.insert(s.argv.end(), o_.overrides.begin(), o_.overrides.end());
    s.output_path = (job_dir(i) / fmt::format("attempt-{}.log", l.attempts.size() + 1)).string();
    if (cpu_) {
      for (int64_t d : l.devices) s.cpus.push_back(static_cast<int>(d));
      s.env.emplace_back("OMP_NUM_THREADS", "1");
      s.env.emplace_back("CUDA_VISIBLE_DEVICES", "");
    } else {
      s.env.emplace_back("CUDA_VISIBLE_DEVICES", device_list(l.devices));
    }
    l.metrics_offset = size_of(metrics_path(i));
    l.pid = util::spawn(s);
    l.state = State::kRunning;
    l.run_option = l.option;
    l.run_devices = l.devices;
    l.started = now;
    l.first_seen_step = -1;
    ExecAttempt a;
    a.devices = l.devices;
    a.configuration = c.describe();
    a.start_s = now;
    a.from_step = checkpoint_step(ckpt_dir(i));
    l.last_step = a.from_step;
    l.attempts.push_back(a);
    event(fmt::format("{} started on device{} {} ({}, from batch {}; planned start {:.1f} s)", name(i),
                      l.devices.size() == 1 ? "" : "s", device_list(l.devices), c.describe(), a.from_step,
                      l.plan_start));
  }

  // Solves what is left: pending jobs from their checkpoints, running jobs either going on where they run or moved.
  void replan(double now) {
    Cluster c = cluster_;
    c.devices_per_node = static_cast<int64_t>(phys_.size());
    std::vector<PlanJob> problem;
    std::vector<size_t> which;                // problem job -> live job
    std::vector<std::vector<int>> option_of;  // problem option -> the job's option
    for (size_t i = 0; i < live_.size(); ++i) {
      Live& l = live_[i];
      if (l.state != State::kPending && l.state != State::kRunning) continue;
      PlanJob p;
      p.profile = jobs_[i].plan.profile;
      p.profile.deadline_s -= now;  // the new plan's time 0 is now (a deadline already past still counts lateness)
      std::vector<int> map;
      int64_t done = checkpoint_step(ckpt_dir(i));
      if (l.state == State::kRunning) {
        Candidate go_on = option(i, l.run_option);
        go_on.duration_s = std::max(1e-3, remaining_s(i, now));
        p.options.push_back(go_on);
        map.push_back(l.run_option);
        p.running_option = 0;
        for (int64_t d : l.run_devices) {
          p.running_devices.push_back(std::find(phys_.begin(), phys_.end(), d) - phys_.begin());
        }
        done = std::max(done, l.last_step);
      }
      p.profile.steps = remaining_steps(i, done);
      for (size_t o = 0; o < jobs_[i].plan.options.size(); ++o) {
        Candidate x = jobs_[i].plan.options[o];
        if (x.devices > c.devices_per_node) continue;
        if (l.state == State::kRunning && x.devices == option(i, l.run_option).devices) continue;  // a pointless move
        x.duration_s = x.startup_s + static_cast<double>(p.profile.steps) * x.step_s;
        p.options.push_back(x);
        map.push_back(static_cast<int>(o));
      }
      if (p.options.empty()) {
        l.state = State::kFailed;
        event(fmt::format("{} fits on none of the {} devices left: given up", name(i), phys_.size()));
        continue;
      }
      problem.push_back(std::move(p));
      which.push_back(i);
      option_of.push_back(std::move(map));
    }
    if (problem.empty()) return;
    Schedule s;
    try {
      s = solve_milp(problem, c, o_.solve).schedule;
    } catch (const Error& e) {
      spdlog::warn("[plan] re-plan: {}; using the greedy schedule", e.what());
      s = greedy_schedule(problem, c);
    }
    for (const Placement& p : s.placements) {
      const size_t i = which[static_cast<size_t>(p.job)];
      Live& l = live_[i];
      const int o = option_of[static_cast<size_t>(p.job)][static_cast<size_t>(p.option)];
      const bool goes_on = problem[static_cast<size_t>(p.job)].running_option == p.option;
      std::vector<int64_t> devices;
      for (int64_t d : p.devices) devices.push_back(phys_[static_cast<size_t>(d)]);
      if (l.state == State::kRunning && !goes_on) {
        stop(i, fmt::format("moved to device{} {} ({})", devices.size() == 1 ? "" : "s", device_list(devices),
                            option(i, o).describe()));
      }
      l.option = o;
      l.devices = goes_on ? l.run_devices : devices;
      l.plan_start = now + p.start_s;
      l.plan_end = now + p.end_s;
    }
    event(fmt::format("re-planned {} job{} on {} devices: makespan {:.1f} s", problem.size(),
                      problem.size() == 1 ? "" : "s", phys_.size(), now + s.makespan_s()));
  }

  const std::vector<ExecJob>& jobs_;
  Cluster cluster_;
  ExecOptions o_;
  std::vector<Live> live_;
  std::vector<int> phys_;  // the devices left, physical ids; planner device d is phys_[d]
  bool cpu_ = true;
  std::unique_ptr<util::Nvml> nvml_;  // GPUs: null without NVML
  std::vector<std::string> bus_ids_;  // by physical GPU id: its PCI bus id (NVML's name for it)
  std::vector<int64_t> ecc_;          // by physical GPU id: uncorrected ECC errors at the last read (-1: unknown)
  double last_gpu_read_ = -1e9;
  bool nvml_warned_ = false;
  Clock::time_point t0_;
  std::vector<std::string> events_;
};

}  // namespace

std::string gpu_loss_reason(const util::GpuHealth& health, int64_t ecc_before) {
  std::vector<int64_t> hardware;
  for (int64_t x : health.xids) {
    if (std::find(std::begin(kHardwareXids), std::end(kHardwareXids), x) != std::end(kHardwareXids)) {
      hardware.push_back(x);
    }
  }
  if (!hardware.empty()) {
    return fmt::format("XID {} (a hardware error)", fmt::join(hardware, ", "));
  }
  if (ecc_before >= 0 && health.ecc_uncorrected > ecc_before) {
    return fmt::format("uncorrected ECC errors rose from {} to {}", ecc_before, health.ecc_uncorrected);
  }
  return "";
}

bool nvml_error_means_gpu_lost(const std::string& message) {
  // NVML_ERROR_GPU_IS_LOST is 15; NVML_ERROR_NOT_FOUND (6) from the handle lookup: the bus id names no GPU now.
  return message.find("(error 15)") != std::string::npos ||
         (message.find("nvmlDeviceGetHandleByPciBusId") != std::string::npos &&
          message.find("(error 6)") != std::string::npos);
}

ExecReport execute_plan(const std::vector<ExecJob>& jobs, const Cluster& cluster, const Schedule& plan,
                        const ExecOptions& options) {
  Executor e(jobs, cluster, options);
  return e.run(plan);
}

std::string render_report(const ExecReport& r) {
  std::string out = fmt::format("{:<24}{:>16}{:>16}{:>10}  {}\n", "job", "planned", "actual", "attempts", "timeline");
  for (const ExecJobReport& j : r.jobs) {
    std::string timeline;
    for (const ExecAttempt& a : j.attempts) {
      timeline += fmt::format("{}[{:.1f}-{:.1f} s dev {} {}, ba {}-{}: {}]", timeline.empty() ? "" : " ", a.start_s,
                              a.end_s, device_list(a.devices), a.configuration, a.from_step, a.to_step, a.outcome);
    }
    out += fmt::format("{:<24}{:>16}{:>16}{:>10}  {}\n", j.name,
                       fmt::format("{:.1f}-{:.1f} s", j.planned_start_s, j.planned_end_s),
                       j.attempts.empty() ? std::string("-") : fmt::format("{:.1f}-{:.1f} s", j.start_s, j.end_s),
                       j.attempts.size(), timeline);
  }
  out += fmt::format("makespan: planned {:.1f} s, actual {:.1f} s ({:+.1f}%){}; {} re-plan{}\n", r.planned_makespan_s,
                     r.makespan_s, 100 * (r.makespan_s / r.planned_makespan_s - 1), r.ok ? "" : ", NOT every job done",
                     r.replans, r.replans == 1 ? "" : "s");
  int with = 0;
  std::vector<std::string> late;
  for (const ExecJobReport& j : r.jobs) {
    if (j.deadline_s == std::numeric_limits<double>::infinity()) continue;
    ++with;
    if (!j.done || j.end_s > j.deadline_s) {
      late.push_back(j.done ? fmt::format("{} ended at {:.1f} s, {:.1f} s after its deadline", j.name, j.end_s,
                                          j.end_s - j.deadline_s)
                            : fmt::format("{} did not finish", j.name));
    }
  }
  if (with > 0) {
    out += late.empty() ? fmt::format("deadlines: all {} met\n", with)
                        : fmt::format("deadlines: {} of {} missed: {}\n", late.size(), with, fmt::join(late, "; "));
  }
  return out;
}

}  // namespace tessera::planner
