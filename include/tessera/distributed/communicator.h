// Collective communication between the ranks of a job: all_reduce, reduce_scatter, all_gather, broadcast, all_to_all
// and barrier on contiguous tensors, and point-to-point send / recv (pipeline stages), with asynchronous handles so
// that communication can overlap computation.
//
// Backends are chosen at link time: Gloo through LibTorch's c10d (CPU tensors; processes on one machine or many, over
// TCP) and NCCL (CUDA tensors; compiled in when the toolkit has it). Rendezvous uses c10d's TCPStore at
// MASTER_ADDR:MASTER_PORT, the torchrun convention. A world of one process needs no backend: collectives are local
// copies, so world size 1 runs the same code as N.
//
// Thread-safety: a Communicator is used from one thread (the training loop). Every rank must issue the same
// collectives in the same order. Each collective has the communicator's timeout; a timeout or a peer's death makes
// Work::wait() throw a dist::CommError naming this rank, the operation and its size.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessera/util/error.h"

namespace tessera::dist {

// A collective failed or timed out. what(): "[dist] rank 1: all_reduce of 4096 Float elements failed: ...".
class CommError : public Error {
 public:
  using Error::Error;
};

enum class ReduceOp { kSum, kMax, kMin };

// Where this process sits in the job, from the launcher's environment.
struct Rendezvous {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // False when the launcher did not say which ranks share a machine (a Kubeflow PyTorchJob's pods, srun over several
  // nodes without --ntasks-per-node): Communicator::connect finds out from the ranks' host identities, and
  // Communicator::rendezvous() holds the answer. local_rank / local_world_size are 0 / 1 until then.
  bool placement_known = true;
  int node_rank() const { return rank / local_world_size; }
  int num_nodes() const { return world_size / local_world_size; }
};

// Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun, `train
// --nproc-per-node`), falling back to Slurm's SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID and SLURM_NTASKS_PER_NODE
// (or SLURM_NNODES=1: every task on this node) when RANK is unset. No variables: a world of one. Without the local
// variables (a PyTorchJob pod gets MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK only) the placement is left to the
// rendezvous (placement_known = false), which then needs MASTER_ADDR. Throws ConfigError naming a malformed or
// inconsistent variable.
Rendezvous rendezvous_from_env();

// The placement of `rv`'s ranks from every rank's host identity (hosts[r] for rank r; equal strings share a machine):
// local_rank, local_world_size and placement_known set. Ranks must be placed node by node (consecutive ranks per
// machine, the same number on each: torchrun's numbering, which Streaming's sample order and node_rank() assume);
// otherwise CommError lists which rank is on which host.
Rendezvous place_by_hosts(Rendezvous rv, const std::vector<std::string>& hosts);

// Seconds this process has spent blocked in Work::wait() (every communicator and group together, all threads) since
// it started: the time its ranks' collectives kept it waiting (the health monitor's wait time).
double collective_wait_seconds();

// Bytes this rank sent per kind of collective, counted as a ring algorithm sends them (all_reduce of S bytes on N
// ranks: 2(N-1)/N·S; reduce_scatter of an S-byte input and all_gather of an S-byte output: (N-1)/N·S; broadcast:
// S), the accounting of the ZeRO paper.
struct CommStats {
  int64_t calls = 0;
  double all_reduce_bytes = 0;
  double reduce_scatter_bytes = 0;
  double all_gather_bytes = 0;
  double broadcast_bytes = 0;
  double all_to_all_bytes = 0;  // the rows sent to other ranks
  double send_bytes = 0;        // point to point
  double total_bytes() const {
    return all_reduce_bytes + reduce_scatter_bytes + all_gather_bytes + broadcast_bytes + all_to_all_bytes + send_bytes;
  }
};

// Handle of an asynchronous collective. wait() blocks until it completed (its output tensors are then valid) and
// throws CommError on failure. A default-constructed Work is already complete.
class Work {
 public:
  class Impl;
  Work() = default;
  explicit Work(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  void wait();
  bool completed() const;

 private:
  std::shared_ptr<Impl> impl_;
};

class Communicator {
 public:
  class Backend;  // Gloo or NCCL process group (internal)

