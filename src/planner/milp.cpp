// The joint plan as a time-indexed MILP, solved by COIN-OR CBC through its C interface.
//
// Variables: x[c] = 1 when choice c (job, option, placement, start slot) is taken; C, the makespan in slots.
// Rows:      each job takes exactly one choice;
//            on each node, in each slot, the devices of the running choices are at most the node's;
//            C >= end slot of each job's choice (makespan objective only).
// Objective: min C + eps * sum of end slots (eps keeps every job as early as the makespan allows; it is below one
//            slot in total, so the optimal makespan is unchanged), or min sum of weight x end slot; plus, with
//            deadlines, late_weight x the slots by which each choice ends after its job's deadline (a constant of
//            the choice). late_weight exceeds the rest of the objective's range, so deadlines come first.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <coin/Cbc_C_Interface.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "tessera/planner/schedule.h"
#include "tessera/util/error.h"

namespace tessera::planner {
namespace {

struct CbcDeleter {
  void operator()(Cbc_Model* m) const { Cbc_deleteModel(m); }
};

// The greedy schedule in slots: the same options and nodes, each started at the first slot its devices are free,
// with rounded lengths. Returns, per job, (option, first node, start slot, length), and the last end slot.
struct SlotPlacement {
  int option = 0;
  int64_t first_node = 0;
  int64_t start = 0;
  int64_t length = 1;
};

int64_t slots_for(double duration_s, double slot_s) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(duration_s / slot_s - 1e-9)));
}

std::vector<SlotPlacement> greedy_in_slots(const Schedule& greedy, const std::vector<PlanJob>& jobs,
                                           const Cluster& cluster, double slot_s, int64_t* end) {
  std::vector<const Placement*> by_start;
  for (const Placement& p : greedy.placements) by_start.push_back(&p);
  std::stable_sort(by_start.begin(), by_start.end(),
                   [](const Placement* a, const Placement* b) { return a->start_s < b->start_s; });
  std::vector<int64_t> free_slot(static_cast<size_t>(cluster.devices()), 0);
  std::vector<SlotPlacement> out(jobs.size());
  *end = 0;
  for (const Placement* p : by_start) {
    const Candidate& c = jobs[static_cast<size_t>(p->job)].options[static_cast<size_t>(p->option)];
    SlotPlacement s;
    s.option = p->option;
    s.first_node = p->devices.front() / cluster.devices_per_node;
    s.length = slots_for(c.duration_s, slot_s);
    for (int64_t d : p->devices) s.start = std::max(s.start, free_slot[static_cast<size_t>(d)]);
    for (int64_t d : p->devices) free_slot[static_cast<size_t>(d)] = s.start + s.length;
    *end = std::max(*end, s.start + s.length);
    out[static_cast<size_t>(p->job)] = s;
  }
  return out;
}

}  // namespace

int64_t SlotModel::late_slots(const Choice& c) const {
  return std::max<int64_t>(0, c.start + c.length - deadline_slots[static_cast<size_t>(c.job)]);
}

int64_t SlotModel::late_slots_of(const std::vector<int>& selected) const {
  int64_t late = 0;
  for (int i : selected) late += late_slots(choices[static_cast<size_t>(i)]);
  return late;
}

double SlotModel::objective_of(const std::vector<int>& selected) const {
  double value = 0;
  for (int i : selected) {
    const Choice& c = choices[static_cast<size_t>(i)];
    const double end = static_cast<double>(c.start + c.length);
    if (objective == Objective::kMakespan) {
      value = std::max(value, end);
    } else {
      value += weights[static_cast<size_t>(c.job)] * end;
    }
  }
  return value + late_weight * static_cast<double>(late_slots_of(selected));
}

bool SlotModel::feasible(const std::vector<int>& selected, int64_t devices_per_node, int64_t nodes) const {
  std::vector<int64_t> used(static_cast<size_t>(nodes * horizon), 0);
  for (int i : selected) {
    const Choice& c = choices[static_cast<size_t>(i)];
    for (int64_t n = c.first_node; n < c.first_node + c.nodes; ++n) {
      for (int64_t t = c.start; t < c.start + c.length; ++t) {
        int64_t& u = used[static_cast<size_t>(n * horizon + t)];
        u += c.devices_per_node;
        if (u > devices_per_node) return false;
      }
    }
  }
  return true;
}

