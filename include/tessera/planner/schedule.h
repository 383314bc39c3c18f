// Schedules of several jobs on one cluster (docs/planner.md): which configuration each job runs in, on which
// devices, from when to when; the checks every schedule must pass; the naive policies a plan is compared with; and
// the joint optimum, a mixed-integer linear program solved by COIN-OR CBC (Saturn's formulation, time-indexed).
//
// Devices are numbered node-major: device d is device d % devices_per_node of node d / devices_per_node.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tessera/planner/cluster.h"
#include "tessera/planner/jobs.h"
#include "tessera/planner/perf_model.h"

namespace tessera::planner {

// A job with the configurations the scheduler chooses from (best_candidates).
struct PlanJob {
  PlanJob() = default;
  PlanJob(JobProfile p, std::vector<Candidate> o) : profile(std::move(p)), options(std::move(o)) {}

  JobProfile profile;
  std::vector<Candidate> options;
  // Re-planning (planner/executor.h): a job that runs now. Its option `running_option` continues it where it runs,
  // on `running_devices` from time 0 (its duration: what is left); its other options stop it and restart it from its
  // checkpoint, anywhere, at any time (their durations include the restart). -1: the job has not started.
  int running_option = -1;
  std::vector<int64_t> running_devices;
};

struct Placement {
  int job = 0;     // index into the jobs
  int option = 0;  // index into the job's options
  std::vector<int64_t> devices;
  double start_s = 0;
  double end_s = 0;
};

struct Schedule {
  std::string policy;                 // "milp", "sequential", "equal split", "greedy largest first"
  std::vector<Placement> placements;  // one per job, in job order
  double makespan_s() const;
  // Sum over jobs of weight x end time.
  double weighted_completion_s(const std::vector<PlanJob>& jobs) const;
  // Sum over jobs of the time by which each ends after its deadline (0 when every job meets its own).
  double lateness_s(const std::vector<PlanJob>& jobs) const;
};

enum class Objective { kMakespan, kWeightedCompletion };

// Whether `a` is a better schedule than `b`: less total lateness past the jobs' deadlines first, then the objective
// (makespan, or weighted completion time).
bool better_schedule(const Schedule& a, const Schedule& b, const std::vector<PlanJob>& jobs, Objective objective);

// Whether any of the jobs has a deadline.
bool any_deadline(const std::vector<PlanJob>& jobs);

// Every constraint a schedule must meet: each job placed once, in one of its options, on exactly that option's
// device count, within one node unless the option spans nodes (then on whole nodes), for exactly its duration, a
// running job's continuing option on its devices from time 0, and no device used by two jobs at once. Returns the
// violations, one line each; empty when the schedule is valid.
std::vector<std::string> check_schedule(const Schedule& s, const std::vector<PlanJob>& jobs, const Cluster& cluster);

// The naive policies (each returns a valid schedule, or throws ConfigError naming a job that fits nowhere):
//   sequential            one job at a time, in file order, each on as many devices as it may use
//   equal split           the devices cut into equal groups (a power of two per group, the smallest on which every
//                         job fits), jobs dealt to the groups in turn, each group running its jobs one after another
//   greedy largest first  jobs by work (device-seconds on their smallest option) descending, each placed where it
//                         would finish first given the devices' free times (running jobs continue where they run);
//                         with deadlines, the jobs that have one first, earliest deadline first
Schedule sequential_schedule(const std::vector<PlanJob>& jobs, const Cluster& cluster);
Schedule equal_split_schedule(const std::vector<PlanJob>& jobs, const Cluster& cluster);
Schedule greedy_schedule(const std::vector<PlanJob>& jobs, const Cluster& cluster);

// The best (better_schedule) of the greedy policy run with each job limited to at most N devices, for every N the
// jobs' options use (and unlimited), in both job orders (by work, and deadlines first): greedy spreads a large job wide
// to finish it early, which can leave the others a worse packing than narrower jobs side by side. The solver's first
// incumbent, and the plan when the solver finds none better. Its policy name stays "greedy largest first".
Schedule best_greedy_schedule(const std::vector<PlanJob>& jobs, const Cluster& cluster, Objective objective);

// The time-indexed model the solver works on: time cut into slots of `slot_s` seconds, each option's duration
// rounded up to whole slots, each option placed on one node (or one aligned block of nodes) and started at a slot.
struct SlotModel {
  struct Choice {
    int job = 0;
    int option = 0;
    int64_t first_node = 0;
    int64_t nodes = 1;
    int64_t devices_per_node = 1;  // of the option, on each of its nodes
    int64_t start = 0;             // slot
    int64_t length = 1;            // slots
  };
  double slot_s = 0;
  int64_t horizon = 0;          // slots
  std::vector<Choice> choices;  // every (job, option, placement, start) that ends within the horizon
  Objective objective = Objective::kMakespan;
  std::vector<double> weights;  // per job
  std::vector<int> greedy;      // per job, the choice best_greedy_schedule takes (the solver's first incumbent)
  // Deadlines: per job, the last slot end that meets its deadline (a choice ending in that slot ends by the deadline);
  // a job without one gets a slot past the horizon. A slot of lateness costs `late_weight`, more than the objective
  // can range over, so the solver misses deadlines by as few slots as it can first.
  std::vector<int64_t> deadline_slots;
  double late_weight = 0;

