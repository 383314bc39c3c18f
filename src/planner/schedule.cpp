// Schedules: their checks, the naive policies, and the plan table.
#include "tessera/planner/schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "tessera/util/error.h"

namespace tessera::planner {
namespace {

// Where an option can start given the devices' free times: the earliest start over its placements (one node, or
// an aligned block of whole nodes), with the devices it takes. Ties go to the lowest node and device.
struct Slot {
  double start = 0;
  std::vector<int64_t> devices;
};

Slot earliest_slot(const Candidate& option, const std::vector<double>& free_at, const Cluster& cluster) {
  const int64_t per_node = cluster.devices_per_node;
  Slot best;
  best.start = std::numeric_limits<double>::infinity();
  if (option.nodes <= 1) {
    for (int64_t n = 0; n < cluster.nodes; ++n) {
      std::vector<int64_t> devs(static_cast<size_t>(per_node));
      std::iota(devs.begin(), devs.end(), n * per_node);
      std::stable_sort(devs.begin(), devs.end(), [&](int64_t a, int64_t b) {
        return free_at[static_cast<size_t>(a)] < free_at[static_cast<size_t>(b)];
      });
      devs.resize(static_cast<size_t>(option.devices));
      const double start = free_at[static_cast<size_t>(devs.back())];
      if (start < best.start) {
        std::sort(devs.begin(), devs.end());
        best = {start, devs};
      }
    }
  } else {
    for (int64_t first = 0; first + option.nodes <= cluster.nodes; first += option.nodes) {
      std::vector<int64_t> devs(static_cast<size_t>(option.nodes * per_node));
      std::iota(devs.begin(), devs.end(), first * per_node);
      double start = 0;
      for (int64_t d : devs) start = std::max(start, free_at[static_cast<size_t>(d)]);
      if (start < best.start) best = {start, devs};
    }
  }
  return best;
}

Placement place(int job, int option, const PlanJob& j, const Slot& slot, std::vector<double>& free_at) {
  Placement p;
  p.job = job;
  p.option = option;
  p.devices = slot.devices;
  p.start_s = slot.start;
  p.end_s = slot.start + j.options[static_cast<size_t>(option)].duration_s;
  for (int64_t d : p.devices) free_at[static_cast<size_t>(d)] = p.end_s;
  return p;
}

void require_options(const std::vector<PlanJob>& jobs, const Cluster& cluster) {
  for (const PlanJob& j : jobs) {
    if (j.options.empty()) {
      throw ConfigError("plan", fmt::format("job {} fits in no configuration on {} (its model state and one sample's "
                                            "activations exceed the usable memory even fully sharded)",
                                            j.profile.name, cluster.describe()));
    }
  }
}

// Placements sorted back into job order.
Schedule in_job_order(std::string policy, std::vector<Placement> placements) {
  std::sort(placements.begin(), placements.end(), [](const Placement& a, const Placement& b) { return a.job < b.job; });
  return {std::move(policy), std::move(placements)};
}

std::string human_time(double s) {
  if (s >= 3600) return fmt::format("{:.2f} h", s / 3600);
  if (s >= 60) return fmt::format("{:.1f} min", s / 60);
  return fmt::format("{:.1f} s", s);
}

std::string where(const Placement& p, const Cluster& cluster) {
  const int64_t per_node = cluster.devices_per_node;
  const int64_t first = p.devices.front() / per_node;
  const int64_t last = p.devices.back() / per_node;
  if (first != last) return fmt::format("nodes {}-{}", first, last);
  const int64_t lo = p.devices.front() % per_node;
  const int64_t hi = p.devices.back() % per_node;
  const bool contiguous = p.devices.back() - p.devices.front() + 1 == static_cast<int64_t>(p.devices.size());
  if (contiguous)
    return lo == hi ? fmt::format("node {} dev {}", first, lo) : fmt::format("node {} dev {}-{}", first, lo, hi);
  std::string devs;
  for (int64_t d : p.devices) devs += fmt::format("{}{}", devs.empty() ? "" : ",", d % per_node);
  return fmt::format("node {} dev {}", first, devs);
}

}  // namespace

double Schedule::makespan_s() const {
  double m = 0;
  for (const Placement& p : placements) m = std::max(m, p.end_s);
  return m;
}

double Schedule::weighted_completion_s(const std::vector<PlanJob>& jobs) const {
  double sum = 0;
  for (const Placement& p : placements) sum += jobs[static_cast<size_t>(p.job)].profile.weight * p.end_s;
  return sum;
}

double Schedule::lateness_s(const std::vector<PlanJob>& jobs) const {
  double sum = 0;
  for (const Placement& p : placements) {
    const JobProfile& j = jobs[static_cast<size_t>(p.job)].profile;
    if (j.has_deadline()) sum += std::max(0.0, p.end_s - j.deadline_s);
  }
  return sum;
}

bool better_schedule(const Schedule& a, const Schedule& b, const std::vector<PlanJob>& jobs, Objective objective) {
  const double late_a = a.lateness_s(jobs), late_b = b.lateness_s(jobs);
  if (std::abs(late_a - late_b) > 1e-6 * std::max(1.0, late_b)) return late_a < late_b;
  const auto score = [&](const Schedule& s) {
    return objective == Objective::kMakespan ? s.makespan_s() : s.weighted_completion_s(jobs);
  };
  return score(a) < score(b) - 1e-9;
}

std::vector<std::string> check_schedule(const Schedule& s, const std::vector<PlanJob>& jobs, const Cluster& cluster) {
  std::vector<std::string> bad;
  const int64_t per_node = cluster.devices_per_node;
  std::vector<int> placed(jobs.size(), 0);
  std::vector<std::vector<std::pair<double, double>>> use(static_cast<size_t>(cluster.devices()));
  for (const Placement& p : s.placements) {
    if (p.job < 0 || static_cast<size_t>(p.job) >= jobs.size()) {
      bad.push_back(fmt::format("a placement names job {}, which does not exist", p.job));
      continue;
    }
    const PlanJob& j = jobs[static_cast<size_t>(p.job)];
    const std::string who = fmt::format("job {}", j.profile.name);
    ++placed[static_cast<size_t>(p.job)];
    if (p.option < 0 || static_cast<size_t>(p.option) >= j.options.size()) {
      bad.push_back(fmt::format("{}: option {} is not one of its {}", who, p.option, j.options.size()));
      continue;
    }
    const Candidate& o = j.options[static_cast<size_t>(p.option)];
    if (!o.fits) bad.push_back(fmt::format("{}: {} does not fit in device memory", who, o.describe()));
    if (static_cast<int64_t>(p.devices.size()) != o.devices) {
      bad.push_back(fmt::format("{}: {} devices given, its option takes {}", who, p.devices.size(), o.devices));
    }
    std::set<int64_t> distinct(p.devices.begin(), p.devices.end());
    std::map<int64_t, int64_t> per_node_count;
    for (int64_t d : p.devices) {
      if (d < 0 || d >= cluster.devices()) {
        bad.push_back(fmt::format("{}: device {} does not exist", who, d));
        continue;
      }
      ++per_node_count[d / per_node];
      use[static_cast<size_t>(d)].emplace_back(p.start_s, p.end_s);
    }
    if (distinct.size() != p.devices.size()) bad.push_back(fmt::format("{}: a device is given twice", who));
    if (o.nodes <= 1 && per_node_count.size() > 1) {
      bad.push_back(fmt::format("{}: spans {} nodes, its option stays within one", who, per_node_count.size()));
    }
    if (o.nodes > 1) {
      bool whole = static_cast<int64_t>(per_node_count.size()) == o.nodes;
      for (const auto& [node, count] : per_node_count) whole = whole && count == per_node;
      if (!whole) bad.push_back(fmt::format("{}: its option takes {} whole nodes", who, o.nodes));
      if (j.profile.max_nodes < o.nodes) {
        bad.push_back(fmt::format("{}: spans {} nodes, it may span {}", who, o.nodes, j.profile.max_nodes));
      }
    }
    if (p.start_s < 0) bad.push_back(fmt::format("{}: starts before 0", who));
    if (p.option == j.running_option && (p.devices != j.running_devices || p.start_s != 0)) {
      bad.push_back(fmt::format("{}: continues where it runs, but is placed elsewhere or later", who));
    }
    if (std::abs(p.end_s - p.start_s - o.duration_s) > 1e-6 * std::max(1.0, o.duration_s)) {
      bad.push_back(
          fmt::format("{}: runs {:.3f} s, its option takes {:.3f} s", who, p.end_s - p.start_s, o.duration_s));
    }
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (placed[i] != 1) bad.push_back(fmt::format("job {} is placed {} times", jobs[i].profile.name, placed[i]));
  }
  for (size_t d = 0; d < use.size(); ++d) {
    auto& u = use[d];
    std::sort(u.begin(), u.end());
    for (size_t i = 1; i < u.size(); ++i) {
      if (u[i].first < u[i - 1].second - 1e-9 * std::max(1.0, u[i - 1].second)) {
        bad.push_back(fmt::format("device {} runs two jobs at once ({:.3f}-{:.3f} s and {:.3f}-{:.3f} s)", d,
                                  u[i - 1].first, u[i - 1].second, u[i].first, u[i].second));
      }
    }
  }
  return bad;
}

Schedule sequential_schedule(const std::vector<PlanJob>& jobs, const Cluster& cluster) {
  require_options(jobs, cluster);
  std::vector<Placement> out;
  std::vector<double> free_at(static_cast<size_t>(cluster.devices()), 0.0);
  double now = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    // The options are by device count, and a larger count is kept only when it is faster: the last is the job on
    // as many devices as help it.
    const int option = static_cast<int>(jobs[i].options.size()) - 1;
    std::fill(free_at.begin(), free_at.end(), now);
    Placement p =
        place(static_cast<int>(i), option, jobs[i], earliest_slot(jobs[i].options.back(), free_at, cluster), free_at);
    now = p.end_s;
    out.push_back(std::move(p));
  }
  return in_job_order("sequential", std::move(out));
}

