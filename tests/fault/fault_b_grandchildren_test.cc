// Reliability scenario 8: a worker whose command is a shell script that forks
// grandchildren, some of them in sessions of their own (setsid, a
// double-forked "daemon"), and its agent killed with SIGKILL.
//
// Expected: no process of the job survives, found by a /proc scan for the
// job's environment, within a bounded time. The worker's own process group
// is covered by PR_SET_PDEATHSIG and the reaper watchdog's group kill; the
// grandchildren that left the group are covered by the watchdog's scan for
// the agent's instance marker (MESH_AGENT_INSTANCE) in /proc/<pid>/environ.
#include <signal.h>

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tests/util/fault_cluster.h"

namespace mesh::fault {
namespace fault_b_grandchildren_test {

// Per rank: the shell itself, two plain background sleeps, a setsid sleep,
// a subshell that setsid's a shell with a sleep of its own (the
// double-fork), and a `setsid -f` (fork, then setsid) sleep: 7 processes.
constexpr char kScript[] =
    "sleep 300 & sleep 300 & setsid sleep 300 & "
    "( setsid sh -c 'sleep 300 & wait' & ) ; setsid -f sleep 300; wait";
constexpr int kProcessesPerRank = 7;

class GrandchildrenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cluster_.StartCoordinator(CoordinatorFlags{}).ok());
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(cluster_.StartAgent(NamedAgent(absl::StrCat("node-", i))).ok());
    }
    ASSERT_TRUE(
        FaultCluster::Eventually(absl::Seconds(20), [&] { return cluster_.ReadyNodes() == 2; }));
  }

  // Sessions of `pids`, so a failure says which ones escaped.
  static std::string Describe(const std::vector<pid_t>& pids) {
    std::string out;
    for (pid_t pid : pids) {
      std::string cmd;
      RunShell(absl::StrCat("ps -o pid=,sid=,pgid=,args= -p ", pid), &cmd);
      absl::StrAppend(&out, cmd);
    }
    return out;
  }

  FaultCluster cluster_;
};

TEST_F(GrandchildrenTest, Kill9OfTheAgentLeavesNoProcessOfTheJobEvenSetsidOnes) {
  const std::string id = cluster_.Submit(cluster_.ShellJob(kScript, /*nodes=*/2, /*nproc=*/2));
  ASSERT_TRUE(cluster_.WaitForState(id, v1::JOB_STATE_RUNNING, absl::Seconds(20)));
  const std::vector<std::string> on_node1 = {"MESH_JOB_ID=" + id, "MESH_NODE_NAME=node-1"};
  ASSERT_TRUE(FaultCluster::Eventually(absl::Seconds(10), [&] {
    return cluster_.Processes(on_node1).size() >= 2 * kProcessesPerRank;
  })) << Describe(cluster_.Processes(on_node1));

  cluster_.agent(1).Signal(SIGKILL);
  ASSERT_TRUE(cluster_.agent(1).Wait(absl::Seconds(10)).ok());
  EXPECT_TRUE(FaultCluster::Eventually(absl::Seconds(5),
                                       [&] { return cluster_.Processes(on_node1).empty(); }))
      << "survivors of node-1's workers:\n"
      << Describe(cluster_.Processes(on_node1));

  // The job fails naming the node; node-0's workers, setsid ones included,
  // are stopped by their (live) agent's KILL.
  auto job = cluster_.WaitTerminal(id, absl::Seconds(30));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job->root_cause().node(), "node-1");
  EXPECT_TRUE(FaultCluster::Eventually(
      absl::Seconds(10), [&] { return cluster_.Processes({"MESH_JOB_ID=" + id}).empty(); }))
      << "survivors:\n"
      << Describe(cluster_.Processes({"MESH_JOB_ID=" + id}));
}

TEST_F(GrandchildrenTest, CancelLeavesNoProcessOfTheJobEvenSetsidOnes) {
  const std::string id = cluster_.Submit(cluster_.ShellJob(kScript, 2, 1));
  ASSERT_TRUE(cluster_.WaitForState(id, v1::JOB_STATE_RUNNING, absl::Seconds(20)));
  ASSERT_TRUE(FaultCluster::Eventually(absl::Seconds(10), [&] {
    return cluster_.Processes({"MESH_JOB_ID=" + id}).size() >= 2 * kProcessesPerRank;
  }));
  v1::CancelJobRequest cancel;
  cancel.set_job_id(id);
  v1::CancelJobResponse cancelled;
  ASSERT_TRUE(cluster_.jobs().CancelJob(cluster_.Context().get(), cancel, &cancelled).ok());
  // SIGTERM, then SIGKILL after --grace 1.
  EXPECT_TRUE(FaultCluster::Eventually(
      absl::Seconds(10), [&] { return cluster_.Processes({"MESH_JOB_ID=" + id}).empty(); }))
      << "survivors:\n"
      << Describe(cluster_.Processes({"MESH_JOB_ID=" + id}));
}

}  // namespace fault_b_grandchildren_test
}  // namespace mesh::fault
