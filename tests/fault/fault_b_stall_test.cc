// Reliability scenario 4: an agent stalled (SIGSTOP) for longer than the node
// heartbeat timeout, then resumed (SIGCONT).
//
// Expected: the node is marked LOST; its job restarts on the nodes left (or
// fails naming it when none can take it); the stale agent, once resumed,
// cannot act on the new generation: its old session is fenced (ABORTED), it
// registers again with a new session, and the workers it kept running for
// the old generation are killed.
#include <signal.h>

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "mesh/v1/job.grpc.pb.h"
#include "tests/util/fault_cluster.h"

namespace mesh::fault {
namespace fault_b_stall_test {

using ::mesh::v1::JobState;
using ::testing::HasSubstr;

// --node-heartbeat-interval 0.2 --node-heartbeat-timeout 2.
constexpr absl::Duration kNodeTimeout = absl::Seconds(2);
// Slack for a loaded 2-core machine: the coordinator ticks, the agents poll.
constexpr absl::Duration kSlack = absl::Seconds(10);

class StallTest : public ::testing::Test {
 protected:
  void StartCluster(int agents) {
    ASSERT_TRUE(cluster_.StartCoordinator(CoordinatorFlags{}).ok());
    for (int i = 0; i < agents; ++i) {
      ASSERT_TRUE(cluster_.StartAgent(NamedAgent(absl::StrCat("node-", i))).ok());
    }
    ASSERT_TRUE(FaultCluster::Eventually(absl::Seconds(20), [&] {
      return cluster_.ReadyNodes() == agents;
    })) << "agents did not register";
  }

  static int AgentIndex(const std::string& node) { return std::stoi(node.substr(5)); }

  FaultCluster cluster_;
};

TEST_F(StallTest, StoppedAgentIsLostJobRestartsElsewhereAndResumedAgentIsFenced) {
  StartCluster(3);
  const std::string id =
      cluster_.Submit(cluster_.ShellJob("exec sleep 300", /*nodes=*/2, /*nproc=*/1,
                                        /*max_restarts=*/1));
  ASSERT_TRUE(cluster_.WaitForState(id, v1::JOB_STATE_RUNNING, absl::Seconds(20)));
  auto job = cluster_.Get(id);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->nodes_size(), 2);
  const std::string victim = job->nodes(1);
  const int victim_index = AgentIndex(victim);
  const std::vector<std::string> victim_gen0 = {"MESH_JOB_ID=" + id, "MESH_GENERATION=0",
                                                "MESH_NODE_NAME=" + victim};
  ASSERT_TRUE(FaultCluster::Eventually(
      absl::Seconds(10), [&] { return cluster_.Processes(victim_gen0).size() == 1; }));
  const std::string old_session_log = cluster_.ReadAgentLog(victim_index);

  const absl::Time stopped = absl::Now();
  cluster_.agent(victim_index).Signal(SIGSTOP);

  // LOST within the timeout (plus slack), never before it.
  ASSERT_TRUE(cluster_.WaitNodeState(victim, v1::NODE_STATE_LOST, kNodeTimeout + kSlack))
      << victim << " was not marked lost";
  EXPECT_GE(absl::Now() - stopped, kNodeTimeout - absl::Milliseconds(300));

  // The job restarted without the victim: generation 1 on the two others.
  ASSERT_TRUE(FaultCluster::Eventually(kSlack + absl::Seconds(10), [&] {
    auto j = cluster_.Get(id);
    return j.ok() && j->generation() == 1 && j->state() == v1::JOB_STATE_RUNNING;
  })) << cluster_.Get(id)->DebugString();
  job = cluster_.Get(id);
  EXPECT_EQ(job->restarts(), 1);
  EXPECT_EQ(job->root_cause().node(), victim);
  EXPECT_EQ(job->root_cause().rank(), -1);
  EXPECT_THAT(job->root_cause().message(), HasSubstr(victim));
  for (const std::string& node : job->nodes()) EXPECT_NE(node, victim);
  // The stalled agent's worker of generation 0 is still there: nobody could
  // kill it while its agent was stopped.
  EXPECT_EQ(cluster_.Processes(victim_gen0).size(), 1u);

  // Stay stopped a while longer (well past the timeout), then resume.
  absl::SleepFor(absl::Seconds(1));
  cluster_.agent(victim_index).Signal(SIGCONT);

