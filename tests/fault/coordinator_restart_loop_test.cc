// kill -9 and restart of the coordinator, again and again, under short jobs
// on a 2-node local cluster. What must hold through every cycle:
//
//   * a job whose ranks all exited 0 ends SUCCEEDED: the exit records the
//     agents hold while the coordinator is down, and their late reconnect,
//     never turn it into FAILED ("node lost"), even with a node heartbeat
//     timeout (5 s) that a slow re-registration can exceed;
//   * both agents re-register within the node heartbeat timeout of each
//     restart, so liveness never counts the outage against them (each
//     cycle's time is printed; docs/failure-semantics.md, "Reconnect time",
//     has the figures: about a second).
//
// Each cycle submits a job of two ranks that sleep briefly and exit 0, kills
// the coordinator at a varying moment of the job's life, keeps it down for
// a varying time, restarts it on the same port and state, and then waits
// for both agents and the job. The cycle count and every wait are bounded.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "mesh/v1/job.grpc.pb.h"
#include "tests/util/cluster_queries.h"
#include "tests/util/mesh_cluster.h"
#include "tests/util/proc.h"

namespace mesh {
namespace coordinator_restart_loop_test {

using ::mesh::testing::MeshCluster;
using ::mesh::testing::WaitUntil;
using ::mesh::v1::Job;
using ::mesh::v1::JOB_STATE_SUCCEEDED;

constexpr int kCycles = 6;
// Short enough that a re-registration stalled for seconds outlasts it; the
// grace after a restart (--node-recovery-grace) is left at its default.
constexpr absl::Duration kNodeTimeout = absl::Seconds(5);
// How long both agents may take to be back after a restart: within the
// node heartbeat timeout (it used to take up to 5 s; now about 1 s).
constexpr absl::Duration kAgentsBack = kNodeTimeout;

TEST(CoordinatorRestartLoopTest, Kill9CyclesNeverFailASucceededJobAndAgentsComeBackInTime) {
  MeshCluster cluster({MESH_COORDINATOR_BIN, MESH_AGENT_BIN}, "mesh-fault-restart-loop");
  ASSERT_TRUE(cluster.StartCoordinator(0, {}, kNodeTimeout).ok());
  ASSERT_TRUE(cluster.StartAgent(0, 1).ok());
  ASSERT_TRUE(cluster.StartAgent(1, 1).ok());
  ASSERT_TRUE(WaitUntil([&] { return cluster.ReadyNodes() == 2; }, absl::Seconds(20)));
  const int port = cluster.port();
  const std::string marker = absl::StrCat("restart-loop-", getpid());

  std::vector<double> reconnect_s;
  for (int cycle = 0; cycle < kCycles; ++cycle) {
    const absl::StatusOr<Job> submitted = ::mesh::testing::SubmitJob(
        cluster.jobs(), ::mesh::testing::ShellJobSpec("sleep 0.3; exit 0", /*nodes=*/2,
                                                      /*nproc=*/1, marker));
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    const std::string id = submitted->id();
    // Kill at a varying point: before launch, while the ranks sleep, or
    // after they exited and before the exits were reported.
    absl::SleepFor(absl::Milliseconds(150 * (cycle % 4)));
    ASSERT_TRUE(cluster.KillCoordinator().ok());
    // Down for 0.3 to 1.8 s, the range of the reported failures.
    absl::SleepFor(absl::Milliseconds(300 + 500 * (cycle % 4)));
    const absl::Time restart = absl::Now();
    ASSERT_TRUE(cluster.StartCoordinator(port, {}, kNodeTimeout).ok()) << "cycle " << cycle;
    // An agent is back when a heartbeat of its new session is seen.
    const bool back =
        WaitUntil([&] { return cluster.NodesSeenSince(restart + absl::Milliseconds(300)) == 2; },
                  kAgentsBack);
    const double took = absl::ToDoubleSeconds(absl::Now() - restart);
    reconnect_s.push_back(took);
    std::printf("[ cycle %d ] %s: both agents back %.2f s after the restart\n", cycle, id.c_str(),
                took);
    EXPECT_TRUE(back) << "cycle " << cycle << ": the agents were not back within "
                      << absl::FormatDuration(kAgentsBack);

    absl::StatusOr<Job> done = cluster.WaitTerminal(id, absl::Seconds(30));
    ASSERT_TRUE(done.ok()) << "cycle " << cycle << ": " << done.status();
    EXPECT_EQ(done->state(), JOB_STATE_SUCCEEDED)
        << "cycle " << cycle << ": job " << id << " whose ranks exit 0 ended "
        << ::mesh::v1::JobState_Name(done->state()) << ": " << done->root_cause().message();
  }
  std::printf("agents back after each restart (s):");
  for (double s : reconnect_s) std::printf(" %.2f", s);
  std::printf("; slowest %.2f\n", *std::max_element(reconnect_s.begin(), reconnect_s.end()));
}

}  // namespace coordinator_restart_loop_test
}  // namespace mesh
