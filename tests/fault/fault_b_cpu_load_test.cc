// Reliability scenario 5: heartbeats arriving at 0.9x their timeout while
// every core is busy with a CPU burner.
//
// Node heartbeats every 4.5 s against a 5 s timeout (the agents beat at the
// interval the coordinator gives them, plus the RPC's own time); rank
// heartbeats every 4.5 s against 5 s (libmesh beats on a fixed schedule at
// the interval of the join reply). A 2-rank libmesh job on two agents holds
// for 15 s (3 timeouts of each kind) running a barrier and an all_reduce
// every 200 ms, with one spinning process per core at the same priority as
// everything else.
//
// Expected: no false positive: the job succeeds with no restart and no node
// is ever marked lost. The test can fail: a beat delayed past 10% of its
// timeout (a slow tick, a starved thread) loses a node or a rank.
//
// Why 4.5/5 s and not 0.9/1 s: the ratio is what the scenario is about, but
// the slack it leaves is absolute. At 0.9/1 s (100 ms of slack) this test
// failed 1 run in 8 on the 2-core test machine under full load: a rank
// "missed" its heartbeat by 20 ms ("no heartbeat for 1.02s (timeout 1s)"),
// i.e. scheduling delayed a beat by ~120 ms. docs/failure-semantics.md
// advises at least 0.5 s (better: 2 intervals) between interval and timeout.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/util/fault_cluster.h"

namespace mesh::fault {
namespace fault_b_cpu_load_test {

constexpr double kHoldSeconds = 15;

TEST(CpuLoadTest, HeartbeatsAtNineTenthsOfTheTimeoutUnderFullCpuLoadRaiseNoFalseFailure) {
  FaultCluster cluster;
  CoordinatorFlags flags;
  flags.node_heartbeat_interval = 4.5;
  flags.node_heartbeat_timeout = 5;
  flags.heartbeat_interval = 4.5;
  flags.heartbeat_timeout = 5;
  ASSERT_TRUE(cluster.StartCoordinator(flags).ok());
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(cluster.StartAgent(NamedAgent(absl::StrCat("node-", i))).ok());
  }
  ASSERT_TRUE(
      FaultCluster::Eventually(absl::Seconds(20), [&] { return cluster.ReadyNodes() == 2; }));

  const int cores = std::max(2, static_cast<int>(std::thread::hardware_concurrency()));
  CpuBurner burner(cores, absl::Seconds(kHoldSeconds + 60));

  v1::JobSpec spec = cluster.ShellJob("", /*nodes=*/2, /*nproc=*/1);
  spec.clear_command();
  spec.add_command(FAULT_B_WORKER_BIN);
  (*spec.mutable_env())["FAULT_B_HOLD_SECONDS"] = absl::StrCat(kHoldSeconds);
  const absl::Time start = absl::Now();
  const std::string id = cluster.Submit(spec);
  ASSERT_FALSE(id.empty());

  // Watch the nodes the whole time: a single LOST is a false positive.
  int lowest_ready = 2;
  bool terminal = false;
  const absl::Time deadline = start + absl::Seconds(kHoldSeconds + 60);
  while (!terminal && absl::Now() < deadline) {
    lowest_ready = std::min(lowest_ready, cluster.ReadyNodes());
    auto job = cluster.Get(id);
    terminal = job.ok() &&
               (job->state() == v1::JOB_STATE_SUCCEEDED || job->state() == v1::JOB_STATE_FAILED ||
                job->state() == v1::JOB_STATE_CANCELLED);
    absl::SleepFor(absl::Milliseconds(100));
  }
  auto job = cluster.WaitTerminal(id, absl::Seconds(30));
  ASSERT_TRUE(job.ok()) << job.status();
  const double took = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf(
      "fault-b cpu load: %d burners; job %s after %.1f s (hold %.0f s); fewest ready nodes %d\n",
      cores, v1::JobState_Name(job->state()).c_str(), took, kHoldSeconds, lowest_ready);
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->root_cause().message();
  EXPECT_EQ(job->restarts(), 0) << job->root_cause().message();
  EXPECT_EQ(lowest_ready, 2) << "a node was marked lost under load";
  // It really ran for the whole hold (the load was there for N timeouts).
  EXPECT_GE(took, kHoldSeconds);
}

}  // namespace fault_b_cpu_load_test
}  // namespace mesh::fault
