// The executor behind `plan --run` (docs/planner.md, "Running a plan"): starts each job of a plan with `train` at its
// planned time on its devices, watches the jobs, and re-plans when reality departs from the plan.
//
// On this machine only (a one-node cluster): devices are CPU cores (the job's ranks, one thread each, pinned to its
// cores) or GPUs (CUDA_VISIBLE_DEVICES). Each job runs as
//
//   train --recipe R --nproc-per-node N <its overrides> <its configuration> run_name=<job>
//         save_folder=<work>/<job>/ckpt autoresume=true loggers.jsonl={filename: <work>/<job>/metrics.jsonl}
//
// with its output in <work>/<job>/attempt-K.log. A job starts once its planned time has come and its devices are
// free. The executor re-solves the MILP for what is left (running jobs may go on where they run, or be stopped and
// restarted elsewhere, resuming from their checkpoints by resharding) when:
//   - a job ends earlier or later than planned, or is predicted to from its progress, by more than the tolerance;
//   - a job fails (it restarts, resuming from its latest checkpoint, up to max_retries times);
//   - a device disappears: on CPU, a core leaves this process's affinity set (e.g. `taskset -p`), and the jobs on it
//     are stopped with SIGTERM (they save a checkpoint); on GPUs, NVML reads the GPU as lost, or reports a hardware
//     XID or new uncorrected ECC errors on it (gpu_loss_reason), and the jobs on it are killed (they resume from
//     their latest checkpoint). Either way they are placed again on the devices left.
// A running job is stopped and moved only when the new plan says so (SIGTERM: it checkpoints and exits 75, then
// restarts on its new devices).
//
// Not thread-safe; runs child processes and owns them until it returns (they are killed if it throws).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "tessera/planner/cluster.h"
#include "tessera/planner/jobs.h"
#include "tessera/planner/schedule.h"
#include "tessera/util/nvml.h"

namespace tessera::planner {

// Why the executor counts a GPU as lost, from NVML's read of it (empty: it does not):
//   - a critical XID that NVIDIA's XID catalogue puts on the hardware (48 double-bit ECC error, 63/64 ECC page
//     retirement or row remapping, 74 NVLink error, 79 fallen off the bus, 92 high single-bit ECC rate, 94/95
//     contained/uncontained ECC error, 119/120 GSP error); XIDs a program causes (13, 31, 43, ...) are its own;
//   - uncorrected ECC errors above `ecc_before`, the count at the previous read (-1: none known).
std::string gpu_loss_reason(const util::GpuHealth& health, int64_t ecc_before);
// Whether an NVML error message says the GPU is gone (NVML_ERROR_GPU_IS_LOST, or its handle is no longer found).
bool nvml_error_means_gpu_lost(const std::string& message);

struct ExecJob {
  JobSpec spec;
  PlanJob plan;  // the job's profile and options (for all its steps)
};

struct ExecOptions {
  std::string train_bin;       // the `train` executable
  std::string work_dir;        // per job: <work_dir>/<job>/ (attempt logs, checkpoints, metrics)
  std::vector<int> devices;    // the physical devices (CPU core or GPU ids) behind devices 0.. (empty: CPU cores
                               // this process may use, or GPUs 0..)
  SolveOptions solve;          // for the re-plans
  bool replan = true;          // false: follow the plan as it is (jobs still wait for their devices)
  double tolerance = 0.15;     // a departure worth a re-plan: this fraction of the job's planned duration ...
  double min_departure_s = 3;  // ... and at least this many seconds
  double poll_s = 0.1;         // how often the executor looks at its jobs
  int max_retries = 2;         // restarts per job after failures
  std::vector<std::string> overrides;  // appended to every job's command line
};

struct ExecAttempt {
  std::vector<int64_t> devices;  // physical ids
  std::string configuration;
  double start_s = 0;  // since the run began
  double end_s = 0;
  int64_t from_step = 0;  // resumed from this batch
  int64_t to_step = 0;    // last batch it logged
  std::string outcome;    // "done", "moved", "device lost", "failed: exited with code 1", ...
};

struct ExecJobReport {
  std::string name;
  double planned_start_s = 0;  // in the first plan
  double planned_end_s = 0;
  double start_s = 0;  // first attempt's start
  double end_s = 0;    // last attempt's end
  bool done = false;
  std::vector<ExecAttempt> attempts;
  double deadline_s = std::numeric_limits<double>::infinity();  // the job's, from the start of the run
};

struct ExecReport {
  double planned_makespan_s = 0;
  double makespan_s = 0;  // from the start of the run to the end of the last job
  std::vector<ExecJobReport> jobs;
  std::vector<std::string> events;  // "[  12.3 s] ..." lines, as logged
  int replans = 0;
  bool ok = false;  // every job done
};

// Runs `plan` (placements on devices 0.. of `cluster`'s one node) and returns when every job has ended. ConfigError
// for a cluster of several nodes or more devices than this machine offers.
ExecReport execute_plan(const std::vector<ExecJob>& jobs, const Cluster& cluster, const Schedule& plan,
                        const ExecOptions& options);

// The report as a table: per job, planned and actual start and end, and its attempts; then the makespans and, when
// jobs have deadlines, which ones ended after theirs.
std::string render_report(const ExecReport& report);

}  // namespace tessera::planner