namespace {

// The slot model around a given greedy schedule (which sets the slot length and the horizon, and becomes `greedy`).
SlotModel slot_model_around(const std::vector<PlanJob>& jobs, const Cluster& cluster, int64_t slots,
                            Objective objective, const Schedule& greedy) {
  SlotModel m;
  m.objective = objective;
  m.slot_s = greedy.makespan_s() / static_cast<double>(std::max<int64_t>(1, slots));
  const std::vector<SlotPlacement> g = greedy_in_slots(greedy, jobs, cluster, m.slot_s, &m.horizon);
  for (const PlanJob& j : jobs) m.weights.push_back(j.profile.weight);
  for (const PlanJob& j : jobs) {
    // The last slot end at or before the deadline (a deadline past the horizon cannot be missed).
    const double last = j.profile.deadline_s / m.slot_s + 1e-9;
    m.deadline_slots.push_back(last > static_cast<double>(m.horizon) ? m.horizon + 1
                                                                     : static_cast<int64_t>(std::floor(last)));
  }
  if (any_deadline(jobs)) {
    // Above the objective's range: the makespan is at most the horizon (and the tie-breaking term below half a
    // slot), the weighted sum at most the weights' sum times it.
    const double weights = std::accumulate(m.weights.begin(), m.weights.end(), 0.0);
    m.late_weight = objective == Objective::kMakespan ? static_cast<double>(m.horizon + 2)
                                                      : weights * static_cast<double>(m.horizon) + 1;
  }
  m.greedy.assign(jobs.size(), -1);
  for (size_t job = 0; job < jobs.size(); ++job) {
    const SlotPlacement& gp = g[job];
    for (size_t o = 0; o < jobs[job].options.size(); ++o) {
      const Candidate& c = jobs[job].options[o];
      const int64_t length = slots_for(c.duration_s, m.slot_s);
      const int64_t step = c.nodes > 1 ? c.nodes : 1;
      const bool pinned = static_cast<int>(o) == jobs[job].running_option;
      for (int64_t first = 0; first + step <= cluster.nodes; first += step) {
        // A running job's continuing option: where it runs, from slot 0.
        if (pinned && first != jobs[job].running_devices.front() / cluster.devices_per_node) continue;
        for (int64_t start = 0; start + length <= m.horizon && !(pinned && start > 0); ++start) {
          if (static_cast<int>(o) == gp.option && first == gp.first_node && start == gp.start) {
            m.greedy[job] = static_cast<int>(m.choices.size());
          }
          m.choices.push_back({static_cast<int>(job), static_cast<int>(o), first, step,
                               c.nodes > 1 ? cluster.devices_per_node : c.devices, start, length});
        }
      }
    }
  }
  return m;
}

}  // namespace

SlotModel make_slot_model(const std::vector<PlanJob>& jobs, const Cluster& cluster, int64_t slots,
                          Objective objective) {
  return slot_model_around(jobs, cluster, slots, objective, best_greedy_schedule(jobs, cluster, objective));
}

Schedule schedule_from_slots(const SlotModel& model, const std::vector<int>& selected, const std::vector<PlanJob>& jobs,
                             const Cluster& cluster) {
  // Running jobs that continue first (they keep their devices), then by start slot.
  const auto continues = [&](int i) {
    const SlotModel::Choice& c = model.choices[static_cast<size_t>(i)];
    return c.option == jobs[static_cast<size_t>(c.job)].running_option;
  };
  std::vector<int> order(selected.begin(), selected.end());
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    if (continues(a) != continues(b)) return continues(a);
    return model.choices[static_cast<size_t>(a)].start < model.choices[static_cast<size_t>(b)].start;
  });
  const int64_t per_node = cluster.devices_per_node;
  std::vector<int64_t> free_slot(static_cast<size_t>(cluster.devices()), 0);  // devices, in slots
  std::vector<double> free_at(static_cast<size_t>(cluster.devices()), 0.0);   // devices, in seconds
  std::vector<Placement> out;
  for (int i : order) {
    const SlotModel::Choice& c = model.choices[static_cast<size_t>(i)];
    const Candidate& o = jobs[static_cast<size_t>(c.job)].options[static_cast<size_t>(c.option)];
    Placement p;
    p.job = c.job;
    p.option = c.option;
    const std::vector<int64_t>& running = jobs[static_cast<size_t>(c.job)].running_devices;
    if (continues(i)) p.devices = running;
    for (int64_t n = c.first_node; n < c.first_node + c.nodes && !continues(i); ++n) {
      // The node's devices free at the choice's start slot (the capacity rows guarantee enough), earliest free
      // first in seconds so the job can start soonest.
      std::vector<int64_t> devs;
      for (int64_t d = n * per_node; d < (n + 1) * per_node; ++d) {
        if (free_slot[static_cast<size_t>(d)] <= c.start) devs.push_back(d);
      }
      std::stable_sort(devs.begin(), devs.end(), [&](int64_t a, int64_t b) {
        return free_at[static_cast<size_t>(a)] < free_at[static_cast<size_t>(b)];
      });
      if (static_cast<int64_t>(devs.size()) < c.devices_per_node) {
        throw Error("plan", fmt::format("the solver's selection overfills node {} at slot {}", n, c.start));
      }
      devs.resize(static_cast<size_t>(c.devices_per_node));
      p.devices.insert(p.devices.end(), devs.begin(), devs.end());
    }
    std::sort(p.devices.begin(), p.devices.end());
    for (int64_t d : p.devices) p.start_s = std::max(p.start_s, free_at[static_cast<size_t>(d)]);
    p.end_s = p.start_s + o.duration_s;
    for (int64_t d : p.devices) {
      free_slot[static_cast<size_t>(d)] = c.start + c.length;
      free_at[static_cast<size_t>(d)] = p.end_s;
    }
    out.push_back(std::move(p));
  }
  std::sort(out.begin(), out.end(), [](const Placement& a, const Placement& b) { return a.job < b.job; });
  return {"milp", std::move(out)};
}

