// Issue 61: the rendezvous listens only where the ranks are told to connect. Rank 0's store (c10d's TCPStore, which
// on its own listens on every interface) and the port that `--master-port 0` binds are on loopback for a job on one
// machine and on MASTER_ADDR's interface otherwise; a MASTER_ADDR that is no address here falls back to every
// interface, said in a warning. (elastic_test.cpp: the elastic rendezvous host and its line limit.)
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "launcher_test_util.h"
#include "net_test_util.h"
#include "tessera/distributed/communicator.h"

namespace tessera::testing::launcher_test {
namespace {

TEST(RendezvousStore, AOneMachineJobsStoreIsReachedOnLoopbackOnly) {
  dist::Rendezvous rv;  // MASTER_ADDR 127.0.0.1, as the launcher sets it for one node
  rv.master_port = dist::free_local_port();
  auto comm = dist::Communicator::connect(rv, at::kCPU, std::chrono::seconds(30), /*process_group_for_one=*/true);
  EXPECT_TRUE(connects("127.0.0.1", rv.master_port));
  const std::vector<std::string> others = non_loopback_addresses();
  for (const std::string& address : others) EXPECT_FALSE(connects(address, rv.master_port)) << address;
  if (others.empty()) GTEST_SKIP() << "this machine has no address but loopback to try the store on";
}

TEST(RendezvousStore, AMasterAddrOfThisMachineIsListenedOnThatInterfaceOnly) {
  const std::vector<std::string> others = non_loopback_addresses();
  if (others.empty()) GTEST_SKIP() << "this machine has no address but loopback";
  dist::Rendezvous rv;
  rv.master_addr = others.front();
  rv.master_port = dist::free_local_port();
  auto comm = dist::Communicator::connect(rv, at::kCPU, std::chrono::seconds(30), /*process_group_for_one=*/true);
  at::Tensor t = at::ones({2});
  comm->all_reduce(t).wait();  // the store and Gloo work through that interface
  EXPECT_TRUE(connects(rv.master_addr, rv.master_port));
  EXPECT_FALSE(connects("127.0.0.1", rv.master_port));
}

TEST(RendezvousStore, TheLaunchersOwnPortIsBoundToMasterAddrAndElsewhereEveryInterfaceWithAWarning) {
  const TempDir dir;
  const ScopedEnv test_dir("TEST_DIR", dir.str());
  // --master-port 0: the launcher binds the port (rank 0's store takes it over); the rank sees what listens on it.
  LaunchOptions o = shell("echo $MASTER_PORT > $TEST_DIR/port; cat /proc/net/tcp /proc/net/tcp6 > $TEST_DIR/tcp", 1);
  o.master_port = 0;
  Outcome r = launch_capturing(o, dir);
  ASSERT_EQ(r.rc, 0) << r.log << r.err;
  const int port = std::stoi(read_launcher_log(dir.path() / "port"));
  EXPECT_EQ(listening_addresses(read_launcher_log(dir.path() / "tcp"), port), std::vector<std::string>{"0100007F"});
  EXPECT_EQ(r.log.find("every interface"), std::string::npos) << r.log;
  // A MASTER_ADDR that is not this machine's (TEST-NET-1, RFC 5737): the ranks may still reach this machine through
  // it (a NAT, a floating address), so every interface, and a warning that says so.
  o.master_addr = "192.0.2.1";
  r = launch_capturing(o, dir);
  ASSERT_EQ(r.rc, 0) << r.log << r.err;
  EXPECT_NE(r.log.find("[launch] --master-port 0: 192.0.2.1 is not an address of this machine; listening on every "
                       "interface of this machine (port "),
            std::string::npos)
      << r.log;
}

}  // namespace
}  // namespace tessera::testing::launcher_test
