// `plan`: chooses each job's configuration, device count and start time on a cluster, jointly, by a MILP (Saturn's
// idea; docs/planner.md), compares the plan with the naive policies, and runs it.
//
//   plan --jobs jobs.yaml --cluster cluster.yaml [--time-limit 60] [--slots 32] [--objective makespan|weighted]
//        [--profile [--profile-budget S] [--profile-cache FILE] [--profile-seconds S] [--profile-configs N]]
//        [--json plan.json] [--gantt plan.png]
//        [--run [--policy milp|sequential|equal-split|greedy] [--work-dir DIR] [--no-replan]]
//
// Prints each job's configurations (the performance model's step time per device count, or measured ones with
// --profile), the plan as a table, and the makespan of the plan against running the jobs one after another, an
// equal split of the devices and a greedy largest-job-first policy. With --run, executes the chosen schedule on this
// machine and reports planned against actual times. Exit codes: 0 success, 1 runtime failure (or a job that failed
// for good under --run), 2 usage or configuration error.
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "commands.h"
#include "tessera/planner/cluster.h"
#include "tessera/planner/executor.h"
#include "tessera/planner/gantt.h"
#include "tessera/planner/jobs.h"
#include "tessera/planner/perf_model.h"
#include "tessera/planner/profiler.h"
#include "tessera/planner/schedule.h"
#include "tessera/util/error.h"
#include "tessera/util/logging.h"
#include "tessera/util/tool_main.h"

namespace {

namespace planner = tessera::planner;
using Json = nlohmann::ordered_json;

Json schedule_json(const planner::Schedule& s, const std::vector<planner::PlanJob>& jobs) {
  Json rows = Json::array();
  for (const planner::Placement& p : s.placements) {
    const planner::Candidate& c = jobs[static_cast<size_t>(p.job)].options[static_cast<size_t>(p.option)];
    rows.push_back({{"job", jobs[static_cast<size_t>(p.job)].profile.name},
                    {"devices", p.devices},
                    {"strategy", tessera::dist::to_string(c.strategy)},
                    {"activation_checkpointing", c.activation_checkpointing},
                    {"microbatch", c.microbatch},
                    {"step_s", c.step_s},
                    {"start_s", p.start_s},
                    {"end_s", p.end_s}});
    const planner::JobProfile& j = jobs[static_cast<size_t>(p.job)].profile;
    if (j.has_deadline()) rows.back()["deadline_s"] = j.deadline_s;
  }
  return {{"policy", s.policy}, {"makespan_s", s.makespan_s()}, {"late_s", s.lateness_s(jobs)}, {"placements", rows}};
}

std::string human_time(double s) {
  if (s >= 3600) return fmt::format("{:.2f} h", s / 3600);
  if (s >= 60) return fmt::format("{:.1f} min", s / 60);
  return fmt::format("{:.1f} s", s);
}

// The `train` next to this program (a build's bin/ or an install's).
std::string sibling_train() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("train") : (self.parent_path() / "train").string();
}

