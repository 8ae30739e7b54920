// Unit tests of `meshctl cluster up`'s pure parts: where binaries are looked
// for, the children's command lines, GPU splitting and the readiness poll
// (with a fake NodeLister and a FakeClock). Nothing here forks; the process
// tests are in cluster_process_test.cc.
#include "cli/cluster.h"

#include <deque>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cli/meshctl.h"

namespace mesh::cli {
namespace cluster_test {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(BinaryCandidatesTest, NextToMeshctlThenBuildTreeThenPath) {
  EXPECT_THAT(BinaryCandidates("mesh-agent", "agent", "/b/cli", "/usr/bin::/opt/x"),
              ElementsAre("/b/cli/mesh-agent", "/b/agent/mesh-agent", "/usr/bin/mesh-agent",
                          "/opt/x/mesh-agent"));
  EXPECT_THAT(BinaryCandidates("mesh-agent", "agent", "", "/usr/bin"),
              ElementsAre("/usr/bin/mesh-agent"));
}

TEST(FindBinaryTest, FirstExecutableCandidateWins) {
  const std::set<std::string> exist = {"/b/agent/mesh-agent", "/usr/bin/mesh-agent"};
  auto is_exec = [&](const std::string& p) { return exist.contains(p); };
  auto found = FindBinary("mesh-agent", "", "--agent-bin",
                          BinaryCandidates("mesh-agent", "agent", "/b/cli", "/usr/bin"), is_exec);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, "/b/agent/mesh-agent");
}

TEST(FindBinaryTest, FlagWinsAndIsNeverReplacedByAnotherBinary) {
  const std::set<std::string> exist = {"/mine/agent", "/usr/bin/mesh-agent"};
  auto is_exec = [&](const std::string& p) { return exist.contains(p); };
  const auto candidates = BinaryCandidates("mesh-agent", "agent", "", "/usr/bin");
  auto found = FindBinary("mesh-agent", "/mine/agent", "--agent-bin", candidates, is_exec);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, "/mine/agent");

  auto typo = FindBinary("mesh-agent", "/mine/agnet", "--agent-bin", candidates, is_exec);
  ASSERT_TRUE(absl::IsNotFound(typo.status())) << typo.status();
  EXPECT_THAT(typo.status().message(), HasSubstr("--agent-bin /mine/agnet"));
}

TEST(FindBinaryTest, MissingEverywhereNamesThePlacesAndTheFlag) {
  auto is_exec = [](const std::string&) { return false; };
  auto found = FindBinary(
      "mesh-coordinator", "", "--coordinator-bin",
      BinaryCandidates("mesh-coordinator", "coordinator", "/b/cli", "/p1:/p2:/p3:/p4"), is_exec);
  ASSERT_TRUE(absl::IsNotFound(found.status())) << found.status();
  const std::string message(found.status().message());
  EXPECT_THAT(message, HasSubstr("cannot find mesh-coordinator"));
  EXPECT_THAT(message, HasSubstr("/b/cli/mesh-coordinator"));
  EXPECT_THAT(message, HasSubstr("/b/coordinator/mesh-coordinator"));
  EXPECT_THAT(message, HasSubstr("and 2 more PATH entries"));
  EXPECT_THAT(message, HasSubstr("--coordinator-bin"));
}

ClusterConfig TwoAgents() {
  ClusterConfig config;
  config.coordinator_bin = "/b/coordinator/mesh-coordinator";
  config.agent_bin = "/b/agent/mesh-agent";
  config.agents = 2;
  config.slots = 3;
  config.agent_gpus = {"0,1", "2,3"};
  config.port = 0;
  config.state_dir = "/tmp/s";
  return config;
}

TEST(ArgvTest, Coordinator) {
  EXPECT_THAT(CoordinatorArgv(TwoAgents()),
              ElementsAre("/b/coordinator/mesh-coordinator", "--insecure", "--listen", "127.0.0.1",
                          "--port", "0", "--port-file", "/tmp/s/coordinator.port", "--state-dir",
                          "/tmp/s/coordinator"));
}

TEST(ArgvTest, Agent) {
  EXPECT_THAT(AgentArgv(TwoAgents(), 1, "127.0.0.1:7450"),
              ElementsAre("/b/agent/mesh-agent", "--coordinator", "127.0.0.1:7450", "--name",
                          "local-1", "--address", "127.0.0.1", "--slots", "3", "--gpus", "2,3",
                          "--work-dir", "/tmp/s/agent-1"));
}