  // Fenced: its old session is refused, it registers again, and the stale
  // worker is killed (KILL order from the registration's reconciliation).
  EXPECT_TRUE(
      FaultCluster::Eventually(kSlack, [&] { return cluster_.Processes(victim_gen0).empty(); }))
      << cluster_.Processes(victim_gen0).size() << " stale worker(s) of " << victim << " left";
  EXPECT_TRUE(cluster_.WaitNodeState(victim, v1::NODE_STATE_READY, kSlack));
  EXPECT_TRUE(FaultCluster::Eventually(absl::Seconds(5), [&] {
    const std::string log = cluster_.ReadAgentLog(victim_index);
    return log.find("ABORTED", old_session_log.size()) != std::string::npos &&
           log.find("registered as " + victim, old_session_log.size()) != std::string::npos;
  })) << cluster_.ReadAgentLog(victim_index).substr(old_session_log.size());

  // The stale agent's reports (its worker's exit) did not touch the job:
  // still generation 1, running, one restart; no transition after RUNNING.
  absl::SleepFor(absl::Seconds(1));
  job = cluster_.Get(id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job->generation(), 1);
  EXPECT_EQ(job->restarts(), 1);
  ASSERT_GT(job->events_size(), 0);
  EXPECT_EQ(job->events(job->events_size() - 1).to(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job->events(job->events_size() - 1).generation(), 1);
  // Generation 1's workers are alive, one per node.
  EXPECT_EQ(cluster_.Processes({"MESH_JOB_ID=" + id, "MESH_GENERATION=1"}).size(), 2u);
}

TEST_F(StallTest, StoppedAgentWithNoSpareNodeFailsTheJobNamingIt) {
  StartCluster(2);
  const std::string id = cluster_.Submit(cluster_.ShellJob("exec sleep 300", 2, 1));
  ASSERT_TRUE(cluster_.WaitForState(id, v1::JOB_STATE_RUNNING, absl::Seconds(20)));
  cluster_.agent(1).Signal(SIGSTOP);
  auto job = cluster_.WaitTerminal(id, kNodeTimeout + kSlack + absl::Seconds(10));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job->root_cause().node(), "node-1");
  EXPECT_THAT(job->root_cause().message(), HasSubstr("node-1"));
  EXPECT_THAT(job->root_cause().message(), HasSubstr("heartbeat"));
  // node-0's worker is killed at once; node-1's once its agent is back.
  EXPECT_TRUE(FaultCluster::Eventually(kSlack, [&] {
    return cluster_.Processes({"MESH_JOB_ID=" + id, "MESH_NODE_NAME=node-0"}).empty();
  }));
  cluster_.agent(1).Signal(SIGCONT);
  EXPECT_TRUE(FaultCluster::Eventually(
      kSlack, [&] { return cluster_.Processes({"MESH_JOB_ID=" + id}).empty(); }))
      << cluster_.Processes({"MESH_JOB_ID=" + id}).size() << " processes of the job left";
  EXPECT_TRUE(cluster_.WaitNodeState("node-1", v1::NODE_STATE_READY, kSlack));
  EXPECT_EQ(cluster_.Get(id)->state(), v1::JOB_STATE_FAILED);
}

// The coordinator itself stalled (SIGSTOP) for three node heartbeat
// timeouts, under a running libmesh job: when it runs again it forgives the
// time it lost (coordinator/server_lag.h), so no node is LOST; the job goes
// on and succeeds without a restart. (Ranks give up on a coordinator they
// cannot reach for their own heartbeat timeout, docs/failure-semantics.md,
// so that one is longer than the pause here.) The ticker and the threads
// that read the queued heartbeats resume together, and which runs first is
// up to the scheduler; the forgiveness makes the outcome the same either
// way (its unit tests: coordination_test, job_manager_test, liveness_test).
TEST_F(StallTest, StoppedCoordinatorBlamesNoNodeAndNoRank) {
  CoordinatorFlags flags;
  flags.heartbeat_interval = 0.5;
  flags.heartbeat_timeout = 30;
  ASSERT_TRUE(cluster_.StartCoordinator(flags).ok());
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(cluster_.StartAgent(NamedAgent(absl::StrCat("node-", i))).ok());
  }
  ASSERT_TRUE(
      FaultCluster::Eventually(absl::Seconds(20), [&] { return cluster_.ReadyNodes() == 2; }));
  v1::JobSpec spec = cluster_.ShellJob("", /*nodes=*/2, /*nproc=*/1);
  spec.clear_command();
  spec.add_command(FAULT_B_WORKER_BIN);
  (*spec.mutable_env())["FAULT_B_HOLD_SECONDS"] = "12";
  const std::string id = cluster_.Submit(spec);
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(cluster_.WaitForState(id, v1::JOB_STATE_RUNNING, absl::Seconds(20)));
  absl::SleepFor(absl::Seconds(2));  // Joined: the ranks heartbeat.

