// A rank that exits 0 without a clean shutdown (no Leave) while its peers
// wait at a barrier with a 120 s timeout (reliability scenario 9;
// docs/failure-semantics.md): the peers' barrier ends with ABORTED well
// before its deadline, naming the rank, its host and "exited with code 0
// before the job finished"; the job fails with that rank as its root cause.
//
// Real processes: mesh-coordinator, one mesh-agent, three workers
// (exit_without_leave_worker) that join over WorkerService and never
// heartbeat; the coordinator's rank heartbeat timeout is 300 s, so only the
// agent's exit report can end the barrier early.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "mesh/v1/job.grpc.pb.h"
#include "tests/util/mesh_cluster.h"
#include "tests/util/proc.h"

namespace mesh {
namespace exit_without_leave_test {

using ::mesh::testing::ContextWithDeadline;
using ::mesh::testing::MeshCluster;
using ::mesh::testing::WaitUntil;
using ::testing::HasSubstr;
using namespace mesh::v1;  // NOLINT

constexpr char kExit0[] = "exited with code 0 before the job finished";
// The barrier's own deadline is 120 s; the error must come long before.
constexpr absl::Duration kPromptly = absl::Seconds(20);

std::string ReadFile(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

TEST(ExitWithoutLeaveTest, PeersAtABarrierGetAnErrorNamingTheRankLongBeforeTheDeadline) {
  MeshCluster cluster({MESH_COORDINATOR_BIN, MESH_AGENT_BIN}, "mesh-fault-exit0");
  ASSERT_TRUE(
      cluster.StartCoordinator(0, {"--heartbeat-interval", "1", "--heartbeat-timeout", "300"})
          .ok());
  ASSERT_TRUE(cluster.StartAgent(0, /*slots=*/3).ok());
  ASSERT_TRUE(WaitUntil([&] { return cluster.ReadyNodes() == 1; }, absl::Seconds(20)));

  JobSpec spec;
  spec.set_name("exit0");
  spec.add_command(EXIT_WITHOUT_LEAVE_WORKER_BIN);
  spec.mutable_nodes()->set_min(1);
  spec.set_nproc_per_node(3);
  (*spec.mutable_env())["EXIT_RANK"] = "1";
  (*spec.mutable_env())["RESULT_DIR"] = cluster.dir();
  SubmitJobRequest submit;
  *submit.mutable_spec() = spec;
  SubmitJobResponse submitted;
  const absl::Time start = absl::Now();
  const grpc::Status status =
      cluster.jobs().SubmitJob(ContextWithDeadline(absl::Seconds(10)).get(), submit, &submitted);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const std::string id = submitted.job().id();

  absl::StatusOr<Job> job = cluster.WaitTerminal(id, absl::Seconds(90));
  ASSERT_TRUE(job.ok()) << job.status();
  const absl::Duration took = absl::Now() - start;
  std::printf("[ scenario 9 ] job %s ended %s %.3f s after submit: %s\n", id.c_str(),
              JobState_Name(job->state()).c_str(), absl::ToDoubleSeconds(took),
              job->root_cause().message().c_str());
  EXPECT_EQ(job->state(), JOB_STATE_FAILED);
  EXPECT_EQ(job->root_cause().rank(), 1);
  EXPECT_THAT(job->root_cause().message(), HasSubstr("rank 1"));
  EXPECT_THAT(job->root_cause().message(), HasSubstr(kExit0));
  EXPECT_LT(took, kPromptly);

  // Each peer's own barrier call: ABORTED, naming rank 1, its host and why.
  for (int rank : {0, 2}) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    const std::string path = absl::StrCat(cluster.dir(), "/rank-", rank, ".txt");
    ASSERT_TRUE(WaitUntil([&] { return !ReadFile(path).empty(); }, absl::Seconds(10)));
    const std::string result = ReadFile(path);
    int code = -1;
    double seconds = -1;
    std::istringstream(result) >> code >> seconds;
    std::printf("[ scenario 9 ] rank %d barrier ended after %.3f s: %s", rank, seconds,
                result.substr(result.find('\n') + 1).c_str());
    EXPECT_EQ(code, static_cast<int>(grpc::StatusCode::ABORTED)) << result;
    EXPECT_THAT(result, HasSubstr("rank 1 (node-0)"));
    EXPECT_THAT(result, HasSubstr(kExit0));
    EXPECT_LT(seconds, absl::ToDoubleSeconds(kPromptly));
  }
}

}  // namespace exit_without_leave_test
}  // namespace mesh
