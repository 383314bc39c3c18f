// Host memory allocator settings for training.
#pragma once

namespace tessera::util {

// Tunes glibc malloc for a training loop, which allocates and frees the same large tensors every step: blocks are
// never served by mmap (M_MMAP_MAX = 0) and freed memory is never returned to the system (M_TRIM_THRESHOLD -1).
// Without it, every tensor above 32 MiB (logits, embedding gradients) is mmapped and unmapped each step and the page
// faults cost 7% (fp32) to 25% (bf16) of an mpt-125m step on CPU; with a trim threshold (1 GiB was the setting
// before), a 1B model's freed gradients are still trimmed and faulted in again every step, half of its fp32 step
// (docs/performance.md). The process keeps its peak heap instead, as a caching allocator would. The tools call it at
// start-up; embedding code should call it once before building models. Idempotent, process-wide, not thread-safe.
void configure_host_allocator();

}  // namespace tessera::util