Schedule equal_split_schedule(const std::vector<PlanJob>& jobs, const Cluster& cluster) {
  require_options(jobs, cluster);
  const int64_t total = cluster.devices();
  // The group size: a power of two near total / jobs (a whole number of nodes above one node), raised until every
  // job has an option that fits in a group.
  int64_t group = 1;
  while (group * 2 <= std::max<int64_t>(1, total / static_cast<int64_t>(jobs.size())) && group * 2 <= total) group *= 2;
  auto fits_all = [&](int64_t g) {
    return std::all_of(jobs.begin(), jobs.end(), [&](const PlanJob& j) {
      return std::any_of(j.options.begin(), j.options.end(), [&](const Candidate& c) { return c.devices <= g; });
    });
  };
  while (!fits_all(group) && group < total) group *= 2;
  if (group > cluster.devices_per_node) {
    group = std::max<int64_t>(1, group / cluster.devices_per_node) * cluster.devices_per_node;
  } else {
    while (cluster.devices_per_node % group != 0) --group;  // groups must not straddle nodes
  }
  group = std::min(group, total);
  const int64_t groups = total / group;
  std::vector<double> group_free(static_cast<size_t>(groups), 0.0);
  std::vector<Placement> out;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const int64_t g = static_cast<int64_t>(i) % groups;
    // The job's fastest option within the group.
    int option = -1;
    for (size_t o = 0; o < jobs[i].options.size(); ++o) {
      if (jobs[i].options[o].devices <= group) option = static_cast<int>(o);
    }
    if (option < 0) {
      throw ConfigError("plan", fmt::format("equal split: job {} needs more than the {} devices of a group",
                                            jobs[i].profile.name, group));
    }
    const Candidate& c = jobs[i].options[static_cast<size_t>(option)];
    Placement p;
    p.job = static_cast<int>(i);
    p.option = option;
    for (int64_t d = 0; d < c.devices; ++d) p.devices.push_back(g * group + d);
    p.start_s = group_free[static_cast<size_t>(g)];
    p.end_s = p.start_s + c.duration_s;
    group_free[static_cast<size_t>(g)] = p.end_s;
    out.push_back(std::move(p));
  }
  return in_job_order("equal split", std::move(out));
}