TEST(ArgvTest, MetricsAddsPortsAndServiceDiscovery) {
  ClusterConfig config = TwoAgents();
  config.metrics = true;
  EXPECT_THAT(CoordinatorArgv(config),
              ElementsAre("/b/coordinator/mesh-coordinator", "--insecure", "--listen", "127.0.0.1",
                          "--port", "0", "--port-file", "/tmp/s/coordinator.port", "--state-dir",
                          "/tmp/s/coordinator", "--metrics-port", "0", "--sd-file",
                          "/tmp/s/prometheus-targets.json"));
  EXPECT_THAT(AgentArgv(config, 0, "127.0.0.1:7450"),
              ::testing::IsSupersetOf({"--metrics-port", "0"}));
}

TEST(DefaultSlotsTest, SharesCpusAmongAgentsAtLeastOne) {
  EXPECT_EQ(DefaultSlots(8, 2), 4);
  EXPECT_EQ(DefaultSlots(7, 2), 3);
  EXPECT_EQ(DefaultSlots(2, 4), 1);
  EXPECT_EQ(DefaultSlots(1, 1), 1);
}

TEST(SplitGpusTest, NoneAndAutoGoToEveryAgent) {
  EXPECT_THAT(*SplitGpus("none", 3), ElementsAre("none", "none", "none"));
  EXPECT_THAT(*SplitGpus("auto", 2), ElementsAre("auto", "auto"));
}

TEST(SplitGpusTest, ListIsSplitContiguously) {
  EXPECT_THAT(*SplitGpus("0,1,2,3", 2), ElementsAre("0,1", "2,3"));
  EXPECT_THAT(*SplitGpus("4,5", 1), ElementsAre("4,5"));
  EXPECT_THAT(*SplitGpus("3,1", 2), ElementsAre("3", "1"));
}

TEST(SplitGpusTest, BadListsAreRefusedNamingTheProblem) {
  for (const char* bad : {"", "x", "0,,1", "-1", "0,1,", "all"}) {
    auto split = SplitGpus(bad, 1);
    EXPECT_TRUE(absl::IsInvalidArgument(split.status())) << bad << ": " << split.status();
  }
  EXPECT_THAT(SplitGpus("0,0", 2).status().message(), HasSubstr("appears twice"));
  EXPECT_THAT(SplitGpus("0,1,2", 2).status().message(),
              HasSubstr("3 GPUs cannot be split evenly among 2 agents"));
}

mesh::v1::ListNodesResponse Nodes(std::vector<std::pair<std::string, mesh::v1::NodeState>> nodes) {
  mesh::v1::ListNodesResponse response;
  for (const auto& [name, state] : nodes) {
    auto* node = response.add_nodes();
    node->set_name(name);
    node->set_state(state);
  }
  return response;
}

TEST(MissingReadyNodesTest, OnlyExpectedReadyNodesCount) {
  const auto nodes = Nodes({{"local-0", mesh::v1::NODE_STATE_READY},
                            {"local-1", mesh::v1::NODE_STATE_LOST},
                            {"other", mesh::v1::NODE_STATE_READY}});
  EXPECT_THAT(MissingReadyNodes(nodes, {"local-0", "local-1", "local-2"}),
              ElementsAre("local-1", "local-2"));
  EXPECT_TRUE(MissingReadyNodes(nodes, {"local-0"}).empty());
}

// Replays a script of ListNodes answers; the last one repeats.
class FakeLister final : public NodeLister {
 public:
  explicit FakeLister(std::deque<absl::StatusOr<mesh::v1::ListNodesResponse>> answers)
      : answers_(std::move(answers)) {}
  absl::StatusOr<mesh::v1::ListNodesResponse> ListNodes(absl::Duration timeout) override {
    ++calls;
    EXPECT_GT(timeout, absl::ZeroDuration());
    auto answer = answers_.front();
    if (answers_.size() > 1) answers_.pop_front();
    return answer;
  }
  int calls = 0;

 private:
  std::deque<absl::StatusOr<mesh::v1::ListNodesResponse>> answers_;
};

