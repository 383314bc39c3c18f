// Built instead of nccl_backend.cpp when CMake finds no NCCL: CUDA collectives are unavailable.
#include "backend.h"

namespace tessera::dist::detail {

c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                            std::chrono::milliseconds) {
  throw CommError("dist",
                  "this build of Tessera has no NCCL (CMake did not find it); CUDA training across "
                  "processes needs it");
}

bool nccl_available() {
  return false;
}

}  // namespace tessera::dist::detail
