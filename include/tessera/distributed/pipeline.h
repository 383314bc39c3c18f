// Pipeline parallelism's plan: which decoder blocks each stage runs, and in which order a stage runs the forward and
// backward passes of one step's microbatches (the schedule, with torchtitan's names for
// `parallelism.pipeline_parallel_schedule`). The engine (fsdp.h, ParallelOptions::pipeline) runs a stage's blocks and
// skips the others; the trainer drives the schedule, sending activations and their gradients between neighbouring
// stages (Communicator::send / recv).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tessera::dist {

enum class PipelineSchedule {
  kGPipe,  // every microbatch's forward, then every backward (GPipe)
  k1F1B,   // (stages - stage - 1) forwards, then one forward and one backward in turn, then the rest (PipeDream-Flush)
};

// The schedule named `name` (torchtitan's names: "GPipe", "1F1B"); nullopt for any other.
std::optional<PipelineSchedule> pipeline_schedule_named(const std::string& name);
// torchtitan's schedules that need virtual stages (several per rank), which Tessera does not run yet.
bool needs_virtual_stages(const std::string& name);
std::string to_string(PipelineSchedule s);

struct PipelineAction {
  enum class Kind { kForward, kBackward };
  Kind kind = Kind::kForward;
  int64_t microbatch = 0;
  bool operator==(const PipelineAction& o) const { return kind == o.kind && microbatch == o.microbatch; }
};

// Stage `stage`'s actions for one step of `microbatches` microbatches over `stages` stages, in order. Every
// microbatch's forward comes before its backward, forwards and backwards each in microbatch order, so that
// neighbouring stages, sending to each other in that order, never wait on each other in a cycle.
std::vector<PipelineAction> pipeline_actions(PipelineSchedule s, int stage, int stages, int64_t microbatches);

// The schedule's idle fraction per rank in theory, for equal forward and backward times per stage: (stages - 1) /
// (microbatches + stages - 1) for GPipe and 1F1B alike (1F1B holds fewer activations, not fewer bubbles).
double bubble_fraction(PipelineSchedule s, int stages, int64_t microbatches);

// The decoder blocks (units 1..blocks, models/causal_lm.h) of stage `stage`: `blocks` split into `stages` contiguous
// runs as evenly as possible, the earlier stages taking one more when they do not divide (the first stage also runs
// the embeddings and the last the head). {first, last}, inclusive; first > last when a stage gets none.
std::pair<int64_t, int64_t> stage_blocks(int64_t blocks, int stage, int stages);

}  // namespace tessera::dist
