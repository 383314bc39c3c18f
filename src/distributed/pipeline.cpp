#include "tessera/distributed/pipeline.h"

#include <algorithm>

namespace tessera::dist {

std::optional<PipelineSchedule> pipeline_schedule_named(const std::string& name) {
  if (name == "GPipe") return PipelineSchedule::kGPipe;
  if (name == "1F1B") return PipelineSchedule::k1F1B;
  return std::nullopt;
}

bool needs_virtual_stages(const std::string& name) {
  for (const char* s : {"Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV", "LoopedBFS"}) {
    if (name == s) return true;
  }
  return false;
}

std::string to_string(PipelineSchedule s) {
  return s == PipelineSchedule::kGPipe ? "GPipe" : "1F1B";
}

std::vector<PipelineAction> pipeline_actions(PipelineSchedule s, int stage, int stages, int64_t microbatches) {
  using Kind = PipelineAction::Kind;
  std::vector<PipelineAction> out;
  int64_t f = 0, b = 0;
  const int64_t warmup = s == PipelineSchedule::kGPipe
                             ? microbatches
                             : std::min<int64_t>(microbatches, static_cast<int64_t>(stages - stage - 1));
  for (; f < warmup; ++f) out.push_back({Kind::kForward, f});
  while (f < microbatches) {
    out.push_back({Kind::kForward, f++});
    out.push_back({Kind::kBackward, b++});
  }
  while (b < microbatches) out.push_back({Kind::kBackward, b++});
  return out;
}

double bubble_fraction(PipelineSchedule /*s*/, int stages, int64_t microbatches) {
  return static_cast<double>(stages - 1) / static_cast<double>(microbatches + stages - 1);
}

std::pair<int64_t, int64_t> stage_blocks(int64_t blocks, int stage, int stages) {
  const int64_t base = blocks / stages, extra = blocks % stages;
  const int64_t first = 1 + stage * base + std::min<int64_t>(stage, extra);
  const int64_t count = base + (stage < extra ? 1 : 0);
  return {first, first + count - 1};
}

}  // namespace tessera::dist
