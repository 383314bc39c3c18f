// Multi-process tests of the communicator and the rendezvous, on CPU with Gloo: the ranks are copies of this test
// binary running a worker test (DistWorker.*), spawned through dist::launch.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "dist_test_util.h"
#include "tessera/checkpoint/checkpoint.h"
#include "tessera/checkpoint/safetensors.h"
#include "tessera/data/tokenizer.h"
#include "tessera/dist/communicator.h"
#include "tessera/dist/fsdp.h"
#include "tessera/dist/launcher.h"
#include "tessera/dist/sharding.h"
#include "tessera/models/llama.h"
#include "tessera/models/mpt.h"
#include "tessera/trainer/trainer.h"
#include "tessera/util/preemption.h"
#include "test_util.h"
#include "tiny_data.h"

namespace fs = std::filesystem;
using namespace tessera;
using tessera::testing::free_port;
using tessera::testing::is_worker;
using tessera::testing::launch_workers;
using tessera::testing::read_dist_log;

// ---- Collectives ----------------------------------------------------------------------------------------------------

// Runs in each of the 4 processes that DistCollectives.FourRanksOverGloo launches.
TEST(DistWorker, Collectives) {
  if (!is_worker()) GTEST_SKIP() << "a worker of DistCollectives.FourRanksOverGloo";
  const dist::Rendezvous rv = dist::rendezvous_from_env();
  auto comm = dist::Communicator::connect(rv, at::kCPU, std::chrono::seconds(60));
  const int r = comm->rank(), n = comm->size();
  ASSERT_EQ(n, 4);
  EXPECT_EQ(comm->backend_name(), "gloo");

  at::Tensor t = at::arange(5, at::kFloat) + r;
  comm->all_reduce(t).wait();
  EXPECT_TRUE(at::equal(t, at::arange(5, at::kFloat) * n + n * (n - 1) / 2));
  EXPECT_DOUBLE_EQ(comm->stats().all_reduce_bytes, 2.0 * (n - 1) / n * 20);

  at::Tensor m = at::full({3}, static_cast<double>(r * r), at::kDouble);
  comm->all_reduce(m, dist::ReduceOp::kMax).wait();
  EXPECT_TRUE(at::equal(m, at::full({3}, 9.0, at::kDouble)));

  // reduce_scatter: rank r's input is arange(4n) * (r + 1); chunk k sums to arange chunk k * n(n+1)/2.
  at::Tensor in = at::arange(3 * n, at::kFloat) * (r + 1);
  at::Tensor out = at::empty({3}, at::kFloat);
  comm->reduce_scatter(out, in).wait();
  EXPECT_TRUE(at::equal(out, at::arange(3 * r, 3 * r + 3, at::kFloat) * (n * (n + 1) / 2)));

  at::Tensor mine = at::full({2}, static_cast<int64_t>(r), at::kLong);
  at::Tensor all = at::empty({2 * n}, at::kLong);
  comm->all_gather(all, mine).wait();
  EXPECT_TRUE(at::equal(all, at::arange(n, at::kLong).repeat_interleave(2)));

  at::Tensor b = at::full({4}, static_cast<float>(r), at::kFloat);
  comm->broadcast(b, n - 1).wait();
  EXPECT_TRUE(at::equal(b, at::full({4}, static_cast<float>(n - 1), at::kFloat)));

  // all_to_all with uneven rows, some zero, and rank 0 sending none at all: rank r sends rank q rows_of(r, q) rows
  // of 2 values, (100 r + q, i) for the i-th.
  auto rows_of = [](int from, int to) -> int64_t { return from == 0 ? 0 : (from + to) % 3; };
  std::vector<int64_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
  std::vector<at::Tensor> parts;
  for (int q = 0; q < n; ++q) {
    send[static_cast<size_t>(q)] = rows_of(r, q);
    recv[static_cast<size_t>(q)] = rows_of(q, r);
    const at::Tensor i = at::arange(rows_of(r, q), at::kFloat);
    parts.push_back(at::stack({at::full_like(i, 100.0f * static_cast<float>(r) + static_cast<float>(q)), i}, 1));
  }
  at::Tensor a2a_in = at::cat(parts);
  int64_t received = 0;
  for (int64_t k : recv) received += k;
  at::Tensor a2a_out = at::empty({received, 2}, at::kFloat);
  comm->all_to_all(a2a_out, a2a_in, recv, send).wait();
  std::vector<at::Tensor> expected;
  for (int q = 0; q < n; ++q) {
    const at::Tensor i = at::arange(rows_of(q, r), at::kFloat);
    expected.push_back(at::stack({at::full_like(i, 100.0f * static_cast<float>(q) + static_cast<float>(r)), i}, 1));
  }
  EXPECT_TRUE(at::equal(a2a_out, at::cat(expected))) << "rank " << r;

  // Two asynchronous collectives in flight at once, completed in order.
  at::Tensor a1 = at::ones({1000}), a2 = at::full({1000}, 2.0f);
  dist::Work w1 = comm->all_reduce(a1), w2 = comm->all_reduce(a2);
  w2.wait();
  w1.wait();
  EXPECT_EQ(a1[0].item<float>(), n);
  EXPECT_EQ(a2[999].item<float>(), 2 * n);

  // Groups: {0, 2} and {1, 3}; every rank calls new_group for both.
  auto even = comm->new_group({0, 2});
  auto odd = comm->new_group({1, 3});
  auto mine_group = r % 2 == 0 ? even : odd;
  ASSERT_TRUE(mine_group);
  EXPECT_FALSE(r % 2 == 0 ? odd : even);
  EXPECT_EQ(mine_group->size(), 2);
  at::Tensor g = at::full({1}, static_cast<float>(r), at::kFloat);
  mine_group->all_reduce(g).wait();
  EXPECT_EQ(g.item<float>(), r % 2 == 0 ? 2.0f : 4.0f);
  comm->barrier();
}

