// Rendezvous from the launcher's environment, and collectives over a c10d process group (or local copies for a world
// of one).
#include "tessera/distributed/communicator.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <set>

#include "backend.h"
#include "rendezvous.h"
#include "tessera/distributed/launcher.h"
#include "tessera/util/device.h"
#include "tessera/util/heartbeat.h"

namespace tessera::dist {
namespace {

std::optional<long> env_long(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0') {
    throw ConfigError("dist", fmt::format("environment variable {}=\"{}\" is not an integer", name, v));
  }
  return x;
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return c10d::ReduceOp::SUM;
    case ReduceOp::kMax:
      return c10d::ReduceOp::MAX;
    case ReduceOp::kMin:
      return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

void check_flat(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.is_contiguous(), "dist: ", what, " must be contiguous");
}

}  // namespace

Rendezvous rendezvous_from_env() {
  Rendezvous rv;
  std::optional<long> rank = env_long("RANK"), world = env_long("WORLD_SIZE");
  std::optional<long> local_rank = env_long("LOCAL_RANK"), local_world = env_long("LOCAL_WORLD_SIZE");
  if (!rank && env_long("SLURM_PROCID")) {  // srun without torchrun
    rank = env_long("SLURM_PROCID");
    world = env_long("SLURM_NTASKS");
    local_rank = env_long("SLURM_LOCALID");
    local_world = env_long("SLURM_NTASKS_PER_NODE");
    if (!local_world && env_long("SLURM_NNODES") == 1) local_world = world;  // one node: every task is local
  }
  if (!rank && !world) return rv;
  if (!rank || !world) {
    throw ConfigError("dist", "RANK and WORLD_SIZE must be set together (torchrun's convention)");
  }
  rv.rank = static_cast<int>(*rank);
  rv.world_size = static_cast<int>(*world);
  if (rv.world_size < 1 || rv.rank < 0 || rv.rank >= rv.world_size) {
    throw ConfigError("dist", fmt::format("RANK={} is not in [0, WORLD_SIZE={})", rv.rank, rv.world_size));
  }
  const char* master = std::getenv("MASTER_ADDR");
  if (master != nullptr && *master != '\0') rv.master_addr = master;
  if (auto p = env_long("MASTER_PORT")) rv.master_port = static_cast<int>(*p);
  if (rv.world_size > 1 && (!local_rank || !local_world)) {
    // Nothing says which ranks share a machine: the rendezvous finds out (Communicator::connect).
    rv.placement_known = false;
    rv.local_rank = 0;
    rv.local_world_size = 1;
    if (master == nullptr) {
      throw ConfigError("dist",
                        "MASTER_ADDR is not set, and neither is LOCAL_WORLD_SIZE: a job whose ranks may be on "
                        "several machines needs the address of rank 0's machine");
    }
    return rv;
  }
  rv.local_rank = static_cast<int>(local_rank.value_or(0));
  rv.local_world_size = static_cast<int>(local_world.value_or(1));
  if (rv.local_world_size < 1 || rv.world_size % rv.local_world_size != 0 || rv.local_rank < 0 ||
      rv.local_rank >= rv.local_world_size) {
    throw ConfigError("dist", fmt::format("LOCAL_RANK={} / LOCAL_WORLD_SIZE={} do not fit WORLD_SIZE={} (every node "
                                          "must run the same number of ranks)",
                                          rv.local_rank, rv.local_world_size, rv.world_size));
  }
  if (rv.world_size > 1 && master == nullptr && rv.local_world_size != rv.world_size) {
    throw ConfigError("dist", "MASTER_ADDR is not set: a job over several nodes needs the address of rank 0's node");
  }
  return rv;
}

