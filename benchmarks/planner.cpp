// The multi-job planner on Saturn-shaped workloads (docs/planner.md): fine-tuning grids over MPT 1B, 3B, 7B and 13B
// (the shipped recipes, profiled as `plan` profiles them), on one node of 8 H100 and on 8 nodes of 8. For each job
// count it prints the MILP's size, CBC's time, whether the plan is proven optimal in the slot model, a lower bound on
// any plan's makespan (lower_bound_s), and the makespan of the plan against the three naive policies measured in the
// same run.
//
//   bench_planner [--jobs 8,16,32,64] [--time-limit 60] [--slots 32] [--json out.json]
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tessera/planner/cluster.h"
#include "tessera/planner/jobs.h"
#include "tessera/planner/perf_model.h"
#include "tessera/planner/schedule.h"

namespace {

namespace planner = tessera::planner;

std::vector<int> split_ints(const std::string& s) {
  std::vector<int> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, ',');) out.push_back(std::stoi(part));
  return out;
}

// Job i of a grid: model i % 4, global batch 32 or 128 (alternating every four jobs), 2000 steps' worth of 64-sample
// batches (the caller lets it span every node).
planner::JobProfile grid_job(int i, const std::string& recipes,
                             std::map<std::pair<int, int>, planner::JobProfile>& cache) {
  static const char* kModels[] = {"mpt-1b", "mpt-3b", "mpt-7b", "mpt-13b"};
  const int model = i % 4;
  const int batch = (i / 4) % 2 == 0 ? 32 : 128;
  auto it = cache.find({model, batch});
  if (it == cache.end()) {
    planner::JobSpec spec;
    spec.name = kModels[model];
    spec.recipe = fmt::format("{}/{}.yaml", recipes, kModels[model]);
    spec.overrides = {fmt::format("global_train_batch_size={}", batch)};
    spec.max_duration = fmt::format("{}ba", 2000 * 64 / batch);
    it = cache.emplace(std::make_pair(model, batch), planner::profile_job(spec)).first;
  }
  planner::JobProfile p = it->second;
  p.name = fmt::format("{}-b{}-{}", kModels[model], batch, i);
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The multi-job planner on Saturn-shaped fine-tuning grids"};
  std::string job_counts = "8,16,32,64";
  std::string json_path;
  std::string source = TESSERA_SOURCE_DIR;
  planner::SolveOptions options;
  app.add_option("--jobs", job_counts, "Job counts, comma-separated");
  app.add_option("--time-limit", options.time_limit_s, "CBC's time limit per plan, seconds");
  app.add_option("--slots", options.slots, "Time slots of the MILP");
  app.add_option("--source", source, "The source tree (its recipes/ and tests/data/planner/)");
  app.add_option("--json", json_path, "Also write the figures here as JSON (benchmarks/run)");
  CLI11_PARSE(app, argc, argv);

  std::map<std::pair<int, int>, planner::JobProfile> cache;
  nlohmann::json rows = nlohmann::json::array();
  std::cout
      << "| cluster | jobs | variables | CBC s | optimal | plan h | lower bound h | sequential h | equal split h | "
         "greedy h | vs sequential | vs equal split | vs greedy |\n"
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const char* cluster_file : {"h100-8.yaml", "h100-64.yaml"}) {
    const planner::Cluster cluster =
        planner::load_cluster(fmt::format("{}/tests/data/planner/{}", source, cluster_file));
    for (int n : split_ints(job_counts)) {
      std::vector<planner::PlanJob> jobs;
      for (int i = 0; i < n; ++i) {
        planner::PlanJob j{grid_job(i, source + "/recipes", cache), {}};
        j.profile.max_nodes = cluster.nodes;
        j.options = planner::best_candidates(j.profile, cluster);
        jobs.push_back(std::move(j));
      }
      const planner::SolveResult r = planner::solve_milp(jobs, cluster, options);
      const std::vector<std::string> bad = planner::check_schedule(r.schedule, jobs, cluster);
      if (!bad.empty()) {
        std::cerr << "bench_planner: the plan breaks a constraint: " << bad.front() << "\n";
        return 1;
      }
      const double plan = r.schedule.makespan_s();
      const double seq = planner::sequential_schedule(jobs, cluster).makespan_s();
      const double equal = planner::equal_split_schedule(jobs, cluster).makespan_s();
      const double greedy = planner::greedy_schedule(jobs, cluster).makespan_s();
      const double bound = planner::lower_bound_s(jobs, cluster);
      const std::string where = fmt::format("{} x {} {}", cluster.nodes, cluster.devices_per_node, cluster.device_kind);
      std::cout << fmt::format(
          "| {} | {} | {} | {:.1f} | {} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.1f}% | {:.1f}% | {:.1f}% |\n",
          where, n, r.variables, r.solve_s, r.optimal ? "yes" : "no", plan / 3600, bound / 3600, seq / 3600,
          equal / 3600, greedy / 3600, 100 * (1 - plan / seq), 100 * (1 - plan / equal), 100 * (1 - plan / greedy));
      std::cout.flush();
      rows.push_back({{"case", fmt::format("{} jobs on {}", n, where)},
                      {"unit", "h makespan"},
                      {"higher_is_better", false},
                      {"tessera", plan / 3600},
                      {"peers", {{"sequential", seq / 3600}, {"equal split", equal / 3600}, {"greedy", greedy / 3600}}},
                      {"solver_s", r.solve_s},
                      {"optimal", r.optimal},
                      {"lower_bound_h", bound / 3600},
                      {"slot_objective", r.objective_slots},
                      {"slot_bound", r.bound_slots},
                      {"variables", r.variables},
                      {"greedy_kept", r.greedy_kept}});
    }
  }
  if (!json_path.empty()) {
    const nlohmann::json record = {
        {"benchmark", "planner"},
        {"title", "Multi-job planner: MILP plan vs naive policies on fine-tuning grids (performance model)"},
        {"time_limit_s", options.time_limit_s},
        {"rows", rows}};
    std::ofstream(json_path) << record.dump(1) << "\n";
  }
  return 0;
}