TEST(DistCollectives, FourRanksOverGloo) {
  if (is_worker()) GTEST_SKIP() << "launcher side";
  EXPECT_EQ(launch_workers("Collectives", 4), 0);
}

TEST(DistCollectives, AWorldOfOneIsLocalUnlessAProcessGroupIsAskedFor) {
  dist::Rendezvous rv;
  rv.master_port = free_port();
  EXPECT_EQ(dist::Communicator::connect(rv, at::kCPU, std::chrono::seconds(30))->backend_name(), "local");
  auto comm = dist::Communicator::connect(rv, at::kCPU, std::chrono::seconds(30), /*process_group_for_one=*/true);
  EXPECT_EQ(comm->backend_name(), "gloo");
  at::Tensor t = at::arange(4, at::kFloat);
  comm->all_reduce(t).wait();
  EXPECT_TRUE(at::equal(t, at::arange(4, at::kFloat)));
  at::Tensor all = at::empty({4}, at::kFloat);
  comm->all_gather(all, t).wait();
  EXPECT_TRUE(at::equal(all, t));
  EXPECT_DOUBLE_EQ(comm->stats().all_reduce_bytes, 0.0);  // a ring of one sends nothing
}

// Runs in the 2 processes of DistCollectives.ATimedOutCollectiveNamesRankAndOperation.
TEST(DistWorker, Timeout) {
  if (!is_worker()) GTEST_SKIP() << "a worker of DistCollectives.ATimedOutCollectiveNamesRankAndOperation";
  auto comm = dist::Communicator::connect(dist::rendezvous_from_env(), at::kCPU, std::chrono::seconds(2));
  // Rank 1 stays up past rank 0's timeout, so rank 0 sees a timed-out collective rather than a closed connection.
  const double scale = ::tessera::testing::time_scale();
  if (comm->rank() == 1) {  // never joins the collective
    std::this_thread::sleep_for(std::chrono::duration<double>(2 + 4 * scale));
    return;
  }
  at::Tensor t = at::ones({1000});
  const auto start = std::chrono::steady_clock::now();
  try {
    comm->all_reduce(t).wait();
    ADD_FAILURE() << "the all_reduce completed without its peer";
  } catch (const dist::CommError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0: all_reduce of 1000 Float elements failed"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2 + 2 * scale);
}

TEST(DistCollectives, ATimedOutCollectiveNamesRankAndOperation) {
  if (is_worker()) GTEST_SKIP() << "launcher side";
  EXPECT_EQ(launch_workers("Timeout", 2), 0);
}

TEST(DistCollectives, WorldOfOneIsLocal) {
  auto comm = dist::Communicator::single();
  EXPECT_EQ(comm->size(), 1);
  at::Tensor in = at::arange(4, at::kFloat), out = at::empty({4});
  comm->all_gather(out, in).wait();
  EXPECT_TRUE(at::equal(out, in));
  comm->all_reduce(in).wait();
  EXPECT_TRUE(at::equal(in, at::arange(4, at::kFloat)));
  EXPECT_EQ(comm->stats().total_bytes(), 0);
}

TEST(DistRendezvous, PlacementFromHostIdentitiesIsNodeByNode) {
  dist::Rendezvous rv;
  rv.rank = 4;
  rv.world_size = 6;
  rv.placement_known = false;
  const dist::Rendezvous placed =
      dist::place_by_hosts(rv, {"a 10.0.0.1", "a 10.0.0.1", "a 10.0.0.2", "a 10.0.0.2", "b 10.0.0.3", "b 10.0.0.3"});
  EXPECT_TRUE(placed.placement_known);
  EXPECT_EQ(placed.local_world_size, 2);
  EXPECT_EQ(placed.local_rank, 0);
  EXPECT_EQ(placed.node_rank(), 2);
  EXPECT_EQ(dist::place_by_hosts(rv, std::vector<std::string>(6, "x")).local_world_size, 6);
  EXPECT_EQ(dist::place_by_hosts(rv, {"0", "1", "2", "3", "4", "5"}).num_nodes(), 6);
  // Interleaved (round-robin) placement, uneven nodes, a machine coming back: refused, naming the hosts.
  for (const std::vector<std::string>& bad : std::vector<std::vector<std::string>>{
           {"a", "b", "a", "b", "a", "b"}, {"a", "a", "a", "a", "b", "b"}, {"a", "a", "b", "b", "a", "a"}}) {
    try {
      dist::place_by_hosts(rv, bad);
      ADD_FAILURE() << "accepted " << fmt::format("{}", fmt::join(bad, ","));
    } catch (const dist::CommError& e) {
      EXPECT_NE(std::string(e.what()).find("not placed node by node"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 1 on " + bad[1]), std::string::npos) << e.what();
    }
  }
}

TEST(DistRendezvous, ReadsTorchrunAndSlurmVariables) {
  if (is_worker()) GTEST_SKIP();
  const char* names[] = {"RANK",          "WORLD_SIZE",   "LOCAL_RANK",           "LOCAL_WORLD_SIZE",
                         "MASTER_ADDR",   "MASTER_PORT",  "SLURM_PROCID",         "SLURM_NTASKS",
                         "SLURM_LOCALID", "SLURM_NNODES", "SLURM_NTASKS_PER_NODE"};
  for (const char* v : names) unsetenv(v);
  EXPECT_EQ(dist::rendezvous_from_env().world_size, 1);
  setenv("RANK", "5", 1);
  setenv("WORLD_SIZE", "8", 1);
  setenv("LOCAL_RANK", "1", 1);
  setenv("LOCAL_WORLD_SIZE", "4", 1);
  setenv("MASTER_ADDR", "10.0.0.7", 1);
  setenv("MASTER_PORT", "29555", 1);
  dist::Rendezvous rv = dist::rendezvous_from_env();
  EXPECT_EQ(rv.rank, 5);
  EXPECT_EQ(rv.node_rank(), 1);
  EXPECT_EQ(rv.num_nodes(), 2);
  EXPECT_EQ(rv.master_addr, "10.0.0.7");
  EXPECT_EQ(rv.master_port, 29555);
  setenv("LOCAL_WORLD_SIZE", "3", 1);  // 8 ranks do not split into nodes of 3
  EXPECT_THROW(dist::rendezvous_from_env(), ConfigError);
  setenv("RANK", "x", 1);
  EXPECT_THROW(dist::rendezvous_from_env(), ConfigError);
  for (const char* v : names) unsetenv(v);
  setenv("SLURM_PROCID", "3", 1);
  setenv("SLURM_NTASKS", "4", 1);
  setenv("SLURM_LOCALID", "1", 1);
  setenv("SLURM_NTASKS_PER_NODE", "2", 1);
  setenv("MASTER_ADDR", "node0", 1);
  rv = dist::rendezvous_from_env();
  EXPECT_EQ(rv.rank, 3);
  EXPECT_EQ(rv.world_size, 4);
  EXPECT_EQ(rv.node_rank(), 1);
  EXPECT_TRUE(rv.placement_known);
  // srun over several nodes without --ntasks-per-node: the rendezvous finds the placement (it needs MASTER_ADDR).
  unsetenv("SLURM_NTASKS_PER_NODE");
  rv = dist::rendezvous_from_env();
  EXPECT_FALSE(rv.placement_known);
  EXPECT_EQ(rv.rank, 3);
  unsetenv("MASTER_ADDR");
  EXPECT_THROW(dist::rendezvous_from_env(), ConfigError);
  // ... on one node every task is local.
  setenv("SLURM_NNODES", "1", 1);
  rv = dist::rendezvous_from_env();
  EXPECT_TRUE(rv.placement_known);
  EXPECT_EQ(rv.local_world_size, 4);
  EXPECT_EQ(rv.local_rank, 1);
  for (const char* v : names) unsetenv(v);
  // A PyTorchJob pod: MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK only.
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("MASTER_ADDR", "job-master-0", 1);
  setenv("MASTER_PORT", "23456", 1);
  rv = dist::rendezvous_from_env();
  EXPECT_FALSE(rv.placement_known);
  EXPECT_EQ(rv.master_addr, "job-master-0");
  for (const char* v : names) unsetenv(v);
}
