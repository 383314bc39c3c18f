// Internal: the c10d process groups behind dist::Communicator. gloo_backend.cpp always builds; nccl_backend.cpp or
// no_nccl.cpp is chosen by CMake, so no #ifdef reaches the communicator's logic.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

#include "tessera/distributed/communicator.h"

namespace tessera::dist {

class Communicator::Backend {
 public:
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> pg;
  std::string prefix;        // store namespace of this group
  std::string gloo_address;  // the local address Gloo binds (unless GLOO_SOCKET_IFNAME names an interface)
  std::chrono::milliseconds timeout{0};
  bool cuda = false;
};

namespace detail {

// A Gloo process group over `store`, bound to the interface GLOO_SOCKET_IFNAME names, else to `address`.
c10::intrusive_ptr<c10d::Backend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                            std::chrono::milliseconds timeout, const std::string& address);
// An NCCL process group on the current CUDA device; throws CommError when Tessera was built without NCCL.
c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                            std::chrono::milliseconds timeout);
bool nccl_available();

}  // namespace detail
}  // namespace tessera::dist