namespace {

// The greedy policy with each job's options limited to at most `cap` devices (a job with none that small keeps its
// smallest). Jobs by work, largest first; with `deadlines_first`, the jobs with a deadline before the others, the
// earliest deadline first.
Schedule greedy_capped(const std::vector<PlanJob>& jobs, const Cluster& cluster, int64_t cap, bool deadlines_first) {
  require_options(jobs, cluster);
  std::vector<size_t> order(jobs.size());
  std::iota(order.begin(), order.end(), 0);
  auto work = [&](size_t i) {
    const Candidate& c = jobs[i].options.front();
    return static_cast<double>(c.devices) * c.duration_s;
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (deadlines_first && jobs[a].profile.deadline_s != jobs[b].profile.deadline_s) {
      return jobs[a].profile.deadline_s < jobs[b].profile.deadline_s;
    }
    return work(a) > work(b);
  });
  std::vector<double> free_at(static_cast<size_t>(cluster.devices()), 0.0);
  std::vector<Placement> out;
  for (size_t i = 0; i < jobs.size(); ++i) {  // running jobs go on where they run
    if (jobs[i].running_option >= 0) {
      out.push_back(
          place(static_cast<int>(i), jobs[i].running_option, jobs[i], {0.0, jobs[i].running_devices}, free_at));
    }
  }
  for (size_t i : order) {
    if (jobs[i].running_option >= 0) continue;
    int best = -1;
    Slot best_slot;
    double best_end = std::numeric_limits<double>::infinity();
    for (size_t o = 0; o < jobs[i].options.size(); ++o) {
      if (jobs[i].options[o].devices > cap && o > 0) continue;
      Slot slot = earliest_slot(jobs[i].options[o], free_at, cluster);
      const double end = slot.start + jobs[i].options[o].duration_s;
      if (end < best_end - 1e-9) {
        best = static_cast<int>(o);
        best_end = end;
        best_slot = std::move(slot);
      }
    }
    out.push_back(place(static_cast<int>(i), best, jobs[i], best_slot, free_at));
  }
  return in_job_order("greedy largest first", std::move(out));
}

}  // namespace