namespace {

// The local address this machine uses to reach host:port, numeric.
std::string local_address_toward(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0) {
    throw CommError("dist", fmt::format("MASTER_ADDR {}: cannot resolve it: {}", host, ::gai_strerror(rc)));
  }
  std::string address;
  for (addrinfo* ai = found; ai != nullptr && address.empty(); ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    std::array<char, NI_MAXHOST> text{};
    // Connecting a UDP socket sends nothing: the kernel only picks the route, and so the local address.
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        ::getnameinfo(reinterpret_cast<sockaddr*>(&local), len, text.data(), text.size(), nullptr, 0, NI_NUMERICHOST) ==
            0) {
      address = text.data();
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  if (address.empty()) {
    throw CommError("dist", fmt::format("MASTER_ADDR {}: no local address routes there", host));
  }
  return address;
}

// Every rank's host identity, through the store (rank r writes "host/r").
std::vector<std::string> exchange_hosts(const Rendezvous& rv, c10d::Store& store, const std::string& identity) {
  store.set(fmt::format("host/{}", rv.rank), std::vector<uint8_t>(identity.begin(), identity.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < rv.world_size; ++r) keys.push_back(fmt::format("host/{}", r));
  store.wait(keys);
  std::vector<std::string> hosts;
  for (const std::vector<uint8_t>& v : store.multiGet(keys)) hosts.emplace_back(v.begin(), v.end());
  return hosts;
}

}  // namespace

Rendezvous place_by_hosts(Rendezvous rv, const std::vector<std::string>& hosts) {
  if (static_cast<int>(hosts.size()) != rv.world_size) {
    throw CommError("dist",
                    fmt::format("rank {}: {} host identities for {} ranks", rv.rank, hosts.size(), rv.world_size));
  }
  int local = 0;  // the ranks on rank 0's machine
  while (local < rv.world_size && hosts[local] == hosts[0]) ++local;
  bool node_by_node = rv.world_size % local == 0;
  std::set<std::string> machines;
  for (int r = 0; r < rv.world_size && node_by_node; ++r) {
    const int first = r / local * local;  // the first rank of r's node
    node_by_node = hosts[r] == hosts[first] && (r != first || machines.insert(hosts[r]).second);
  }
  if (!node_by_node) {
    std::vector<std::string> listing;
    for (int r = 0; r < rv.world_size; ++r) listing.push_back(fmt::format("rank {} on {}", r, hosts[r]));
    throw CommError("dist", fmt::format("rank {}: the ranks are not placed node by node (consecutive ranks on each "
                                        "machine, the same number per machine): {}; launch them so, or set "
                                        "LOCAL_RANK and LOCAL_WORLD_SIZE",
                                        rv.rank, fmt::join(listing, ", ")));
  }
  rv.local_world_size = local;
  rv.local_rank = rv.rank % local;
  rv.placement_known = true;
  return rv;
}

// ---- Work -----------------------------------------------------------------------------------------------------------

class Work::Impl {
 public:
  c10::intrusive_ptr<c10d::Work> work;
  int rank = 0;    // this process's rank in the job, for messages
  std::string op;  // "all_reduce of 4096 Float elements"
};

namespace {
std::atomic<int64_t> g_wait_nanoseconds{0};
}  // namespace

double collective_wait_seconds() {
  return static_cast<double>(g_wait_nanoseconds.load(std::memory_order_relaxed)) * 1e-9;
}

void Work::wait() {
  if (!impl_ || !impl_->work) return;
  // A rank stuck here names the collective in its heartbeat, for the launcher's watchdog.
  const util::HeartbeatScope waiting(impl_->op);
  const auto started = std::chrono::steady_clock::now();
  struct Count {  // the time waited, also when the collective fails
    std::chrono::steady_clock::time_point started;
    ~Count() {
      g_wait_nanoseconds.fetch_add(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started).count(),
          std::memory_order_relaxed);
    }
  } count{started};
  try {
    impl_->work->wait();
  } catch (const std::exception& e) {
    throw CommError("dist", fmt::format("rank {}: {} failed: {}", impl_->rank, impl_->op, e.what()));
  }
  impl_->work.reset();
}

bool Work::completed() const {
  return !impl_ || !impl_->work || impl_->work->isCompleted();
}

// ---- Communicator ---------------------------------------------------------------------------------------------------

std::shared_ptr<Communicator> Communicator::single() {
  return std::shared_ptr<Communicator>(new Communicator());
}

