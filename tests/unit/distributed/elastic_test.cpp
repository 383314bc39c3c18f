// Elastic jobs: one launcher per "node", each a re-executed test process running LauncherWorker.ElasticNode; a lost
// node is excluded, a failed rank restarts on the same nodes, too few nodes end the job, and the host refuses a node
// that does not fit.
#include <gtest/gtest.h>

#include "launcher_test_util.h"
#include "net_test_util.h"

namespace tessera::testing::launcher_test {

namespace {

// The worker's options, from the environment its parent sets.
constexpr const char* kElasticNodeEnv = "TESSERA_TEST_ELASTIC_NODE";

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : fallback;
}

struct ElasticNode {
  std::string id;
  pid_t pid = -1;
  fs::path log;
  std::optional<int> status;  // waitpid's, once reaped

  std::string text() const { return read_launcher_log(log); }
};

struct ElasticSetup {
  std::string nnodes = "2:3";
  int port = 0;  // the rendezvous's
  int max_restarts = 1;
  int nproc = 1;
  double rdzv_timeout = 30;
  std::string script;
};

// Starts a launcher for node `id` (the rendezvous host when `host`), its output in dir/node_<id>.log.
ElasticNode start_node(const TempDir& dir, const std::string& id, bool host, const ElasticSetup& setup) {
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  std::vector<std::string> env = {
      std::string(kElasticNodeEnv) + "=" + id,
      "TESSERA_TEST_ELASTIC_HOST=" + std::string(host ? "1" : "0"),
      "TESSERA_TEST_ELASTIC_NNODES=" + setup.nnodes,
      "TESSERA_TEST_ELASTIC_PORT=" + std::to_string(setup.port),
      "TESSERA_TEST_ELASTIC_RESTARTS=" + std::to_string(setup.max_restarts),
      "TESSERA_TEST_ELASTIC_NPROC=" + std::to_string(setup.nproc),
      "TESSERA_TEST_ELASTIC_TIMEOUT=" + std::to_string(setup.rdzv_timeout),
      "TESSERA_TEST_ELASTIC_SCRIPT=" + setup.script,
      "TEST_DIR=" + dir.str(),
  };
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::string(*e).rfind("GTEST_", 0) != 0) env.emplace_back(*e);  // the worker runs its one test
  }
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string filter = "--gtest_filter=LauncherWorker.ElasticNode";
  std::vector<char*> argv = {const_cast<char*>(self.c_str()), filter.data(), nullptr};
  ElasticNode node{id, -1, dir.path() / ("node_" + id + ".log"), std::nullopt};
  const std::string log = node.log.string();
  std::fflush(nullptr);
  node.pid = ::fork();
  if (node.pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execve(self.c_str(), argv.data(), envp.data());
    ::_exit(127);
  }
  return node;
}

