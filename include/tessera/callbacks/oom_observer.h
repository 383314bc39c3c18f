// `callbacks: oom_observer:` (Composer's OOMObserver, which LLM Foundry registers under that name): on a GPU, records
// the CUDA caching allocator's history from the start of training and, when an allocation runs out of memory, writes
// the allocator's snapshot with that history as <folder>/<filename>_snapshot.pickle, the file that
// pytorch.org/memory_viz opens (the same bytes as torch.cuda.memory._dump_snapshot). Each rank writes its own. On a
// CPU it says so once and does nothing, as Composer's does.
//
//   callbacks:
//     oom_observer:
//       max_entries: 100000                 # allocation events kept in the history
//       folder: '{run_name}/torch_traces'
//       filename: 'rank{rank}_oom'          # {run_name}, {rank} and {batch} filled in
//       overwrite: false                    # false: a folder that already holds files is an error at the start
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tessera/config/reader.h"
#include "tessera/core/callback.h"

namespace tessera::callbacks {

struct OomObserverOptions {
  int64_t max_entries = 100000;
  std::string folder = "{run_name}/torch_traces";
  std::string filename = "rank{rank}_oom";
  bool overwrite = false;
};

// Composer's keys; remote_file_name (an upload through Composer's remote loggers) is not supported yet unless null.
OomObserverOptions parse_oom_observer_options(config::Section& s);

class OomObserver : public core::Callback {
 public:
  OomObserver(OomObserverOptions o, core::RunContext run);
  ~OomObserver() override;
  std::string name() const override { return "OOMObserver"; }
  void run_event(core::Event event, core::State& state, core::Logger& logger) override;

 private:
  struct Shared;  // what the allocator's observer reads, which may outlive this callback
  // Writes the allocator's snapshot; returns the file, or "" when nothing was recorded.
  static std::string write_snapshot(Shared& sh);

  std::shared_ptr<Shared> shared_;
};

}  // namespace tessera::callbacks