std::shared_ptr<Communicator> Communicator::connect(const Rendezvous& rv, const at::Device& device,
                                                    std::chrono::milliseconds timeout, bool process_group_for_one) {
  if (rv.world_size == 1 && !process_group_for_one) {
    auto c = single();
    c->rv_ = rv;
    return c;
  }
  auto backend = std::make_unique<Backend>();
  backend->timeout = timeout;
  backend->cuda = device.is_cuda();
  // The local address that reaches rank 0's store: what Gloo binds and (with the host name) what identifies this
  // machine. A job on one machine has MASTER_ADDR 127.0.0.1 and so binds loopback.
  const std::string address = local_address_toward(rv.master_addr, rv.master_port);
  backend->gloo_address = address;
  Rendezvous placed = rv;
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(rv.master_port);
  so.timeout = timeout;
  // Under torchrun the agent already serves the store on MASTER_PORT.
  const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const bool agent_store = agent != nullptr && std::string(agent) == "True";
  so.isServer = rv.rank == 0 && !agent_store;
  if (!agent_store) so.numWorkers = static_cast<size_t>(rv.world_size);
  // `train --master-port 0`: the launcher bound the port and passed its listening socket to rank 0; the store takes
  // it over (once per process: the variable goes with it).
  if (const char* fd = std::getenv(kMasterListenFdEnv); fd != nullptr && so.isServer) {
    so.masterListenFd = std::atoi(fd);
    unsetenv(kMasterListenFdEnv);
  }
  const util::HeartbeatScope waiting(
      fmt::format("rendezvous with {} ranks at {}:{}", rv.world_size, rv.master_addr, rv.master_port));
  try {
    // Rank 0's store listens where the ranks are told to connect, not on every interface (c10d's own choice): loopback
    // for a job on one machine (MASTER_ADDR 127.0.0.1), else the interface of MASTER_ADDR.
    if (so.isServer && !so.masterListenFd) {
      so.masterListenFd = detail::listen_at(rv.master_addr, rv.master_port, "the rendezvous store (MASTER_ADDR)",
                                            rv.num_nodes() > 1 || !rv.placement_known, "dist")
                              .fd;
    }
    backend->store = c10::make_intrusive<c10d::TCPStore>(rv.master_addr, so);
    // Under torchrun the agent's store outlives a restart: each attempt gets keys of its own (as torch's
    // init_process_group does with "/worker/attempt_N").
    const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
    backend->prefix = agent_store && attempt != nullptr ? fmt::format("tessera/attempt_{}", attempt) : "tessera";
    auto store = c10::make_intrusive<c10d::PrefixStore>(backend->prefix, backend->store);
    if (!rv.placement_known) placed = place_by_hosts(rv, exchange_hosts(rv, *store, util::host_name() + " " + address));
    backend->pg = backend->cuda ? detail::make_nccl(store, rv.rank, rv.world_size, timeout)
                                : detail::make_gloo(store, rv.rank, rv.world_size, timeout, address);
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError("dist", fmt::format("rank {}: rendezvous with {} ranks at {}:{} failed: {}", rv.rank, rv.world_size,
                                        rv.master_addr, rv.master_port, e.what()));
  }
  auto c = std::shared_ptr<Communicator>(new Communicator());
  c->rank_ = rv.rank;
  c->global_rank_ = rv.rank;
  c->size_ = rv.world_size;
  c->rv_ = placed;
  c->backend_ = std::move(backend);
  spdlog::debug("dist: rank {} of {} connected ({})", c->rank_, c->size_, c->backend_name());
  return c;
}

Communicator::~Communicator() = default;

std::string Communicator::backend_name() const {
  if (!backend_) return "local";
  return backend_->cuda ? "nccl" : "gloo";
}

std::string Communicator::describe(const char* op, const at::Tensor& t) const {
  return fmt::format("{} of {} {} elements", op, t.numel(), c10::toString(t.scalar_type()));
}

