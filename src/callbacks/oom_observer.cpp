// `oom_observer`: the CUDA caching allocator's history and its snapshot on an out-of-memory error.
#include "tessera/callbacks/oom_observer.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <string>
#include <utility>

#include "tessera/core/state.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"
#include "tessera/util/path_pattern.h"

// The allocator's history and its pickled snapshot, when LibTorch was built with CUDA (the pinned wheel is).
#if __has_include(<c10/cuda/CUDACachingAllocator.h>) && __has_include(<torch/csrc/cuda/memory_snapshot.h>)
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/cuda/memory_snapshot.h>
#define TESSERA_WITH_CUDA_MEMORY_SNAPSHOT 1
#endif

namespace tessera::callbacks {

namespace fs = std::filesystem;

struct OomObserver::Shared {
  OomObserverOptions o;
  core::RunContext run;
  std::string folder;
  std::atomic<int64_t> batch{0};
  std::atomic<bool> recording{false};
  std::mutex write;  // one snapshot at a time (several devices may run out at once)
};

OomObserverOptions parse_oom_observer_options(config::Section& s) {
  OomObserverOptions o;
  o.max_entries = s.get_int("max_entries", o.max_entries);
  s.check(o.max_entries > 0, "max_entries", "must be positive");
  o.folder = s.get_string("folder", o.folder);
  o.filename = s.get_string("filename", o.filename);
  s.check(!o.filename.empty() && o.filename.find('/') == std::string::npos, "filename",
          "must be a file name (the folder is `folder`)");
  o.overwrite = s.get_bool("overwrite", o.overwrite);
  if (s.has("remote_file_name")) {
    s.not_supported("remote_file_name", "uploading the snapshot (it is written to `folder`)");
  } else {
    s.raw("remote_file_name");  // null: no upload, as asked
  }
  s.finish();
  return o;
}

OomObserver::OomObserver(OomObserverOptions o, core::RunContext run) : shared_(std::make_shared<Shared>()) {
  shared_->o = std::move(o);
  shared_->run = std::move(run);
}

// The allocator keeps its observer for the process's life; it holds only a weak reference to this callback's state,
// and the history stops with the callback.
OomObserver::~OomObserver() {
#ifdef TESSERA_WITH_CUDA_MEMORY_SNAPSHOT
  if (shared_->recording.exchange(false)) torch::cuda::_record_memory_history(false);
#endif
}

std::string OomObserver::write_snapshot(Shared& sh) {
#ifdef TESSERA_WITH_CUDA_MEMORY_SNAPSHOT
  if (!sh.recording) return "";
  const std::lock_guard<std::mutex> lock(sh.write);
  const c10::cuda::CUDACachingAllocator::SnapshotInfo info = c10::cuda::CUDACachingAllocator::snapshot();
  bool any = false;
  for (const auto& trace : info.device_traces) any = any || !trace.empty();
  if (!any) {
    spdlog::info("oom_observer: no allocation was recorded; no snapshot written");
    return "";
  }
  const std::string name =
      util::fill_path_pattern(sh.o.filename, sh.run.run_name, sh.run.rank, sh.batch.load()) + "_snapshot.pickle";
  const std::string path = (fs::path(sh.folder) / name).string();
  util::write_file_atomically(path, torch::cuda::_memory_snapshot_pickled(), "oom_observer");
  return path;
#else
  (void)sh;
  return "";
#endif
}

void OomObserver::run_event(core::Event event, core::State& state, core::Logger& /*logger*/) {
  Shared& sh = *shared_;
  if (event == core::Event::kBatchStart || event == core::Event::kBatchEnd) {
    sh.batch = state.timestamp.batch;  // {batch}: the batches done, as Composer's timestamp at the error
    return;
  }
  if (event != core::Event::kFitStart || sh.recording) return;
  if (!state.device.is_cuda()) {
    if (sh.run.rank == 0) {
      spdlog::warn("oom_observer: the model is on {}, and the observer works on CUDA devices only; it does nothing",
                   state.device.str());
    }
    return;
  }
#ifdef TESSERA_WITH_CUDA_MEMORY_SNAPSHOT
  sh.folder = util::fill_path_pattern(sh.o.folder, sh.run.run_name, sh.run.rank);
  fs::create_directories(sh.folder);
  if (!sh.o.overwrite && !fs::is_empty(sh.folder)) {
    throw ConfigError("callbacks.oom_observer.folder",
                      fmt::format("{} is not empty; set overwrite: true to write snapshots into it", sh.folder));
  }
  torch::cuda::_record_memory_history(/*enabled=*/true, /*record_context=*/true, sh.o.max_entries,
                                      /*trace_alloc_record_context=*/true);
  sh.recording = true;
  std::weak_ptr<Shared> weak = shared_;
  c10::cuda::CUDACachingAllocator::attachOutOfMemoryObserver(
      [weak](int64_t device, size_t allocated, size_t total, size_t free) {
        const std::shared_ptr<Shared> s = weak.lock();
        if (!s || !s->recording) return;
        spdlog::warn("oom_observer: out of memory on cuda:{} (asked {} bytes, {} of {} free)", device, allocated, free,
                     total);
        try {
          const std::string path = write_snapshot(*s);
          if (!path.empty())
            spdlog::warn("oom_observer: the allocator's snapshot: {} (open it in pytorch.org/memory_viz)", path);
        } catch (const std::exception& e) {
          spdlog::error("oom_observer: writing the snapshot failed: {}", e.what());
        }
      });
  spdlog::info("oom_observer: recording the CUDA allocator's history ({} entries) into {}", sh.o.max_entries,
               sh.folder);
#endif
}

}  // namespace tessera::callbacks
