// Coordinator replicas on etcd (docs/ha.md): kill -9 of the leader under
// load, in make test-slow (about a minute; the fixture: ha_fixture.h):
// - while 200 jobs are submitted with idempotency keys: every acknowledged
//   job exists once, and all of them finish;
// - under a running 2-node libmesh job that is past rendezvous: its ranks
//   re-attach to the new leader and the job finishes SUCCEEDED without a
//   restart;
// - while that job is in rendezvous: its Join completes on the new leader,
//   again without a restart.
#include "tests/integration/ha_fixture.h"

namespace mesh::testing {
namespace ha_failover_test {

using ha_test::HaTest;
using ha_test::kLease;
using ha_test::TrueSpec;

TEST_F(HaTest, LeaderKilledDuringSubmitsLosesNoAcknowledgedJob) {
  StartCoordinator(0);
  ASSERT_EQ(Leader(), 0);
  StartCoordinator(1);
  StartAgent(0, 4);
  ASSERT_TRUE(WaitUntil([&] { return ReadyNodes() == 1; }, absl::Seconds(30)));

  // Each submit is retried with its key, against whichever replica leads,
  // until acknowledged; the leader dies after the 50th acknowledgement.
  constexpr int kJobs = 200;
  std::set<std::string> ids;
  absl::Time killed_at;
  absl::Duration takeover;
  int leader = 0;
  for (int n = 0; n < kJobs; ++n) {
    const std::string key = absl::StrCat("submit-", n);
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    bool acknowledged = false;
    while (!acknowledged && absl::Now() < deadline) {
      if (leader < 0) leader = Leader(absl::Seconds(5));
      if (leader < 0) continue;
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
      v1::SubmitJobRequest request;
      *request.mutable_spec() = TrueSpec(key);
      v1::SubmitJobResponse response;
      const grpc::Status status = Jobs(leader)->SubmitJob(&context, request, &response);
      if (status.ok()) {
        acknowledged = true;
        ids.insert(response.job().id());
        if (killed_at != absl::Time() && takeover == absl::Duration()) {
          takeover = absl::Now() - killed_at;
        }
      } else {
        ASSERT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
        leader = -1;  // Find it again.
      }
    }
    ASSERT_TRUE(acknowledged) << key << " was never acknowledged";
    if (n == 50) {
      killed_at = absl::Now();
      KillCoordinator(0);
    }
  }
  // Two keys never share a job, and a retried key never made a second one.
  EXPECT_EQ(ids.size(), static_cast<size_t>(kJobs));
  std::printf("takeover after kill -9 of the leader (lease %s s): %s\n", kLease,
              absl::FormatDuration(takeover).c_str());
  EXPECT_LT(takeover, absl::Seconds(2 * 2 + 2)) << "2x the lease, plus slack for this machine";
  ASSERT_EQ(Leader(), 1);

  // Every job once, and every one of them finishes.
  int listed = 0;
  int succeeded = 0;
  EXPECT_TRUE(WaitUntil(
      [&] {
        v1::ListJobsRequest list;
        list.set_page_size(1000);
        grpc::ClientContext context;
        v1::ListJobsResponse response;
        if (!Jobs(1)->ListJobs(&context, list, &response).ok()) return false;
        listed = response.jobs_size();
        succeeded = 0;
        for (const v1::Job& job : response.jobs()) {
          succeeded += job.state() == v1::JOB_STATE_SUCCEEDED ? 1 : 0;
        }
        return succeeded == kJobs;
      },
      absl::Seconds(120)))
      << succeeded << " of " << kJobs << " succeeded";
  EXPECT_EQ(listed, kJobs);
}

class HaJobTest : public HaTest {
 protected:
  // Two replicas, two one-slot agents and a 2-node job running `command`;
  // `while_running` after the job is RUNNING, the leader is killed. The job
  // must finish SUCCEEDED with 0 restarts (else the rank logs are shown).
  void KillTheLeaderUnderATwoNodeJob(const std::vector<std::string>& command,
                                     absl::Duration while_running);
};

void HaJobTest::KillTheLeaderUnderATwoNodeJob(const std::vector<std::string>& command,
                                              absl::Duration while_running) {
  StartCoordinator(0);
  ASSERT_EQ(Leader(), 0);
  StartCoordinator(1);
  StartAgent(0, 1);
  StartAgent(1, 1);
  ASSERT_TRUE(WaitUntil([&] { return ReadyNodes() == 2; }, absl::Seconds(30)));

  v1::JobSpec spec;
  spec.set_name("under-failover");
  for (const std::string& arg : command) spec.add_command(arg);
  spec.mutable_nodes()->set_min(2);
  spec.set_nproc_per_node(1);
  spec.set_max_restarts(2);
  grpc::ClientContext context;
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  v1::SubmitJobResponse response;
  ASSERT_TRUE(Jobs(0)->SubmitJob(&context, request, &response).ok());
  const std::string id = response.job().id();
  ASSERT_TRUE(WaitUntil(
      [&] {
        std::optional<v1::Job> job = GetJob(id);
        return job.has_value() && job->state() == v1::JOB_STATE_RUNNING;
      },
      absl::Seconds(30)));
  absl::SleepFor(while_running);
  KillCoordinator(0);

  ASSERT_TRUE(WaitUntil(
      [&] {
        std::optional<v1::Job> job = GetJob(id);
        return job.has_value() &&
               (job->state() == v1::JOB_STATE_SUCCEEDED || job->state() == v1::JOB_STATE_FAILED);
      },
      absl::Seconds(90)));
  std::optional<v1::Job> job = GetJob(id);
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->DebugString();
  EXPECT_EQ(job->restarts(), 0) << job->DebugString()
                                << RunMerged({"/bin/sh", "-c",
                                              absl::StrCat("tail -n 20 ", dir_.path(),
                                                           "/agent-*/jobs/*/gen-0/rank-*.log")},
                                             absl::Seconds(10))
                                       .output;
}

TEST_F(HaJobTest, LeaderKilledUnderARunningJobPastRendezvousDoesNotRestartIt) {
  // All-reduces for several seconds after joining; killed 2 s into it, past
  // rendezvous: the rounds have begun.
  KillTheLeaderUnderATwoNodeJob(
      {ALLREDUCE_2D_BIN, "--gloo-host", "127.0.0.1", "--elements", "262144", "--rounds", "5000"},
      absl::Seconds(2));
}

TEST_F(HaJobTest, LeaderKilledWhileAJobIsInRendezvousCompletesItWithoutARestart) {
  // Rank 0 joins at once and waits in Join for rank 1, which comes 5 s
  // later: the leader dies 1 s in, with the job in rendezvous.
  KillTheLeaderUnderATwoNodeJob(
      {"/bin/sh", "-c", "if [ \"$MESH_RANK\" = 1 ]; then sleep 5; fi; exec \"$0\" \"$@\"",
       ALLREDUCE_2D_BIN, "--gloo-host", "127.0.0.1", "--rounds", "20"},
      absl::Seconds(1));
}

}  // namespace ha_failover_test
}  // namespace mesh::testing
