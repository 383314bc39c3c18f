// Profiled throughput (docs/planner.md, "Profiling"): short trial runs of a job's configurations on this machine,
// with `train` and its launcher, so that the planner chooses from measured step times rather than modelled ones.
//
// A trial trains the job's recipe in one configuration (strategy, activation checkpointing, microbatch size) on
// `devices` devices, with evaluation and the recipe's callbacks and loggers off. A job that checkpoints every
// k <= `max_save_interval_steps` steps (JobProfile::save_interval_steps) saves every k steps in its trial too, into
// the trial's folder, and its measured stretch covers whole intervals, so that the step time includes the saves'
// share of it; a longer interval is profiled without saves. Trials run in waves that
// keep every device of the node busy, as a plan does (on two cores, two 1-core trials side by side; a trial on every
// core alone), so that what they measure includes what jobs running side by side cost each other. The step time is
// read from rank 0's heartbeats (util/heartbeat.h: the wall time of each batch) over the stretch in which every trial
// of the wave has passed its warm-up, at least `measure_s` seconds and `measure_steps` batches each; the startup is
// the time from launch to the first batch, less that batch. On CPU devices are cores: a trial's ranks (one thread
// each) run pinned to its cores; on GPUs, CUDA_VISIBLE_DEVICES names its devices.
//
// Not thread-safe; runs child processes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/planner/cluster.h"
#include "tessera/planner/jobs.h"
#include "tessera/planner/perf_model.h"

namespace tessera::planner {

struct ProfileOptions {
  std::string train_bin;                  // the `train` executable
  std::string work_dir;                   // trial logs go under <work_dir>/trials/
  std::string cache_path;                 // the JSON cache (created if missing; empty: no cache)
  double budget_s = 600;                  // seconds for all the trials together; no wave starts past it
  int64_t warmup_steps = 3;               // batches before the measured stretch (allocator, caches, first touch)
  double measure_s = 3;                   // the measured stretch: at least this long ...
  int64_t measure_steps = 5;              // ... and at least this many batches of every trial in the wave
  int64_t max_save_interval_steps = 100;  // a job saving at most this many steps apart is profiled with its saves
  int64_t per_device_count = 2;           // configurations tried per device count, in the model's order of speed
  std::vector<int> cpus;  // CPU devices: the cores, in device order (empty: this process's affinity set)
};

// One trial's outcome.
struct Trial {
  std::string job;
  Candidate config;  // as modelled, before the measurement
  bool cached = false;
  bool ok = false;
  double step_s = 0;
  double startup_s = 0;
  double peak_rss_bytes = 0;  // the largest process of the trial (CPU memory)
  double wall_s = 0;          // the trial's process, launch to kill (0 when cached)
  std::string error;          // the trial's failure, with its log's path
};

struct ProfileReport {
  std::vector<Trial> trials;
  double spent_s = 0;  // wall time of the trials run (not cached)
  bool budget_exhausted = false;
  // The calibrated model against every profiled point: mean and largest |modelled - measured| / measured.
  double model_error_mean = 0;
  double model_error_max = 0;
};

// Profiles the jobs (read from `specs`) on `cluster`: returns, per job, its configurations with the profiled ones
// measured and the rest modelled at the job's measured FLOP rate, ready for select_best. Fills `report`. ConfigError
// when the cluster has more than one node (trials run on this machine only) or more devices per node than this
// machine offers.
std::vector<std::vector<Candidate>> profile_jobs(const std::vector<JobSpec>& specs, const std::vector<JobProfile>& jobs,
                                                 const Cluster& cluster, const ProfileOptions& options,
                                                 ProfileReport& report);

// The configuration as `train` overrides: the sharding strategy, activation checkpointing and the microbatch size.
std::vector<std::string> configuration_overrides(const Candidate& c);

// The cores this process may run on (sched_getaffinity), ascending.
std::vector<int> allowed_cpus();

}  // namespace tessera::planner
