// StepGraph's CUDA side (step_graph.h): the side stream, capture into a private memory pool, replay. Built when
// LibTorch has CUDA (src/CMakeLists.txt); no_cuda_graphs.cpp stands in otherwise.
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>

#include "tessera/trainer/step_graph.h"

namespace tessera::trainer::detail {

std::string cuda_graphs_unsupported(const at::Device& device) {
  if (!device.is_cuda()) return "CUDA graphs need a GPU (this run's device is the CPU)";
  return "";
}

namespace {

// A stream of the graph's own: one from LibTorch's pool may also be handed to other code, whose work would then be
// captured too.
cudaStream_t new_stream(c10::DeviceIndex device) {
  const c10::cuda::CUDAGuard on(device);
  cudaStream_t s = nullptr;
  C10_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

}  // namespace

struct StepGraph::Impl {
  explicit Impl(const at::Device& d)
      : device(d.index()), raw(new_stream(device)), side(c10::cuda::getStreamFromExternal(raw, device)) {}
  ~Impl() {
    graph.reset();
    (void)cudaStreamDestroy(raw);  // after its last work, which the device finishes first
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // Ends a capture that `fn` or capture_end() abandoned, and hands the pool's memory back: the allocators stop
  // routing the side stream's allocations into the pool, and free it once its last tensor dies. Each step is
  // attempted whatever the others did: capture_end() may have failed before or after ending the allocators' routing,
  // and a step that finds nothing to undo throws.
  void abandon() {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(side.stream(), &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
      cudaGraph_t partial = nullptr;
      if (cudaStreamEndCapture(side.stream(), &partial) == cudaSuccess && partial != nullptr) {
        (void)cudaGraphDestroy(partial);
      }
    }
    (void)cudaGetLastError();  // the capture's error is reported by the caller, and must not fail a later call
    auto quietly = [](const std::function<void()>& undo) {
      try {
        undo();
      } catch (const std::exception&) {  // nothing of this kind was left to undo
      }
    };
    quietly([this] { c10::cuda::CUDACachingAllocator::endAllocateToPool(device, pool); });
    quietly([this] { at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(pool); });
    quietly([this] { c10::cuda::CUDACachingAllocator::releasePool(device, pool); });
    quietly([this] { at::getHostAllocator(at::kCUDA)->release_pool(pool); });
    graph.reset();
  }

  c10::DeviceIndex device;
  cudaStream_t raw;
  at::cuda::CUDAStream side;
  c10::MempoolId_t pool{0, 0};
  std::unique_ptr<at::cuda::CUDAGraph> graph;
};

StepGraph::StepGraph(const at::Device& device, int64_t warmup_steps) : device_(device), warmup_steps_(warmup_steps) {}

StepGraph::Impl& StepGraph::impl() {
  if (!impl_) impl_ = std::make_unique<Impl>(device_);
  return *impl_;
}

StepGraph::~StepGraph() = default;

void StepGraph::on_side_stream(const std::function<void()>& fn) {
  Impl& g = impl();
  const at::cuda::CUDAStream current = at::cuda::getCurrentCUDAStream(g.device);
  at::cuda::CUDAEvent queued;
  queued.record(current);
  queued.block(g.side);
  struct Join {  // also when fn throws: nothing the side stream still runs may be overtaken by the current stream
    at::cuda::CUDAStream side, current;
    ~Join() {
      at::cuda::CUDAEvent done;
      done.record(side);
      done.block(current);
    }
  } join{g.side, current};
  const c10::cuda::CUDAStreamGuard guard(g.side);
  fn();
}

std::string StepGraph::capture(const std::function<void()>& fn) {
  std::string failure;
  Impl& g = impl();
  // The warmup's activations are cached blocks of the side stream that nothing outside the graph's pool will use
  // again: handed back first, so that the pool's memory comes on top of the eager step's peak only once.
  c10::cuda::CUDACachingAllocator::emptyCache();
  on_side_stream([&] {
    g.graph = std::make_unique<at::cuda::CUDAGraph>();
    g.pool = at::cuda::graph_pool_handle();
    // Dropout's random numbers: the default generator hands each replay fresh offsets, as eager steps would draw.
    g.graph->register_generator_state(at::cuda::detail::getDefaultCUDAGenerator(g.device));
    // Thread-local: the data loader's and the monitors' threads keep making CUDA calls while this one captures.
    g.graph->capture_begin(g.pool, cudaStreamCaptureModeThreadLocal);
    try {
      fn();
    } catch (const std::exception& e) {
      failure = e.what();
      g.abandon();
      return;
    }
    try {
      g.graph->capture_end();
    } catch (const std::exception& e) {
      failure = e.what();
      g.abandon();
    }
  });
  if (!failure.empty()) {
    failed_ = true;
    // The first line of LibTorch's message (its trace follows).
    return failure.substr(0, failure.find('\n'));
  }
  captured_ = true;
  return "";
}

void StepGraph::replay() {
  TORCH_CHECK(captured_ && impl_ && impl_->graph, "StepGraph::replay before a successful capture");
  impl_->graph->replay();
  ++replays_;
}

void StepGraph::release_graph() {
  if (impl_) impl_->graph.reset();
}

}  // namespace tessera::trainer::detail