SolveResult solve_milp(const std::vector<PlanJob>& jobs, const Cluster& cluster, const SolveOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  SolveResult r;
  const Schedule greedy = best_greedy_schedule(jobs, cluster, options.objective);
  r.model = slot_model_around(jobs, cluster, options.slots, options.objective, greedy);
  const SlotModel& m = r.model;
  const bool makespan = options.objective == Objective::kMakespan;
  const int n_choices = static_cast<int>(m.choices.size());
  const int n_cols = n_choices + (makespan ? 1 : 0);
  const int n_jobs = static_cast<int>(jobs.size());
  const int64_t cap_rows = cluster.nodes * m.horizon;
  // Rows: jobs, capacity (node x slot), then with the makespan objective one row per job (C >= its end) and the
  // energy row (all nodes' devices x C >= the device-slots used), which tightens the LP bound.
  const int energy_row = n_jobs + static_cast<int>(cap_rows) + n_jobs;
  const int n_rows = n_jobs + static_cast<int>(cap_rows) + (makespan ? n_jobs + 1 : 0);
  const int c_col = n_choices;  // the makespan column

  // Columns in compressed sparse form.
  std::vector<CoinBigIndex> start;
  std::vector<int> index;
  std::vector<double> value;
  std::vector<double> col_lb(static_cast<size_t>(n_cols), 0.0);
  std::vector<double> col_ub(static_cast<size_t>(n_cols), 1.0);
  std::vector<double> obj(static_cast<size_t>(n_cols), 0.0);
  const double eps = 1.0 / (static_cast<double>(n_jobs) * static_cast<double>(m.horizon + 1) * 2.0);
  for (int i = 0; i < n_choices; ++i) {
    const SlotModel::Choice& c = m.choices[static_cast<size_t>(i)];
    const double end = static_cast<double>(c.start + c.length);
    const double late = m.late_weight * static_cast<double>(m.late_slots(c));
    start.push_back(static_cast<CoinBigIndex>(index.size()));
    index.push_back(c.job);
    value.push_back(1.0);
    for (int64_t n = c.first_node; n < c.first_node + c.nodes; ++n) {
      for (int64_t t = c.start; t < c.start + c.length; ++t) {
        index.push_back(n_jobs + static_cast<int>(n * m.horizon + t));
        value.push_back(static_cast<double>(c.devices_per_node));
      }
    }
    if (makespan) {
      index.push_back(n_jobs + static_cast<int>(cap_rows) + c.job);
      value.push_back(end);
      index.push_back(energy_row);
      value.push_back(static_cast<double>(c.devices_per_node * c.nodes * c.length));
      obj[static_cast<size_t>(i)] = eps * end + late;
    } else {
      obj[static_cast<size_t>(i)] = m.weights[static_cast<size_t>(c.job)] * end + late;
    }
  }
  if (makespan) {
    start.push_back(static_cast<CoinBigIndex>(index.size()));
    for (int j = 0; j < n_jobs; ++j) {
      index.push_back(n_jobs + static_cast<int>(cap_rows) + j);
      value.push_back(-1.0);
    }
    index.push_back(energy_row);
    value.push_back(-static_cast<double>(cluster.devices()));
    col_ub[static_cast<size_t>(c_col)] = static_cast<double>(m.horizon);
    obj[static_cast<size_t>(c_col)] = 1.0;
  }
  start.push_back(static_cast<CoinBigIndex>(index.size()));
  std::vector<double> row_lb(static_cast<size_t>(n_rows));
  std::vector<double> row_ub(static_cast<size_t>(n_rows));
  for (int j = 0; j < n_jobs; ++j) row_lb[static_cast<size_t>(j)] = row_ub[static_cast<size_t>(j)] = 1.0;
  for (int64_t k = 0; k < cap_rows; ++k) {
    row_lb[static_cast<size_t>(n_jobs + k)] = 0.0;
    row_ub[static_cast<size_t>(n_jobs + k)] = static_cast<double>(cluster.devices_per_node);
  }
  if (makespan) {
    for (int j = 0; j <= n_jobs; ++j) {  // the jobs' rows and the energy row
      row_lb[static_cast<size_t>(n_jobs + cap_rows + j)] = -1e30;
      row_ub[static_cast<size_t>(n_jobs + cap_rows + j)] = 0.0;
    }
  }
  r.variables = n_cols;
  r.constraints = n_rows;

  // Symmetry: the nodes are alike, so any plan can be relabelled block by block (blocks of the widest option's node
  // count, which keeps every narrower block aligned) to put one chosen job in the first block. The job is the one
  // the greedy schedule starts first there, so the incumbent stays feasible. Running jobs make the nodes unalike.
  int64_t block = 1;
  for (const PlanJob& j : jobs) {
    for (const Candidate& c : j.options) block = std::max(block, c.nodes);
  }
  const bool any_running =
      std::any_of(jobs.begin(), jobs.end(), [](const PlanJob& j) { return j.running_option >= 0; });
  if (cluster.nodes % block == 0 && cluster.nodes > block && !any_running) {
    int anchor = -1;
    for (int j = 0; j < n_jobs; ++j) {
      const SlotModel::Choice& c = m.choices[static_cast<size_t>(m.greedy[static_cast<size_t>(j)])];
      if (c.first_node < block &&
          (anchor < 0 || c.start < m.choices[static_cast<size_t>(m.greedy[static_cast<size_t>(anchor)])].start)) {
        anchor = j;
      }
    }
    for (int i = 0; anchor >= 0 && i < n_choices; ++i) {
      const SlotModel::Choice& c = m.choices[static_cast<size_t>(i)];
      if (c.job == anchor && c.first_node >= block) col_ub[static_cast<size_t>(i)] = 0.0;
    }
  }

  std::unique_ptr<Cbc_Model, CbcDeleter> model(Cbc_newModel());
  Cbc_loadProblem(model.get(), n_cols, n_rows, start.data(), index.data(), value.data(), col_lb.data(), col_ub.data(),
                  obj.data(), row_lb.data(), row_ub.data());
  for (int i = 0; i < n_choices; ++i) Cbc_setInteger(model.get(), i);
  {
    // The greedy schedule, in slots: the first incumbent.
    std::vector<int> cols(m.greedy.begin(), m.greedy.end());
    std::vector<double> vals(cols.size(), 1.0);
    if (makespan) {
      cols.push_back(c_col);
      vals.push_back(static_cast<double>(m.horizon));
    }
    Cbc_setMIPStartI(model.get(), static_cast<int>(cols.size()), cols.data(), vals.data());
  }
  Cbc_setMaximumSeconds(model.get(), options.time_limit_s);
  Cbc_setLogLevel(model.get(), 0);
  Cbc_solve(model.get());
  r.solve_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double* x = Cbc_bestSolution(model.get());  // null when no integer solution was found
  if (x == nullptr) {
    throw Error("plan", fmt::format("CBC found no plan for {} jobs within {} s", n_jobs, options.time_limit_s));
  }
  r.selected.assign(static_cast<size_t>(n_jobs), -1);
  for (int i = 0; i < n_choices; ++i) {
    if (x[i] > 0.5) r.selected[static_cast<size_t>(m.choices[static_cast<size_t>(i)].job)] = i;
  }
  for (int j = 0; j < n_jobs; ++j) {
    if (r.selected[static_cast<size_t>(j)] < 0) {
      throw Error("plan",
                  fmt::format("CBC's solution places no choice for job {}", jobs[static_cast<size_t>(j)].profile.name));
    }
  }
  r.optimal = Cbc_isProvenOptimal(model.get()) != 0;
  r.objective_slots = m.objective_of(r.selected);
  r.late_slots = m.late_slots_of(r.selected);
  // The solver's bound without the tie-breaking term (below half a slot in total), rounded up: the makespan is a
  // whole number of slots.
  const double bound = Cbc_getBestPossibleObjValue(model.get());
  r.bound_slots = makespan ? std::ceil(bound - 0.5 - 1e-9) : bound;
  if (r.optimal) r.bound_slots = r.objective_slots;
  r.bound_slots = std::min(r.bound_slots, r.objective_slots);
  r.schedule = schedule_from_slots(m, r.selected, jobs, cluster);
  // Rounding to slots can cost the solver's plan more than it gains: the greedy schedule, unrounded, is kept when
  // it is at least as good (deadlines first, then the objective).
  if (!better_schedule(r.schedule, greedy, jobs, options.objective)) {
    r.schedule = greedy;
    r.schedule.policy = "milp";
    r.greedy_kept = true;
  }
  spdlog::debug("[plan] CBC: {} variables, {} rows, {:.2f} s, objective {} slots, bound {}", n_cols, n_rows, r.solve_s,
                r.objective_slots, r.bound_slots);
  return r;
}

}  // namespace tessera::planner