class WaitUntilNodesReadyTest : public ::testing::Test {
 protected:
  // Makes time pass instead of sleeping; counts the waits.
  bool Wait(absl::Duration d) {
    EXPECT_GT(d, absl::ZeroDuration());
    EXPECT_LE(d, absl::Milliseconds(100));
    ++waits_;
    clock_.Advance(d);
    return waits_ <= allow_waits_;
  }

  absl::Status Run(FakeLister& lister, absl::Duration timeout) {
    return WaitUntilNodesReady(lister, {"local-0", "local-1"}, clock_.Now() + timeout,
                               absl::Milliseconds(100), clock_,
                               [this](absl::Duration d) { return Wait(d); });
  }

  FakeClock clock_;
  int waits_ = 0;
  int allow_waits_ = 1 << 20;
};

TEST_F(WaitUntilNodesReadyTest, RetriesUnavailableUntilEveryAgentIsReady) {
  FakeLister lister(
      {absl::UnavailableError("starting"), Nodes({{"local-0", mesh::v1::NODE_STATE_READY}}),
       Nodes({{"local-0", mesh::v1::NODE_STATE_READY}, {"local-1", mesh::v1::NODE_STATE_READY}})});
  EXPECT_TRUE(Run(lister, absl::Seconds(5)).ok());
  EXPECT_EQ(lister.calls, 3);
  EXPECT_EQ(waits_, 2);
}

TEST_F(WaitUntilNodesReadyTest, DeadlineNamesTheMissingAgents) {
  FakeLister lister({Nodes({{"local-1", mesh::v1::NODE_STATE_READY}})});
  const absl::Status status = Run(lister, absl::Seconds(1));
  ASSERT_TRUE(absl::IsDeadlineExceeded(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("1/2 agents READY"));
  EXPECT_THAT(status.message(), HasSubstr("missing: local-0"));
  EXPECT_EQ(waits_, 10);  // 1 s of 100 ms polls, no more.
}

TEST_F(WaitUntilNodesReadyTest, DeadlineCarriesTheLastRpcError) {
  FakeLister lister({absl::UnavailableError("connection refused")});
  const absl::Status status = Run(lister, absl::Milliseconds(250));
  ASSERT_TRUE(absl::IsDeadlineExceeded(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("0/2 agents READY"));
  EXPECT_THAT(status.message(), HasSubstr("connection refused"));
}

TEST_F(WaitUntilNodesReadyTest, UnimplementedIsReturnedAtOnce) {
  FakeLister lister({absl::UnimplementedError("no JobService")});
  EXPECT_TRUE(absl::IsUnimplemented(Run(lister, absl::Seconds(5))));
  EXPECT_EQ(lister.calls, 1);
  EXPECT_EQ(waits_, 0);
}

TEST_F(WaitUntilNodesReadyTest, AnInterruptedWaitCancels) {
  FakeLister lister({Nodes({})});
  allow_waits_ = 2;
  EXPECT_TRUE(absl::IsCancelled(Run(lister, absl::Seconds(5))));
  EXPECT_EQ(lister.calls, 3);
}

// Through the real command line; returns before anything is started.
TEST(ClusterUpCommandTest, MissingBinaryIsAClearErrorWithExit1) {
  const char* argv[] = {"meshctl", "cluster", "up", "--coordinator-bin",
                        "/nonexistent/mesh-coordinator"};
  std::ostringstream out, err;
  EXPECT_EQ(RunMeshctl(5, argv, out, err), kExitFailed);
  EXPECT_THAT(err.str(), HasSubstr("--coordinator-bin /nonexistent/mesh-coordinator: not an "
                                   "executable file"));
}

TEST(ClusterUpCommandTest, BadGpusIsAUsageError) {
  const char* argv[] = {"meshctl", "cluster", "up", "--agents", "2", "--gpus", "0,1,2"};
  std::ostringstream out, err;
  EXPECT_EQ(RunMeshctl(7, argv, out, err), kExitUsage);
  EXPECT_THAT(err.str(), HasSubstr("cannot be split evenly among 2 agents"));
}

TEST(ClusterUpCommandTest, ZeroAgentsIsAUsageError) {
  const char* argv[] = {"meshctl", "cluster", "up", "--agents", "0"};
  std::ostringstream out, err;
  EXPECT_EQ(RunMeshctl(5, argv, out, err), kExitUsage);
}

}  // namespace cluster_test
}  // namespace mesh::cli