// Waits up to `seconds` for cond().
template <typename Cond>
bool wait_until(Cond cond, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (!cond()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// The node's exit code (128 + signal for a signal), waiting up to `seconds`; -1 (after killing it) if it runs on.
int exit_code(ElasticNode& node, double seconds) {
  const bool done = wait_until(
      [&] {
        int status = 0;
        if (::waitpid(node.pid, &status, WNOHANG) == node.pid) node.status = status;
        return node.status.has_value();
      },
      seconds);
  if (!done) {
    ::kill(node.pid, SIGKILL);
    int status = 0;
    ::waitpid(node.pid, &status, 0);
    return -1;
  }
  return WIFSIGNALED(*node.status) ? 128 + WTERMSIG(*node.status) : WEXITSTATUS(*node.status);
}

// Kills and reaps whatever node of the test is still running when it ends (a failed assertion returns early).
struct NodeReaper {
  std::vector<ElasticNode*> nodes;
  ~NodeReaper() {
    for (ElasticNode* n : nodes) {
      if (n->pid > 0 && !n->status) {
        ::kill(n->pid, SIGKILL);
        int status = 0;
        ::waitpid(n->pid, &status, 0);
      }
    }
  }
};

// Starts nodes ids[0] (the host), ids[1], ... one after the other, each once the host has seen the one before join
// (so that node ranks follow the order).
std::vector<ElasticNode> start_nodes(const TempDir& dir, const std::vector<std::string>& ids,
                                     const ElasticSetup& setup) {
  std::vector<ElasticNode> nodes;
  nodes.reserve(ids.size());
  nodes.push_back(start_node(dir, ids[0], true, setup));
  for (size_t i = 1; i < ids.size(); ++i) {
    nodes.push_back(start_node(dir, ids[i], false, setup));
    const std::string joined = "node " + ids[i] + " joined";
    if (!wait_until([&] { return nodes[0].text().find(joined) != std::string::npos; }, 60)) {
      ADD_FAILURE() << "node " << ids[i] << " did not join:\n" << nodes[0].text() << nodes[i].text();
    }
  }
  return nodes;
}

// The script's record of each attempt on a node: "<restart count> <RANK> <WORLD_SIZE> <GROUP_RANK>" lines.
const std::string kRecordAttempt =
    "echo \"$TORCHELASTIC_RESTART_COUNT $RANK $WORLD_SIZE $GROUP_RANK\" >> $TEST_DIR/runs_$TESSERA_NODE_ID; ";

}  // namespace

TEST(LauncherWorker, ElasticNode) {
  const char* id = std::getenv(kElasticNodeEnv);
  if (id == nullptr) GTEST_SKIP() << "run by the Elastic tests";
  LaunchOptions o =
      shell(env_or("TESSERA_TEST_ELASTIC_SCRIPT", "true"), std::stoi(env_or("TESSERA_TEST_ELASTIC_NPROC", "1")));
  const std::string nnodes = env_or("TESSERA_TEST_ELASTIC_NNODES", "1:1");
  o.min_nodes = std::stoi(nnodes.substr(0, nnodes.find(':')));
  o.max_nodes = std::stoi(nnodes.substr(nnodes.find(':') + 1));
  o.rdzv_endpoint = "127.0.0.1:" + env_or("TESSERA_TEST_ELASTIC_PORT", "0");
  o.rdzv_host = env_or("TESSERA_TEST_ELASTIC_HOST", "0") == "1";
  o.node_id = id;
  o.max_restarts = std::stoi(env_or("TESSERA_TEST_ELASTIC_RESTARTS", "0"));
  o.rdzv_timeout_seconds = std::stod(env_or("TESSERA_TEST_ELASTIC_TIMEOUT", "30"));
  o.rdzv_last_call_seconds = 30;  // the tests start every node before the job starts
  int rc = 0;
  try {
    rc = launch(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    rc = 2;
  }
  spdlog::default_logger()->flush();
  std::fflush(nullptr);
  ::_exit(rc);
}

TEST(Elastic, ALostNodeIsExcludedAndTheJobGoesOnWithTheOthers) {
  const TempDir dir;
  ElasticSetup setup;
  setup.port = tessera::dist::free_local_port();
  setup.script = kRecordAttempt + "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then exec sleep 60; fi";
  std::vector<ElasticNode> nodes = start_nodes(dir, {"a", "b", "c"}, setup);
  NodeReaper reaper{{&nodes[0], &nodes[1], &nodes[2]}};
  // Attempt 0 runs on three nodes; then node c dies, its launcher and ranks with it.
  ASSERT_TRUE(wait_until(
      [&] {
        return fs::exists(dir.path() / "runs_a") && fs::exists(dir.path() / "runs_b") &&
               fs::exists(dir.path() / "runs_c");
      },
      60))
      << nodes[0].text();
  ::kill(nodes[2].pid, SIGKILL);
  EXPECT_EQ(exit_code(nodes[0], 60), 0) << nodes[0].text();
  EXPECT_EQ(exit_code(nodes[1], 10), 0) << nodes[1].text();
  EXPECT_EQ(exit_code(nodes[2], 10), 128 + SIGKILL);
  // Attempt 1 ran on two nodes, world size 2, with the same node ranks for a and b.
  EXPECT_EQ(read_launcher_log(dir.path() / "runs_a"), "0 0 3 0\n1 0 2 0\n");
  EXPECT_EQ(read_launcher_log(dir.path() / "runs_b"), "0 1 3 1\n1 1 2 1\n");
  EXPECT_EQ(read_launcher_log(dir.path() / "runs_c"), "0 2 3 2\n");
  const std::string host = nodes[0].text();
  EXPECT_NE(host.find("attempt 0: 3 nodes (a, b, c), world size 3"), std::string::npos) << host;
  EXPECT_NE(host.find("node c is lost (its launcher's connection closed)"), std::string::npos) << host;
  EXPECT_NE(host.find("excluding node c from the job: lost"), std::string::npos) << host;
  EXPECT_NE(host.find("restart 1/1 after node c (lost); excluded nodes: c (lost)"), std::string::npos) << host;
  EXPECT_NE(host.find("attempt 1: 2 nodes (a, b), world size 2"), std::string::npos) << host;
  EXPECT_NE(nodes[1].text().find("stopping the ranks: another node failed"), std::string::npos) << nodes[1].text();
}

TEST(Elastic, AFailedRankRestartsOnTheSameNodesAndANodeMarkedBadIsExcluded) {
  const TempDir dir;
  ElasticSetup setup;
  setup.port = tessera::dist::free_local_port();
  setup.max_restarts = 2;
  // Attempt 0: a rank on b fails (a bug, not the node): all three go again. Attempt 1: c's rank marks its node bad.
  // Each failure waits until the attempt runs on every node.
  setup.script = kRecordAttempt +
                 "n=$TORCHELASTIC_RESTART_COUNT; "
                 "all() { while [ $(cat $TEST_DIR/runs_* | grep -c \"^$n \") -lt 3 ]; do sleep 0.02; done; }; "
                 "if [ $n = 0 ] && [ $TESSERA_NODE_ID = b ]; then all; exit 3; fi; "
                 "if [ $n = 1 ] && [ $TESSERA_NODE_ID = c ]; then all; exit " +
                 std::to_string(tessera::util::kExitNodeBad) +
                 "; fi; "
                 "if [ $n -lt 2 ]; then exec sleep 60; fi";
  std::vector<ElasticNode> nodes = start_nodes(dir, {"a", "b", "c"}, setup);
  NodeReaper reaper{{&nodes[0], &nodes[1], &nodes[2]}};
  EXPECT_EQ(exit_code(nodes[0], 60), 0) << nodes[0].text();
  EXPECT_EQ(exit_code(nodes[1], 10), 0) << nodes[1].text();
  EXPECT_EQ(exit_code(nodes[2], 10), tessera::util::kExitNodeBad) << nodes[2].text();
  EXPECT_EQ(read_launcher_log(dir.path() / "runs_a"), "0 0 3 0\n1 0 3 0\n2 0 2 0\n");
  EXPECT_EQ(read_launcher_log(dir.path() / "runs_b"), "0 1 3 1\n1 1 3 1\n2 1 2 1\n");
  EXPECT_EQ(read_launcher_log(dir.path() / "runs_c"), "0 2 3 2\n1 2 3 2\n");
  const std::string host = nodes[0].text();
  EXPECT_NE(host.find("restart 1/2 after node b: rank 1 (pid "), std::string::npos) << host;
  EXPECT_NE(host.find("exited with code 3\n"), std::string::npos) << host;
  EXPECT_NE(host.find("excluding node c from the job: its ranks marked it bad: rank 2 (pid "), std::string::npos)
      << host;
  EXPECT_NE(host.find("restart 2/2 after node c (its ranks marked it bad: rank 2 (pid "), std::string::npos) << host;
  EXPECT_NE(host.find("attempt 2: 2 nodes (a, b), world size 2"), std::string::npos) << host;
  EXPECT_NE(nodes[2].text().find("node c was excluded from the job: its ranks marked it bad"), std::string::npos)
      << nodes[2].text();
}

TEST(Elastic, FewerThanMinNodesEndsTheJobNamingTheExcludedOnes) {
  const TempDir dir;
  ElasticSetup setup;
  setup.port = tessera::dist::free_local_port();
  setup.nnodes = "2:2";
  // Long enough for node b to start and join (a test process loading LibTorch: seconds on a loaded machine); it is
  // also how long the host then waits for a second node once b is gone.
  setup.rdzv_timeout = std::round(5 * kScale);
  setup.script = kRecordAttempt + "exec sleep 60";
  std::vector<ElasticNode> nodes = start_nodes(dir, {"a", "b"}, setup);
  NodeReaper reaper{{&nodes[0], &nodes[1]}};
  // Both ranks recorded their attempt before b dies (b's rank can get there first; killing b then stopped a's rank
  // before it wrote, and runs_a stayed empty: a flake of this test under load).
  ASSERT_TRUE(wait_until([&] { return fs::exists(dir.path() / "runs_a") && fs::exists(dir.path() / "runs_b"); }, 60))
      << nodes[0].text();
  ::kill(nodes[1].pid, SIGKILL);
  EXPECT_EQ(exit_code(nodes[0], 30 + setup.rdzv_timeout), 1) << nodes[0].text();
  const std::string host = nodes[0].text();
  EXPECT_NE(host.find(fmt::format("only 1 of the 2 nodes the job needs (--nnodes 2:2) joined within {} s; excluded "
                                  "nodes: b (lost)",
                                  setup.rdzv_timeout)),
            std::string::npos)
      << host;
  EXPECT_EQ(read_launcher_log(dir.path() / "runs_a"), "0 0 2 0\n");
}

TEST(Elastic, TheHostRefusesANodeThatDoesNotFitNamingIt) {
  const TempDir dir;
  ElasticSetup setup;
  setup.port = tessera::dist::free_local_port();
  setup.nnodes = "2:2";
  // Long enough for both refused nodes to start and reach the host (seconds each on a loaded machine) before it gives
  // up waiting for a second node.
  setup.rdzv_timeout = std::round(10 * kScale);
  setup.script = "true";
  ElasticNode a = start_node(dir, "a", true, setup);
  NodeReaper reaper{{&a}};
  ElasticSetup twice = setup;
  twice.nproc = 2;
  ElasticNode b = start_node(dir, "b", false, twice);
  ElasticNode a2 = start_node(dir, "a", false, setup);
  reaper.nodes = {&a, &b, &a2};
  EXPECT_EQ(exit_code(b, 30), 2) << b.text();
  EXPECT_NE(b.text().find(fmt::format("the rendezvous host at 127.0.0.1:{} refused node b: node b has "
                                      "--nproc-per-node 2, the job 1",
                                      setup.port)),
            std::string::npos)
      << b.text();
  EXPECT_EQ(exit_code(a2, 30), 2) << a2.text();
  EXPECT_NE(a2.text().find("a node named a is already in the job (give each launcher its own --node-id)"),
            std::string::npos)
      << a2.text();
  EXPECT_EQ(exit_code(a, 30 + setup.rdzv_timeout), 1) << a.text();
  EXPECT_NE(a.text().find("only 1 of the 2 nodes the job needs"), std::string::npos) << a.text();
}

// Issue 61: the host listens only where the nodes are told to connect (here 127.0.0.1), and a peer that sends a line
// longer than the rendezvous takes (1 MiB) is cut off, named in an error, while the host goes on with the job.
TEST(Elastic, TheHostListensOnTheEndpointsAddressAndCutsOffAPeerWithAnOverLongLine) {
  const TempDir dir;
  ElasticSetup setup;
  setup.port = tessera::dist::free_local_port();
  setup.nnodes = "2:2";
  setup.script = "true";
  ElasticNode a = start_node(dir, "a", true, setup);
  NodeReaper reaper{{&a}};
  int fd = -1;
  ASSERT_TRUE(wait_until([&] { return (fd = connect_to("127.0.0.1", setup.port)) >= 0; }, 30 * kScale)) << a.text();
  for (const std::string& address : non_loopback_addresses()) {
    EXPECT_FALSE(connects(address, setup.port)) << address << " reaches the rendezvous";
  }
  sockaddr_in me{};
  socklen_t len = sizeof(me);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len);
  // A JOIN that never ends: 1 MiB and a bit, no newline. The host closes the connection once it has read past 1 MiB.
  const std::string flood((size_t{1} << 20) + 8192, 'x');
  const std::string line = "JOIN evil 1 " + flood;
  for (size_t sent = 0; sent < line.size();) {
    const ssize_t n = ::send(fd, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // cut off before the end
    sent += static_cast<size_t>(n);
  }
  char buf[256];
  pollfd p{fd, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, static_cast<int>(30000 * kScale)), 1);
  EXPECT_LE(::recv(fd, buf, sizeof(buf), 0), 0);  // closed (or reset): no answer
  ::close(fd);
  const std::string cut = fmt::format(
      "rendezvous: 127.0.0.1:{} sent a line longer than 1048576 bytes; closing its "
      "connection",
      ntohs(me.sin_port));
  EXPECT_TRUE(wait_until([&] { return a.text().find(cut) != std::string::npos; }, 10 * kScale)) << a.text();
  // The host goes on: a node joins and the job runs.
  ElasticNode b = start_node(dir, "b", false, setup);
  reaper.nodes = {&a, &b};
  EXPECT_EQ(exit_code(a, 60), 0) << a.text();
  EXPECT_EQ(exit_code(b, 10), 0) << b.text();
  EXPECT_NE(a.text().find("attempt 0: 2 nodes (a, b), world size 2"), std::string::npos) << a.text();
  EXPECT_EQ(a.text().find("node evil"), std::string::npos) << a.text();
}

}  // namespace tessera::testing::launcher_test