int run(int argc, char** argv) {
  CLI::App app{"Plans several training jobs on one cluster jointly, and runs the plan (docs/planner.md)"};
  std::string jobs_path;
  std::string cluster_path;
  std::string objective = "makespan";
  std::string json_path;
  std::string gantt_path;
  std::string log_level = "warn";
  std::string policy = "milp";
  bool profile = false;
  bool execute = false;
  bool no_replan = false;
  planner::SolveOptions options;
  planner::ProfileOptions prof;
  planner::ExecOptions exec;
  prof.train_bin = sibling_train();
  const char* home = std::getenv("TESSERA_HOME");
  const char* user_home = std::getenv("HOME");
  prof.cache_path = home != nullptr        ? std::string(home) + "/planner/profiles.json"
                    : user_home != nullptr ? std::string(user_home) + "/.cache/tessera/planner/profiles.json"
                                           : std::string();
  exec.work_dir = "runs/plan";
  app.add_option("--jobs", jobs_path, "The jobs file (a list of recipes)")->required();
  app.add_option("--cluster", cluster_path, "The cluster description")->required();
  app.add_option("--time-limit", options.time_limit_s, "Seconds the MILP solver may take")->check(CLI::PositiveNumber);
  app.add_option("--slots", options.slots, "Time slots of the MILP over the greedy schedule's makespan")
      ->check(CLI::Range(2, 1000));
  app.add_option("--objective", objective, "makespan, or weighted (the sum of weight x completion time)")
      ->check(CLI::IsMember({"makespan", "weighted"}));
  app.add_flag("--profile", profile, "Measure each job's configurations by short trial runs on this machine");
  app.add_option("--profile-budget", prof.budget_s, "Seconds all the trial runs together may take")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--profile-cache", prof.cache_path, "The trials' cache (JSON; empty: none)");
  app.add_option("--profile-seconds", prof.measure_s, "Seconds each trial is measured for, after its warm-up")
      ->check(CLI::PositiveNumber);
  app.add_option("--profile-configs", prof.per_device_count, "Configurations tried per device count")
      ->check(CLI::PositiveNumber);
  app.add_flag("--run", execute, "Run the schedule on this machine and report planned against actual times");
  app.add_option("--policy", policy, "The schedule --run runs: milp, sequential, equal-split or greedy")
      ->check(CLI::IsMember({"milp", "sequential", "equal-split", "greedy"}));
  app.add_option("--work-dir", exec.work_dir, "Where --run keeps each job's logs, checkpoints and metrics");
  app.add_flag("--no-replan", no_replan, "--run follows the plan without re-solving it as jobs end early or late");
  app.add_option("--train-bin", prof.train_bin, "The `train` program the trials and jobs run");
  app.add_option("--json", json_path, "Write the plan and the baselines as JSON here");
  app.add_option("--gantt", gantt_path,
                 "Draw the plan as a Gantt chart: a PNG here (X.png) and an SVG with labels beside it (X.svg)")
      ->check([](const std::string& p) {
        return std::filesystem::path(p).extension() == ".svg" ? std::string(
                                                                    "give the PNG's path (X.png); the SVG "
                                                                    "is written beside it")
                                                              : std::string();
      });
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off");
  if (auto code = tessera::util::parse_command_line(app, argc, argv)) return *code;
  tessera::util::init_logging(log_level);
  options.objective = objective == "weighted" ? planner::Objective::kWeightedCompletion : planner::Objective::kMakespan;

  const planner::Cluster cluster = planner::load_cluster(cluster_path);
  const std::vector<planner::JobSpec> specs = planner::load_jobs(jobs_path);
  std::vector<planner::PlanJob> jobs;
  planner::ProfileReport profiled;
  prof.work_dir = exec.work_dir;
  std::vector<planner::JobProfile> profiles;
  for (const planner::JobSpec& spec : specs) profiles.push_back(planner::profile_job(spec));
  const std::vector<std::vector<planner::Candidate>> measured =
      profile ? planner::profile_jobs(specs, profiles, cluster, prof, profiled)
              : std::vector<std::vector<planner::Candidate>>();
  for (size_t i = 0; i < profiles.size(); ++i) {
    jobs.emplace_back(profiles[i],
                      profile ? planner::select_best(measured[i]) : planner::best_candidates(profiles[i], cluster));
  }
  std::cout << fmt::format("Cluster: {}\n", cluster.describe());
  if (profile) {
    int cached = 0;
    std::cout << "\nTrials (measured step time against the calibrated model's):\n";
    for (const planner::Trial& t : profiled.trials) {
      cached += t.cached ? 1 : 0;
      if (!t.ok) {
        std::cout << fmt::format("  {:<24}{:>4} devices  {:<38} failed: {}\n", t.job, t.config.devices,
                                 t.config.describe(), t.error.substr(0, t.error.find('\n')));
        continue;
      }
      std::cout << fmt::format(
          "  {:<24}{:>4} devices  {:<38} step {:8.4f} s  model {:8.4f} s ({:+5.1f}%)  "
          "startup {:5.1f} s  peak {:6.0f} MiB{}\n",
          t.job, t.config.devices, t.config.describe(), t.step_s, t.config.modelled_step_s,
          100 * (t.config.modelled_step_s / t.step_s - 1), t.startup_s, t.peak_rss_bytes / (1024.0 * 1024),
          t.cached ? "  (cached)" : "");
    }
    std::cout << fmt::format(
        "{} trials ({} cached) in {:.1f} s{}; the model's error at the profiled points: mean "
        "{:.1f}%, largest {:.1f}%\n",
        profiled.trials.size(), cached, profiled.spent_s,
        profiled.budget_exhausted ? ", budget exhausted: the rest is modelled" : "", 100 * profiled.model_error_mean,
        100 * profiled.model_error_max);
  }
  std::cout << "\nConfigurations (the fastest that fits, per device count):\n";
  for (const planner::PlanJob& j : jobs) {
    std::cout << fmt::format("  {} ({:.3g}B parameters, {} steps)\n", j.profile.name,
                             static_cast<double>(j.profile.n_params) / 1e9, j.profile.steps);
    for (const planner::Candidate& c : j.options) {
      std::cout << fmt::format("    {:>4} devices  {:<38} step {:9.4f} s{} memory {:7.2f} GiB  total {}\n", c.devices,
                               c.describe(), c.step_s, c.profiled ? " (measured)" : "           ",
                               c.memory_bytes / (1024.0 * 1024 * 1024), human_time(c.duration_s));
    }
  }

  const planner::SolveResult r = planner::solve_milp(jobs, cluster, options);
  const std::vector<std::string> bad = planner::check_schedule(r.schedule, jobs, cluster);
  if (!bad.empty()) throw tessera::Error("plan", "the plan breaks a constraint: " + bad.front());
  std::cout << fmt::format(
      "\nPlan (MILP, {} variables, {} constraints, {:.1f} s{}; slots of {}: {} of at most {}, CBC's bound {}{}):\n",
      r.variables, r.constraints, r.solve_s, r.optimal ? ", optimal" : ", time limit reached",
      human_time(r.model.slot_s), r.objective_slots, r.model.horizon, r.bound_slots,
      r.model.late_weight > 0 ? fmt::format("; deadlines first: {} slot{} late, {} each", r.late_slots,
                                            r.late_slots == 1 ? "" : "s", r.model.late_weight)
                              : std::string());
  if (r.greedy_kept) std::cout << "(the greedy schedule, which is at least as good as the solver's once unrounded)\n";
  std::cout << planner::render_schedule(r.schedule, jobs, cluster);

  std::vector<planner::Schedule> baselines = {planner::sequential_schedule(jobs, cluster),
                                              planner::equal_split_schedule(jobs, cluster),
                                              planner::greedy_schedule(jobs, cluster)};
  const double plan_makespan = r.schedule.makespan_s();
  const double lower = planner::lower_bound_s(jobs, cluster);
  std::cout << fmt::format(
      "no plan can be shorter than {} (the longest job alone, or all the work over all the devices): this one is "
      "within {:.1f}% of that\n",
      human_time(lower), 100 * (plan_makespan / lower - 1));
  std::cout << "\nAgainst the naive policies:\n";
  const bool deadlines = planner::any_deadline(jobs);
  for (const planner::Schedule& b : baselines) {
    std::cout << fmt::format("  {:<22} makespan {:>10}   the plan is {:5.1f}% shorter{}\n", b.policy,
                             human_time(b.makespan_s()), 100 * (1 - plan_makespan / b.makespan_s()),
                             deadlines
                                 ? fmt::format("; late by {} in all (the plan: {})", human_time(b.lateness_s(jobs)),
                                               human_time(r.schedule.lateness_s(jobs)))
                                 : std::string());
  }
  if (!gantt_path.empty()) {
    planner::write_png(planner::draw_gantt(r.schedule, cluster), gantt_path);
    const std::string svg_path = std::filesystem::path(gantt_path).replace_extension(".svg").string();
    std::vector<std::string> names;
    for (const planner::PlanJob& j : jobs) names.push_back(j.profile.name);
    std::ofstream svg(svg_path);
    svg << planner::gantt_svg(r.schedule, cluster, names);
    if (!svg.flush()) throw tessera::Error("plan", fmt::format("cannot write the chart to {}", svg_path));
    std::cout << fmt::format(
        "Gantt chart: {} (bars numbered as the table's first column), and {} with the jobs' "
        "names, devices and a time axis\n",
        gantt_path, svg_path);
  }
  Json out = {{"cluster", cluster.describe()},
              {"plan", schedule_json(r.schedule, jobs)},
              {"solver",
               {{"optimal", r.optimal},
                {"seconds", r.solve_s},
                {"slot_s", r.model.slot_s},
                {"objective_slots", r.objective_slots},
                {"late_slots", r.late_slots},
                {"bound_slots", r.bound_slots},
                {"lower_bound_s", lower},
                {"greedy_kept", r.greedy_kept}}}};
  for (const planner::Schedule& b : baselines) out["baselines"].push_back(schedule_json(b, jobs));
  if (profile) {
    for (const planner::Trial& t : profiled.trials) {
      out["trials"].push_back({{"job", t.job},
                               {"devices", t.config.devices},
                               {"configuration", t.config.describe()},
                               {"ok", t.ok},
                               {"cached", t.cached},
                               {"step_s", t.step_s},
                               {"modelled_step_s", t.config.modelled_step_s},
                               {"startup_s", t.startup_s},
                               {"peak_rss_bytes", t.peak_rss_bytes}});
    }
    out["profile"] = {{"seconds", profiled.spent_s},
                      {"budget_exhausted", profiled.budget_exhausted},
                      {"model_error_mean", profiled.model_error_mean},
                      {"model_error_max", profiled.model_error_max}};
  }
  int code = 0;
  if (execute) {
    const planner::Schedule* chosen = &r.schedule;
    for (const planner::Schedule& b : baselines) {
      if ((policy == "sequential" && b.policy == "sequential") ||
          (policy == "equal-split" && b.policy == "equal split") ||
          (policy == "greedy" && b.policy == "greedy largest first")) {
        chosen = &b;
      }
    }
    std::vector<planner::ExecJob> run_jobs;
    for (size_t i = 0; i < jobs.size(); ++i) run_jobs.push_back({specs[i], jobs[i]});
    exec.train_bin = prof.train_bin;
    exec.solve = options;
    exec.solve.time_limit_s = std::min(options.time_limit_s, 10.0);
    exec.replan = !no_replan;
    std::cout << fmt::format("\nRunning the {} schedule on this machine (logs under {}):\n", chosen->policy,
                             exec.work_dir);
    std::cout.flush();
    const planner::ExecReport rep = planner::execute_plan(run_jobs, cluster, *chosen, exec);
    for (const std::string& e : rep.events) std::cout << "  " << e << "\n";
    std::cout << planner::render_report(rep);
    Json jr = Json::array();
    for (const planner::ExecJobReport& j : rep.jobs) {
      Json attempts = Json::array();
      for (const planner::ExecAttempt& a : j.attempts) {
        attempts.push_back({{"devices", a.devices},
                            {"configuration", a.configuration},
                            {"start_s", a.start_s},
                            {"end_s", a.end_s},
                            {"from_step", a.from_step},
                            {"to_step", a.to_step},
                            {"outcome", a.outcome}});
      }
      jr.push_back({{"job", j.name},
                    {"planned_start_s", j.planned_start_s},
                    {"planned_end_s", j.planned_end_s},
                    {"start_s", j.start_s},
                    {"end_s", j.end_s},
                    {"done", j.done},
                    {"attempts", attempts}});
      if (j.deadline_s < std::numeric_limits<double>::infinity()) jr.back()["deadline_s"] = j.deadline_s;
    }
    out["run"] = {{"policy", chosen->policy},
                  {"planned_makespan_s", rep.planned_makespan_s},
                  {"makespan_s", rep.makespan_s},
                  {"replans", rep.replans},
                  {"ok", rep.ok},
                  {"jobs", jr},
                  {"events", rep.events}};
    code = rep.ok ? 0 : 1;
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  return code;
}

}  // namespace

int tessera::cli::plan_main(int argc, char** argv) {
  return tessera::util::tool_main([&] { return run(argc, argv); });
}
