// The out-of-memory retry protocol of `device_train_microbatch_size: auto`.
#include "tessera/trainer/microbatching.h"

#include <fmt/format.h>

#include <algorithm>

#include "tessera/util/device.h"
#include "tessera/util/error.h"

namespace tessera::trainer {

bool OutOfMemoryRetry::absorb(const std::exception& e, dist::ParallelModel& parallel) const {
  if (!enabled_) return false;
  const bool peer = dynamic_cast<const dist::PeerOutOfMemory*>(&e) != nullptr;
  if (!peer && !util::is_out_of_memory(e)) return false;
  // This rank's own error takes the place of its next sync point (a peer's error was seen at one already).
  if (!peer) parallel.agree_on_oom(true);
  parallel.discard_microbatches();
  return true;
}

bool OutOfMemoryRetry::peer_failed(dist::ParallelModel& parallel) const {
  if (!enabled_ || !parallel.agree_on_oom(false)) return false;
  parallel.discard_microbatches();
  return true;
}

int64_t OutOfMemoryRetry::halve(int64_t size, int64_t rank) {
  if (size == 1) {
    throw Error("train", fmt::format("rank {}: out of memory with device_train_microbatch_size=1 (on this rank or "
                                     "another): not even 1 sample fits",
                                     rank));
  }
  return std::max<int64_t>(1, size / 2);
}

}  // namespace tessera::trainer
