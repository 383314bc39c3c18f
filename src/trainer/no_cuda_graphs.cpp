// StepGraph in a build whose LibTorch has no CUDA (step_graph.h): every run says so before training starts, so none
// of these is reached.
#include "tessera/trainer/step_graph.h"
#include "tessera/util/error.h"

namespace tessera::trainer::detail {

std::string cuda_graphs_unsupported(const at::Device& /*device*/) {
  return "this build of Tessera has no CUDA (its LibTorch was built without it)";
}

struct StepGraph::Impl {};

StepGraph::StepGraph(const at::Device& device, int64_t warmup_steps) : device_(device), warmup_steps_(warmup_steps) {}

StepGraph::~StepGraph() = default;

void StepGraph::on_side_stream(const std::function<void()>& fn) {
  fn();
}

std::string StepGraph::capture(const std::function<void()>& /*fn*/) {
  failed_ = true;
  return cuda_graphs_unsupported(at::kCPU);
}

void StepGraph::replay() {
  throw Error("train", "StepGraph::replay: " + cuda_graphs_unsupported(at::kCPU));
}

void StepGraph::release_graph() {}

}  // namespace tessera::trainer::detail