  cluster_.coordinator().Signal(SIGSTOP);
  absl::SleepFor(3 * kNodeTimeout);
  cluster_.coordinator().Signal(SIGCONT);

  auto job = cluster_.WaitTerminal(id, absl::Seconds(60));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->DebugString();
  EXPECT_EQ(job->restarts(), 0) << job->DebugString();
  EXPECT_EQ(cluster_.ReadyNodes(), 2);
}

// The fencing contract itself, through NodeService as a stale agent would
// call it: once a node is lost, every call of its old session is ABORTED,
// and a new registration gets a new session that works.
TEST_F(StallTest, OldSessionOfALostNodeIsAbortedEverywhere) {
  ASSERT_TRUE(cluster_.StartCoordinator(CoordinatorFlags{}).ok());
  auto nodes = v1::NodeService::NewStub(cluster_.channel());
  v1::RegisterNodeRequest reg;
  reg.set_name("stale");
  reg.set_address("127.0.0.1");
  reg.set_slots(1);
  v1::RegisterNodeResponse registered;
  ASSERT_TRUE(nodes->RegisterNode(cluster_.Context().get(), reg, &registered).ok());
  const std::string old_session = registered.session_id();
  // No heartbeats: lost after the timeout.
  ASSERT_TRUE(cluster_.WaitNodeState("stale", v1::NODE_STATE_LOST, kNodeTimeout + kSlack));

  v1::NodeHeartbeatRequest beat;
  beat.set_name("stale");
  beat.set_session_id(old_session);
  v1::NodeHeartbeatResponse beat_reply;
  grpc::Status status = nodes->NodeHeartbeat(cluster_.Context().get(), beat, &beat_reply);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(status.error_message(), HasSubstr("lost"));

  v1::ReportWorkerExitRequest exit;
  exit.set_name("stale");
  exit.set_session_id(old_session);
  exit.set_job_id("some-job");
  exit.set_exit_code(1);
  v1::ReportWorkerExitResponse exit_reply;
  status = nodes->ReportWorkerExit(cluster_.Context().get(), exit, &exit_reply);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ABORTED);

  v1::ReportWorkersStartedRequest started;
  started.set_name("stale");
  started.set_session_id(old_session);
  started.set_job_id("some-job");
  v1::ReportWorkersStartedResponse started_reply;
  status = nodes->ReportWorkersStarted(cluster_.Context().get(), started, &started_reply);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ABORTED);

  v1::WatchAssignmentsRequest watch;
  watch.set_name("stale");
  watch.set_session_id(old_session);
  auto context = cluster_.Context(absl::Seconds(5));
  auto reader = nodes->WatchAssignments(context.get(), watch);
  v1::Assignment order;
  EXPECT_FALSE(reader->Read(&order));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::ABORTED);

  // A new registration is a new session, and it works.
  ASSERT_TRUE(nodes->RegisterNode(cluster_.Context().get(), reg, &registered).ok());
  EXPECT_NE(registered.session_id(), old_session);
  beat.set_session_id(registered.session_id());
  EXPECT_TRUE(nodes->NodeHeartbeat(cluster_.Context().get(), beat, &beat_reply).ok());
  EXPECT_EQ(cluster_.GetNode("stale")->state(), v1::NODE_STATE_READY);
  // And the old one stays refused after it.
  beat.set_session_id(old_session);
  EXPECT_EQ(nodes->NodeHeartbeat(cluster_.Context().get(), beat, &beat_reply).error_code(),
            grpc::StatusCode::ABORTED);
}

}  // namespace fault_b_stall_test
}  // namespace mesh::fault