  // The slots by which a choice ends after its job's deadline (0 when on time).
  int64_t late_slots(const Choice& c) const;
  // The slots by which a selection's jobs end after their deadlines, summed.
  int64_t late_slots_of(const std::vector<int>& selected) const;
  // The objective in slots of a selection (one choice per job): late_weight x late slots, plus the makespan or the
  // sum of weight x end slot.
  double objective_of(const std::vector<int>& selected) const;
  // Whether the selection uses at most devices_per_node on every node in every slot.
  bool feasible(const std::vector<int>& selected, int64_t devices_per_node, int64_t nodes) const;
};

// Builds the slot model with about `slots` slots over best_greedy_schedule's makespan (the horizon grows so that that
// schedule, rounded, fits).
SlotModel make_slot_model(const std::vector<PlanJob>& jobs, const Cluster& cluster, int64_t slots, Objective objective);

struct SolveOptions {
  int64_t slots = 32;
  double time_limit_s = 60;
  Objective objective = Objective::kMakespan;
};

struct SolveResult {
  // The chosen placements, compacted to start as soon as their devices are free; or the greedy schedule when it is
  // at least as good (greedy_kept: rounding durations up to slots can cost more than the solver found).
  Schedule schedule;
  bool greedy_kept = false;
  std::vector<int> selected;  // per job, the index of its choice in `model`
  SlotModel model;
  double objective_slots = 0;  // of the selection, in the slot model (its lateness term included)
  int64_t late_slots = 0;      // of the selection: slots by which jobs end after their deadlines
  double bound_slots = 0;      // CBC's best bound
  bool optimal = false;        // proven optimal within the time limit
  double solve_s = 0;
  int64_t variables = 0;
  int64_t constraints = 0;
};

// Solves the slot model with CBC (best_greedy_schedule as its first incumbent). Throws Error when CBC finds no
// solution within the time limit.
SolveResult solve_milp(const std::vector<PlanJob>& jobs, const Cluster& cluster, const SolveOptions& options);

// A selection of the slot model as a schedule: concrete devices on each node, each job started as soon as the
// devices it was given are free (never later than its slot), for its exact duration.
Schedule schedule_from_slots(const SlotModel& model, const std::vector<int>& selected, const std::vector<PlanJob>& jobs,
                             const Cluster& cluster);

// A lower bound on any schedule's makespan: the longest job's shortest duration, and the least device-seconds of all
// jobs spread over every device.
double lower_bound_s(const std::vector<PlanJob>& jobs, const Cluster& cluster);

// The plan as a table (one row per job: configuration, devices, start, end) and the comparison with the baselines.
std::string render_schedule(const Schedule& s, const std::vector<PlanJob>& jobs, const Cluster& cluster);

}  // namespace tessera::planner