namespace {
Work make_work(c10::intrusive_ptr<c10d::Work> w, int rank, std::string op) {
  auto impl = std::make_shared<Work::Impl>();
  impl->work = std::move(w);
  impl->rank = rank;
  impl->op = std::move(op);
  return Work(std::move(impl));
}

// Issues the collective `op` ("all_reduce of 4096 Float elements") on this process's rank `rank`.
template <class F>
Work issue(int rank, const std::string& op, F&& f) {
  try {
    return make_work(f(), rank, op);
  } catch (const std::exception& e) {
    throw CommError("dist", fmt::format("rank {}: {} failed: {}", rank, op, e.what()));
  }
}
}  // namespace

Work Communicator::all_reduce(at::Tensor& t, ReduceOp op) {
  check_flat(t, "all_reduce tensor");
  if (!backend_) return {};
  const double n = size_;
  stats_.calls++;
  stats_.all_reduce_bytes += 2.0 * (n - 1) / n * static_cast<double>(t.nbytes());
  return issue(global_rank_, describe("all_reduce", t), [&] {
    std::vector<at::Tensor> v{t};
    c10d::AllreduceOptions o;
    o.reduceOp = to_c10d(op);
    return backend_->pg->allreduce(v, o);
  });
}

Work Communicator::reduce_scatter(at::Tensor& out, at::Tensor& in) {
  check_flat(out, "reduce_scatter output");
  check_flat(in, "reduce_scatter input");
  TORCH_CHECK(in.numel() == out.numel() * size_, "dist: reduce_scatter input has ", in.numel(), " elements, expected ",
              out.numel() * size_);
  if (!backend_) {
    out.copy_(in.view(out.sizes()));
    return {};
  }
  const double n = size_;
  stats_.calls++;
  stats_.reduce_scatter_bytes += (n - 1) / n * static_cast<double>(in.nbytes());
  return issue(global_rank_, describe("reduce_scatter", in),
               [&] { return backend_->pg->_reduce_scatter_base(out, in); });
}

Work Communicator::all_gather(at::Tensor& out, at::Tensor& in) {
  check_flat(out, "all_gather output");
  check_flat(in, "all_gather input");
  TORCH_CHECK(out.numel() == in.numel() * size_, "dist: all_gather output has ", out.numel(), " elements, expected ",
              in.numel() * size_);
  if (!backend_) {
    out.copy_(in.view(out.sizes()));
    return {};
  }
  const double n = size_;
  stats_.calls++;
  stats_.all_gather_bytes += (n - 1) / n * static_cast<double>(out.nbytes());
  return issue(global_rank_, describe("all_gather", out), [&] { return backend_->pg->_allgather_base(out, in); });
}

