// `plan`: chooses each job's configuration, device count and start time on a cluster, jointly, by a MILP (Saturn's
// idea; docs/planner.md), and compares the plan with the naive policies.
//
//   plan --jobs jobs.yaml --cluster cluster.yaml [--time-limit 60] [--slots 32] [--objective makespan|weighted]
//        [--json plan.json] [--gantt plan.png]
//
// Prints each job's configurations (the performance model's step time per device count), the plan as a table, and
// the makespan of the plan against running the jobs one after another, an equal split of the devices and a greedy
// largest-job-first policy. Exit codes: 0 success, 1 runtime failure, 2 usage or configuration error.
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "tessera/planner/cluster.h"
#include "tessera/planner/gantt.h"
#include "tessera/planner/jobs.h"
#include "tessera/planner/perf_model.h"
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
  }
  return {{"policy", s.policy}, {"makespan_s", s.makespan_s()}, {"placements", rows}};
}

int run(int argc, char** argv) {
  CLI::App app{"Plans several training jobs on one cluster jointly (docs/planner.md)"};
  std::string jobs_path;
  std::string cluster_path;
  std::string objective = "makespan";
  std::string json_path;
  std::string gantt_path;
  std::string log_level = "warn";
  planner::SolveOptions options;
  app.add_option("--jobs", jobs_path, "The jobs file (a list of recipes)")->required();
  app.add_option("--cluster", cluster_path, "The cluster description")->required();
  app.add_option("--time-limit", options.time_limit_s, "Seconds the MILP solver may take")->check(CLI::PositiveNumber);
  app.add_option("--slots", options.slots, "Time slots of the MILP over the greedy schedule's makespan")
      ->check(CLI::Range(2, 1000));
  app.add_option("--objective", objective, "makespan, or weighted (the sum of weight x completion time)")
      ->check(CLI::IsMember({"makespan", "weighted"}));
  app.add_option("--json", json_path, "Write the plan and the baselines as JSON here");
  app.add_option("--gantt", gantt_path, "Draw the plan as a Gantt chart (PNG) here");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off");
  if (auto code = tessera::util::parse_command_line(app, argc, argv)) return *code;
  tessera::util::init_logging(log_level);
  options.objective = objective == "weighted" ? planner::Objective::kWeightedCompletion : planner::Objective::kMakespan;

  const planner::Cluster cluster = planner::load_cluster(cluster_path);
  std::vector<planner::PlanJob> jobs;
  for (const planner::JobSpec& spec : planner::load_jobs(jobs_path)) {
    planner::PlanJob j{planner::profile_job(spec), {}};
    j.options = planner::best_candidates(j.profile, cluster);
    jobs.push_back(std::move(j));
  }
  std::cout << fmt::format("Cluster: {}\n\nConfigurations (the fastest that fits, per device count):\n",
                           cluster.describe());
  for (const planner::PlanJob& j : jobs) {
    std::cout << fmt::format("  {} ({:.3g}B parameters, {} steps)\n", j.profile.name,
                             static_cast<double>(j.profile.n_params) / 1e9, j.profile.steps);
    for (const planner::Candidate& c : j.options) {
      std::cout << fmt::format("    {:>4} devices  {:<38} step {:8.3f} s  memory {:6.1f} GiB  total {:.2f} h\n",
                               c.devices, c.describe(), c.step_s, c.memory_bytes / (1024.0 * 1024 * 1024),
                               c.duration_s / 3600);
    }
  }

  const planner::SolveResult r = planner::solve_milp(jobs, cluster, options);
  const std::vector<std::string> bad = planner::check_schedule(r.schedule, jobs, cluster);
  if (!bad.empty()) throw tessera::Error("plan", "the plan breaks a constraint: " + bad.front());
  std::cout << fmt::format(
      "\nPlan (MILP, {} variables, {} constraints, {:.1f} s{}; slots of {:.1f} s: {} of at most "
      "{}, CBC's bound {}):\n",
      r.variables, r.constraints, r.solve_s, r.optimal ? ", optimal" : ", time limit reached", r.model.slot_s,
      r.objective_slots, r.model.horizon, r.bound_slots);
  if (r.greedy_kept) std::cout << "(the greedy schedule, which is at least as good as the solver's once unrounded)\n";
  std::cout << planner::render_schedule(r.schedule, jobs, cluster);

  std::vector<planner::Schedule> baselines = {planner::sequential_schedule(jobs, cluster),
                                              planner::equal_split_schedule(jobs, cluster),
                                              planner::greedy_schedule(jobs, cluster)};
  const double plan_makespan = r.schedule.makespan_s();
  const double lower = planner::lower_bound_s(jobs, cluster);
  std::cout << fmt::format(
      "no plan can be shorter than {:.2f} h (the longest job alone, or all the work over all the "
      "devices): this one is within {:.1f}% of that\n",
      lower / 3600, 100 * (plan_makespan / lower - 1));
  std::cout << "\nAgainst the naive policies:\n";
  for (const planner::Schedule& b : baselines) {
    std::cout << fmt::format("  {:<22} makespan {:8.2f} h   the plan is {:5.1f}% shorter\n", b.policy,
                             b.makespan_s() / 3600, 100 * (1 - plan_makespan / b.makespan_s()));
  }
  if (!gantt_path.empty()) {
    planner::write_png(planner::draw_gantt(r.schedule, cluster), gantt_path);
    std::cout << fmt::format("Gantt chart: {} (bars numbered as the table's first column; hours or minutes below)\n",
                             gantt_path);
  }
  if (!json_path.empty()) {
    Json out = {{"cluster", cluster.describe()},
                {"plan", schedule_json(r.schedule, jobs)},
                {"solver",
                 {{"optimal", r.optimal},
                  {"seconds", r.solve_s},
                  {"slot_s", r.model.slot_s},
                  {"objective_slots", r.objective_slots},
                  {"bound_slots", r.bound_slots},
                  {"lower_bound_s", lower},
                  {"greedy_kept", r.greedy_kept}}}};
    for (const planner::Schedule& b : baselines) out["baselines"].push_back(schedule_json(b, jobs));
    std::ofstream(json_path) << out.dump(2) << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::util::tool_main([&] { return run(argc, argv); });
}