  // Connects to the job's other ranks (all ranks call this together). `device`: CPU selects Gloo, CUDA NCCL (the
  // device index is not used here). `timeout` bounds every collective, and the rendezvous itself. When
  // rv.placement_known is false, the ranks first exchange their host identities (host name and the address that
  // reaches MASTER_ADDR) through the store: ranks with the same identity share a node, and rendezvous() holds the
  // local rank and size found; ranks must then be placed node by node (consecutive ranks per node, the same number
  // on every node, as Streaming's sample order assumes), else CommError names the hosts. Gloo binds the interface of
  // GLOO_SOCKET_IFNAME, else the local address that reaches MASTER_ADDR (127.0.0.1 for a one-machine job). A world of
  // one gets the local communicator (single()) unless `process_group_for_one` asks for a real Gloo/NCCL group even then
  // (to test a backend on one device, e.g. NCCL on a machine with one GPU).
  static std::shared_ptr<Communicator> connect(const Rendezvous& rv, const at::Device& device,
                                               std::chrono::milliseconds timeout, bool process_group_for_one = false);
  // A world of one: collectives are local copies.
  static std::shared_ptr<Communicator> single();

  ~Communicator();
  int rank() const { return rank_; }
  int size() const { return size_; }
  // Where this process sits in the job: connect()'s Rendezvous with the placement found (placement_known true).
  const Rendezvous& rendezvous() const { return rv_; }
  std::string backend_name() const;

  // In place over all ranks of this communicator. `t` must be contiguous.
  Work all_reduce(at::Tensor& t, ReduceOp op = ReduceOp::kSum);
  // `in`: size() * out.numel() elements; rank r receives the sum of every rank's r-th chunk in `out`.
  Work reduce_scatter(at::Tensor& out, at::Tensor& in);
  // `out`: size() * in.numel() elements; chunk r is rank r's `in`.
  Work all_gather(at::Tensor& out, at::Tensor& in);
  Work broadcast(at::Tensor& t, int root);
  // Rows (dim 0) of `in` go out in rank order, in_splits[r] of them to rank r; `out` receives out_splits[r] rows from
  // each rank r, in rank order (expert parallelism's token exchange). Every pair of ranks must agree on the rows
  // between them; zero rows are allowed.
  Work all_to_all(at::Tensor& out, at::Tensor& in, const std::vector<int64_t>& out_splits,
                  const std::vector<int64_t>& in_splits);
  void barrier();
  // Point to point (pipeline stages): `t` to rank `dst` of this communicator, or into `t` (already shaped) from rank
  // `src`. A pair's sends and receives of one `tag` match in the order they were issued. The operation names the peer
  // by its rank in the job, and `what` it is when given ("recv of 4096 Float elements from rank 3 (the activation of
  // microbatch 2 from pipeline stage 1)"), as a failure or a hang report then shows it.
  Work send(at::Tensor& t, int dst, int tag = 0, const std::string& what = "");
  Work recv(at::Tensor& t, int src, int tag = 0, const std::string& what = "");
  // Rank `r` of this communicator as a rank of the job.
  int global_rank_of(int r) const { return members_.empty() ? r : members_.at(static_cast<size_t>(r)); }

  // A communicator over `ranks` (indices into this one; must include this rank). Every rank of this communicator
  // must call new_group with the same arguments in the same order, also those not in `ranks`; they get nullptr.
  std::shared_ptr<Communicator> new_group(const std::vector<int>& ranks);

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  Communicator() = default;
  std::string describe(const char* op, const at::Tensor& t) const;

  int rank_ = 0;
  int size_ = 1;
  int global_rank_ = 0;       // this process's rank in the job, for messages
  std::vector<int> members_;  // a group's ranks in the job, by group rank; empty: the job itself
  Rendezvous rv_;
  std::unique_ptr<Backend> backend_;  // process group and store; null for a world of one
  int groups_made_ = 0;
  CommStats stats_;
};

}  // namespace tessera::dist