Work Communicator::broadcast(at::Tensor& t, int root) {
  check_flat(t, "broadcast tensor");
  if (!backend_) return {};
  stats_.calls++;
  if (rank_ == root) stats_.broadcast_bytes += static_cast<double>(t.nbytes());
  return issue(global_rank_, describe("broadcast", t), [&] {
    std::vector<at::Tensor> v{t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    return backend_->pg->broadcast(v, o);
  });
}

Work Communicator::all_to_all(at::Tensor& out, at::Tensor& in, const std::vector<int64_t>& out_splits,
                              const std::vector<int64_t>& in_splits) {
  check_flat(out, "all_to_all output");
  check_flat(in, "all_to_all input");
  const auto n = static_cast<size_t>(size_);
  TORCH_CHECK(out_splits.size() == n && in_splits.size() == n, "dist: all_to_all needs one split per rank (", size_,
              ")");
  int64_t in_rows = 0, out_rows = 0;
  for (size_t r = 0; r < n; ++r) {
    in_rows += in_splits[r];
    out_rows += out_splits[r];
  }
  TORCH_CHECK(in.dim() >= 1 && out.dim() >= 1 && in.size(0) == in_rows && out.size(0) == out_rows,
              "dist: all_to_all splits do not add up to the tensors' rows");
  if (!backend_) {
    out.copy_(in);
    return {};
  }
  const double row_bytes = in_rows > 0 ? static_cast<double>(in.nbytes()) / static_cast<double>(in_rows) : 0.0;
  stats_.calls++;
  stats_.all_to_all_bytes += static_cast<double>(in_rows - in_splits[static_cast<size_t>(rank_)]) * row_bytes;
  return issue(global_rank_, describe("all_to_all", in), [&] {
    std::vector<int64_t> o = out_splits, i = in_splits;
    return backend_->pg->alltoall_base(out, in, o, i);
  });
}

void Communicator::barrier() {
  if (!backend_) return;
  // A one-element all_reduce: Gloo's barrier and NCCL's differ in what they need; this works on both.
  at::Tensor t = at::zeros({1}, at::TensorOptions().device(backend_->cuda ? at::Device(at::kCUDA) : at::kCPU));
  Work w = issue(global_rank_, "barrier", [&] {
    std::vector<at::Tensor> v{t};
    return backend_->pg->allreduce(v);
  });
  w.wait();
}

namespace {
// A point-to-point peer: another rank of the communicator.
void check_peer(int peer, int self, int size, const char* what) {
  if (peer < 0 || peer >= size || peer == self) {
    throw CommError("dist", fmt::format("{}: rank {} is not another rank of a group of {} (this is rank {})", what,
                                        peer, size, self));
  }
}

// "recv of 4096 Float elements from rank 3 (what)": `op` described, the peer's rank in the job, and what it is.
std::string point_to_point(const std::string& op, const char* direction, int peer, const std::string& what) {
  return fmt::format("{} {} rank {}{}", op, direction, peer, what.empty() ? "" : " (" + what + ")");
}
}  // namespace

Work Communicator::send(at::Tensor& t, int dst, int tag, const std::string& what) {
  check_flat(t, "send tensor");
  check_peer(dst, rank_, size_, "send");
  stats_.calls++;
  stats_.send_bytes += static_cast<double>(t.nbytes());
  return issue(global_rank_, point_to_point(describe("send", t), "to", global_rank_of(dst), what), [&] {
    std::vector<at::Tensor> v{t};
    return backend_->pg->send(v, dst, tag);
  });
}

Work Communicator::recv(at::Tensor& t, int src, int tag, const std::string& what) {
  check_flat(t, "recv tensor");
  check_peer(src, rank_, size_, "recv");
  stats_.calls++;
  return issue(global_rank_, point_to_point(describe("recv", t), "from", global_rank_of(src), what), [&] {
    std::vector<at::Tensor> v{t};
    return backend_->pg->recv(v, src, tag);
  });
}

std::shared_ptr<Communicator> Communicator::new_group(const std::vector<int>& ranks) {
  const int id = groups_made_++;
  int my_index = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= size_) {
      throw CommError("dist", fmt::format("new_group: rank {} is not in a world of {}", ranks[i], size_));
    }
    if (ranks[i] == rank_) my_index = static_cast<int>(i);
  }
  if (my_index < 0) return nullptr;
  if (!backend_ || ranks.size() == 1) return single();
  auto b = std::make_unique<Backend>();
  b->store = backend_->store;
  b->prefix = fmt::format("{}/group{}/{}", backend_->prefix, id, fmt::join(ranks, ","));
  b->gloo_address = backend_->gloo_address;
  b->timeout = backend_->timeout;
  b->cuda = backend_->cuda;
  const int n = static_cast<int>(ranks.size());
  try {
    auto store = c10::make_intrusive<c10d::PrefixStore>(b->prefix, b->store);
    b->pg = b->cuda ? detail::make_nccl(store, my_index, n, b->timeout)
                    : detail::make_gloo(store, my_index, n, b->timeout, b->gloo_address);
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError("dist", fmt::format("rank {}: creating the group of ranks {} failed: {}", global_rank_,
                                        fmt::join(ranks, ","), e.what()));
  }
  auto c = std::shared_ptr<Communicator>(new Communicator());
  c->rank_ = my_index;
  c->global_rank_ = global_rank_;
  for (int r : ranks) c->members_.push_back(global_rank_of(r));
  c->size_ = n;
  c->rv_ = rv_;
  c->backend_ = std::move(b);
  return c;
}

}  // namespace tessera::dist
