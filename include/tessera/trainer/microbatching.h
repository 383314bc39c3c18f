// `device_train_microbatch_size: auto`: the out-of-memory retry protocol the training loop calls around a batch's
// microbatches. When a rank runs out of memory (util::is_out_of_memory) or learns at one of the sharding engine's sync
// points that another did (dist::PeerOutOfMemory), every rank discards the batch's partial work, halves the
// microbatch and runs the batch again (see distributed/fsdp.h for how the ranks agree). Not thread-safe.
#pragma once

#include <cstdint>
#include <exception>

#include "tessera/distributed/fsdp.h"

namespace tessera::trainer {

class OutOfMemoryRetry {
 public:
  explicit OutOfMemoryRetry(bool enabled) : enabled_(enabled) {}
  bool enabled() const { return enabled_; }
  // Called with an exception thrown while the microbatches ran. True: it was this rank's or a peer's out-of-memory
  // error under `auto`, the other ranks have been told (through `parallel`'s next sync point) and the partial work is
  // discarded, so the batch is to be retried smaller. False: not ours to handle (the caller rethrows).
  bool absorb(const std::exception& e, dist::ParallelModel& parallel) const;
  // After this rank's microbatches ran: whether another rank ran out of memory after its last collective (then the
  // partial work is discarded and the batch is to be retried). Every rank calls it.
  bool peer_failed(dist::ParallelModel& parallel) const;
  // The microbatch size to retry with after a failure at `size`; throws tessera::Error naming `rank` at size 1.
  static int64_t halve(int64_t size, int64_t rank);

 private:
  bool enabled_;
};

}  // namespace tessera::trainer