bool any_deadline(const std::vector<PlanJob>& jobs) {
  return std::any_of(jobs.begin(), jobs.end(), [](const PlanJob& j) { return j.profile.has_deadline(); });
}

Schedule greedy_schedule(const std::vector<PlanJob>& jobs, const Cluster& cluster) {
  return greedy_capped(jobs, cluster, cluster.devices(), any_deadline(jobs));
}

Schedule best_greedy_schedule(const std::vector<PlanJob>& jobs, const Cluster& cluster, Objective objective) {
  std::set<int64_t> caps = {cluster.devices()};
  for (const PlanJob& j : jobs) {
    for (const Candidate& c : j.options) caps.insert(c.devices);
  }
  std::vector<bool> orders = {false};
  if (any_deadline(jobs)) orders.push_back(true);
  Schedule best = greedy_schedule(jobs, cluster);
  for (bool deadlines_first : orders) {
    for (int64_t cap : caps) {
      Schedule s = greedy_capped(jobs, cluster, cap, deadlines_first);
      if (better_schedule(s, best, jobs, objective)) best = std::move(s);
    }
  }
  return best;
}

double lower_bound_s(const std::vector<PlanJob>& jobs, const Cluster& cluster) {
  double longest = 0;
  double work = 0;
  for (const PlanJob& j : jobs) {
    double shortest = std::numeric_limits<double>::infinity();
    double least = std::numeric_limits<double>::infinity();
    for (const Candidate& c : j.options) {
      shortest = std::min(shortest, c.duration_s);
      least = std::min(least, static_cast<double>(c.devices) * c.duration_s);
    }
    longest = std::max(longest, shortest);
    work += least;
  }
  return std::max(longest, work / static_cast<double>(cluster.devices()));
}

std::string render_schedule(const Schedule& s, const std::vector<PlanJob>& jobs, const Cluster& cluster) {
  std::string out = fmt::format("{:<4}{:<24}{:>5}  {:<16}{:<38}{:>12}{:>12}{:>12}\n", "#", "job", "dev", "where",
                                "configuration", "start", "end", "duration");
  std::vector<const Placement*> by_start;
  for (const Placement& p : s.placements) by_start.push_back(&p);
  std::stable_sort(by_start.begin(), by_start.end(),
                   [](const Placement* a, const Placement* b) { return a->start_s < b->start_s; });
  const bool deadlines = any_deadline(jobs);
  if (deadlines) out.insert(out.size() - 1, fmt::format("  {}", "deadline"));
  int late = 0;
  for (const Placement* p : by_start) {
    const PlanJob& j = jobs[static_cast<size_t>(p->job)];
    const Candidate& c = j.options[static_cast<size_t>(p->option)];
    out += fmt::format("{:<4}{:<24}{:>5}  {:<16}{:<38}{:>12}{:>12}{:>12}", p->job, j.profile.name, c.devices,
                       where(*p, cluster), c.describe(), human_time(p->start_s), human_time(p->end_s),
                       human_time(p->end_s - p->start_s));
    if (j.profile.has_deadline()) {
      const bool met = p->end_s <= j.profile.deadline_s + 1e-9;
      late += met ? 0 : 1;
      out += fmt::format("  {}{}", human_time(j.profile.deadline_s),
                         met ? "" : fmt::format(", LATE by {}", human_time(p->end_s - j.profile.deadline_s)));
    }
    out += "\n";
  }
  out += fmt::format("makespan {}", human_time(s.makespan_s()));
  if (deadlines) {
    const auto with =
        std::count_if(jobs.begin(), jobs.end(), [](const PlanJob& j) { return j.profile.has_deadline(); });
    out += late == 0
               ? fmt::format("; every deadline met ({} job{})", with, with == 1 ? "" : "s")
               : fmt::format("; {} of {} deadlines missed, by {} in all", late, with, human_time(s.lateness_s(jobs)));
  }
  out += "\n";
  return out;
}

}  // namespace tessera::planner
