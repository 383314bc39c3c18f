// NCCL process groups (CUDA collectives) through LibTorch's c10d. Built when CMake finds NCCL; exercised only on
// machines with a GPU.
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "backend.h"

namespace tessera::dist::detail {

c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                            std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
}

bool nccl_available() {
  return true;
}

}  // namespace tessera::dist::detail
