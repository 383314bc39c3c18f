// `profiler:` (Composer's Profiler, as LLM Foundry's train.py builds it from a recipe): LibTorch's Kineto profiler
// over a cyclic schedule of training batches, one Chrome/Perfetto trace per rank and cycle (the files TensorBoard's
// profile plugin and ui.perfetto.dev open), and the time split of each traced window in the metrics (JSONL,
// TensorBoard, MLflow): what fraction went to GEMMs, attention, the loss, the optimizer, data loading,
// communication, norms, elementwise kernels and idle time.
//
//   profiler:
//     schedule: {skip_first: 2, wait: 0, warmup: 1, active: 3, repeat: 1}
//     torch_prof_folder: '{run_name}/torch_traces'           # rank{rank}.{batch}.pt.trace.json per cycle
//     torch_prof_record_shapes: false
//     torch_prof_profile_memory: true
//     torch_prof_with_stack: false
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/config/reader.h"
#include "tessera/core/callback.h"

namespace tessera::callbacks {

struct ProfilerOptions {
  // schedule: Composer's cyclic_schedule.
  int64_t skip_first = 0;
  int64_t wait = 0;
  int64_t warmup = 1;
  int64_t active = 4;
  int64_t repeat = 1;  // cycles per epoch; 0: every batch of the epoch after skip_first
  // The Kineto trace of each cycle: folder / filename, {run_name}, {rank} and {batch} (the cycle's last) filled in.
  std::string folder = "{run_name}/torch_traces";
  std::string filename = "rank{rank}.{batch}.pt.trace.json";
  bool overwrite = false;  // false: a folder that already holds traces is an error at the start
  bool record_shapes = false;
  bool profile_memory = true;
  bool with_stack = false;
  bool with_flops = true;
  int64_t num_traces_to_keep = -1;  // -1: all; otherwise this rank's newest K
};

// `profiler:` of a recipe. Composer's system-profiler keys (sys_prof_*) and its own JSON trace handler are reported as
// not supported yet.
ProfilerOptions parse_profiler_options(config::Section& s);

enum class ProfilerAction { kSkip, kWarmup, kActive, kActiveAndSave };

// Composer's cyclic_schedule for the batch about to run: its index in the epoch (0-based), the epoch's length when
// known, and the batch in the epoch the run resumed at (skip_first counts from there).
ProfilerAction cyclic_schedule(const ProfilerOptions& o, int64_t batch_in_epoch, std::optional<int64_t> dataloader_len,
                               int64_t resumption_batch_in_epoch);

// One event of a trace: a host operator or scope (on a thread), or a device kernel, copy or memset.
struct TraceEvent {
  std::string name;
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
  uint64_t thread = 0;
  bool device = false;
};

// Where a traced window's time went. With device events: each kernel's time by its name's category over the window
// from the first device activity to the last, and idle = the part of it no kernel, copy or memset covered. Without
// (a CPU run): the training thread's steps (the ProfilerStep#N scopes), each operator's self time in the category of
// its outermost categorised enclosing scope or operator (an attention operator's matrix products count as
// attention, the optimizer's elementwise kernels as the optimizer), and idle = step time in no operator.
struct TimeSplit {
  double window_seconds = 0;
  int64_t steps = 0;
  std::map<std::string, double> seconds;  // category -> seconds (idle included)
};
TimeSplit time_split(const std::vector<TraceEvent>& events);
// The category of an operator or kernel name: attention, gemm, loss, optimizer, data, communication, norm, embedding,
// reduction, elementwise, or "" for none.
std::string time_category(const std::string& name);

std::shared_ptr<core::Callback> make_profiler(ProfilerOptions options, const core::RunContext& run);

}  // namespace tessera::callbacks
