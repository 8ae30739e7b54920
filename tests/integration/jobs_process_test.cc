// The user's main path with real processes on 127.0.0.1: a mesh-coordinator
// with a state directory, two mesh-agents, jobs submitted over JobService
// and with the meshctl binary, workers that are plain /bin/sh scripts.
//
// Covers: a job succeeds and its logs are complete; a worker
// killed with SIGKILL restarts the job, which then succeeds; max_restarts
// exhausted gives FAILED naming the rank and signal; cancel leaves no process
// behind; kill -9 of the coordinator and a restart keep the job and the
// agents reconnect; kill -9 of an agent takes its workers with it and the
// job fails naming the node; an invalid spec is rejected and nothing stored.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "mesh/v1/job.grpc.pb.h"
#include "tests/util/cluster_queries.h"
#include "tests/util/proc.h"
#include "tests/util/subprocess.h"

namespace mesh {
namespace jobs_process_test {

using ::mesh::testing::ExitCode;
using ::mesh::testing::MakeTempDir;
using ::mesh::testing::Subprocess;
using ::mesh::v1::JobState;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr absl::Duration kStartTimeout = absl::Seconds(20);
constexpr char kBanner[] = "mesh-coordinator listening on ";

// Waits until `condition` holds, for at most `timeout`.
template <typename Condition>
bool Eventually(absl::Duration timeout, Condition condition) {
  return ::mesh::testing::WaitUntil(condition, timeout);
}

class JobsProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("mesh-jobs-test");
    StartCoordinator(/*port=*/0);
    for (int i = 0; i < 2; ++i) StartAgent(i);
    ASSERT_TRUE(Eventually(absl::Seconds(20), [&] { return ReadyNodes() == 2; }))
        << "agents did not register";
  }

  void TearDown() override {
    agents_.clear();
    coordinator_.reset();
    std::system(absl::StrCat("rm -rf '", dir_, "'").c_str());
  }

  void StartCoordinator(int port) {
    auto process = Subprocess::Start(
        {MESH_COORDINATOR_BIN, "--insecure", "--listen", "127.0.0.1", "--port", absl::StrCat(port),
         "--state-dir", dir_ + "/state", "--node-heartbeat-interval", "0.2",
         "--node-heartbeat-timeout", "2", "--kill-grace", "1", "--shutdown-grace", "0.5"});
    ASSERT_TRUE(process.ok()) << process.status();
    auto line = process->ReadLine(kStartTimeout);
    ASSERT_TRUE(line.ok()) << line.status();
    ASSERT_THAT(*line, StartsWith(kBanner));
    address_ = line->substr(sizeof(kBanner) - 1);
    coordinator_ = std::make_unique<Subprocess>(*std::move(process));
    channel_ = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
    jobs_ = mesh::v1::JobService::NewStub(channel_);
  }

  void StartAgent(int i) {
    auto process =
        Subprocess::Start({MESH_AGENT_BIN, "--coordinator", address_, "--name",
                           absl::StrCat("node-", i), "--address", "127.0.0.1", "--slots", "2",
                           "--gpus", "none", "--work-dir", absl::StrCat(dir_, "/agent-", i),
                           "--grace", "1", "--unowned-job-user", mesh::testing::CurrentUserName()});
    ASSERT_TRUE(process.ok()) << process.status();
    if (static_cast<int>(agents_.size()) <= i) agents_.resize(i + 1);
    agents_[i] = std::make_unique<Subprocess>(*std::move(process));
  }

  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = absl::Seconds(10)) {
    return mesh::testing::ContextWithDeadline(timeout);
  }

  // Thin wrappers over tests/util/cluster_queries.h.
  int ReadyNodes() {
    absl::StatusOr<int> ready = mesh::testing::ReadyNodes(*jobs_);
    return ready.ok() ? *ready : -1;
  }

  // 2 nodes x 2 processes running `script` with /bin/sh.
  mesh::v1::JobSpec ShellJob(const std::string& script, int max_restarts = 0) {
    mesh::v1::JobSpec spec = mesh::testing::ShellJobSpec(script, 2, 2, marker_);
    spec.set_max_restarts(max_restarts);
    return spec;
  }

  std::string Submit(const mesh::v1::JobSpec& spec) {
    absl::StatusOr<mesh::v1::Job> job = mesh::testing::SubmitJob(*jobs_, spec);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id() : std::string();
  }

  std::optional<mesh::v1::Job> Get(const std::string& id) {
    absl::StatusOr<mesh::v1::Job> job = mesh::testing::GetJob(*jobs_, id);
    if (!job.ok()) return std::nullopt;
    return *std::move(job);
  }

  bool WaitForState(const std::string& id, JobState state, absl::Duration timeout) {
    return mesh::testing::WaitForState(*jobs_, id, state, timeout);
  }

  mesh::v1::Job WaitTerminal(const std::string& id, absl::Duration timeout = absl::Seconds(60)) {
    absl::StatusOr<mesh::v1::Job> job = mesh::testing::WaitTerminal(*jobs_, id, timeout);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *std::move(job) : mesh::v1::Job();
  }

  // Runs meshctl with `args` against this cluster; returns its exit code and
  // stdout.
  std::pair<int, std::string> Meshctl(std::vector<std::string> args) {
    args.insert(args.begin(), {MESHCTL_BIN, "--coordinator", address_});
    auto process = Subprocess::Start(args);
    EXPECT_TRUE(process.ok());
    std::string out;
    for (;;) {
      auto line = process->ReadLine(absl::Seconds(60));
      if (!line.ok()) break;
      absl::StrAppend(&out, *line, "\n");
    }
    auto status = process->Wait(absl::Seconds(60));
    EXPECT_TRUE(status.ok()) << status.status();
    return {status.ok() ? ExitCode(*status) : -1, out};
  }

  std::vector<pid_t> JobProcesses(const std::string& job_id) {
    return ::mesh::testing::LiveProcessesWithEnv({"MARKER=" + marker_, "MESH_JOB_ID=" + job_id});
  }

  std::string dir_;
  std::string address_;
  // Tags this test's workers so /proc scans find only them.
  std::string marker_ =
      absl::StrCat("jobs-process-test-", getpid(), "-", absl::ToUnixNanos(absl::Now()));
  std::unique_ptr<Subprocess> coordinator_;
  std::vector<std::unique_ptr<Subprocess>> agents_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<mesh::v1::JobService::Stub> jobs_;
};

TEST_F(JobsProcessTest, JobSucceedsAndItsLogsAreComplete) {
  // meshctl submit follows the logs and exits with the job's result.
  auto [code, out] = Meshctl({"submit", "--nodes", "2", "--nproc-per-node", "2", "--mesh-shape",
                              "2,2", "--dim-names", "dp,tp", "--", "/bin/sh", "-c",
                              "i=1; while [ $i -le 300 ]; do echo \"r$RANK l$i\"; "
                              "i=$((i+1)); done"});
  EXPECT_EQ(code, 0) << out;
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_THAT(out, HasSubstr(absl::StrCat("r", rank, " l300\n"))) << "rank " << rank;
  }

  mesh::v1::ListJobsRequest list;
  mesh::v1::ListJobsResponse jobs;
  ASSERT_TRUE(jobs_->ListJobs(Context().get(), list, &jobs).ok());
  ASSERT_EQ(jobs.jobs_size(), 1);
  const std::string id = jobs.jobs(0).id();
  EXPECT_EQ(jobs.jobs(0).state(), mesh::v1::JOB_STATE_SUCCEEDED);

  // Every line of every rank, in order, from `meshctl logs` after the end.
  auto [logs_code, logs] = Meshctl({"logs", id});
  EXPECT_EQ(logs_code, 0);
  std::map<int, int> next_line;
  for (absl::string_view line : absl::StrSplit(logs, '\n', absl::SkipEmpty())) {
    int rank = -1;
    int number = 0;
    std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    ASSERT_GE(words.size(), 2u) << line;
    const std::string& last = words.back();
    const std::string& before = words[words.size() - 2];
    ASSERT_TRUE(absl::SimpleAtoi(absl::string_view(before).substr(1), &rank)) << line;
    ASSERT_TRUE(absl::SimpleAtoi(absl::string_view(last).substr(1), &number)) << line;
    EXPECT_EQ(number, ++next_line[rank]) << "rank " << rank << " skipped or repeated a line";
  }
  for (int rank = 0; rank < 4; ++rank) EXPECT_EQ(next_line[rank], 300) << "rank " << rank;
}

TEST_F(JobsProcessTest, SigkilledWorkerRestartsTheJobWhichThenSucceeds) {
  const std::string id = Submit(ShellJob(
      "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && [ \"$RANK\" = 1 ]; then kill -9 $$; fi; "
      "exit 0",
      /*max_restarts=*/2));
  const mesh::v1::Job job = WaitTerminal(id);
  EXPECT_EQ(job.state(), mesh::v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(job.restarts(), 1);
  EXPECT_EQ(job.generation(), 1);
  EXPECT_EQ(job.root_cause().rank(), 1);
  EXPECT_EQ(job.root_cause().signal(), 9);
  auto [code, out] = Meshctl({"status", id, "-o", "json"});
  EXPECT_EQ(code, 0);
  EXPECT_THAT(out, HasSubstr("\"restarts\": 1"));
}

TEST_F(JobsProcessTest, ExhaustedRestartsFailNamingTheRankAndSignal) {
  const std::string id =
      Submit(ShellJob("if [ \"$RANK\" = 2 ]; then kill -9 $$; fi; sleep 30", /*max_restarts=*/1));
  auto [code, out] = Meshctl({"wait", id, "--timeout", "60"});
  EXPECT_EQ(code, 1) << out;  // FAILED.
  const auto job = Get(id);
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->state(), mesh::v1::JOB_STATE_FAILED);
  EXPECT_EQ(job->restarts(), 1);
  EXPECT_EQ(job->root_cause().rank(), 2);
  EXPECT_EQ(job->root_cause().node(), "node-1");
  EXPECT_EQ(job->root_cause().signal(), 9);
  EXPECT_THAT(job->root_cause().message(), HasSubstr("SIGKILL"));
  // The survivors of the failed generation were killed.
  EXPECT_TRUE(Eventually(absl::Seconds(10), [&] { return JobProcesses(id).empty(); }));
}

TEST_F(JobsProcessTest, CancelLeavesNoProcessBehind) {
  // Each worker has a child of its own, which must go too.
  const std::string id = Submit(ShellJob("sleep 300 & sleep 300"));
  ASSERT_TRUE(WaitForState(id, mesh::v1::JOB_STATE_RUNNING, absl::Seconds(20)));
  ASSERT_TRUE(Eventually(absl::Seconds(10), [&] { return JobProcesses(id).size() >= 8; }))
      << JobProcesses(id).size() << " processes";
  auto [code, out] = Meshctl({"cancel", id});
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(Get(id)->state(), mesh::v1::JOB_STATE_CANCELLED);
  EXPECT_TRUE(Eventually(absl::Seconds(10), [&] { return JobProcesses(id).empty(); }))
      << JobProcesses(id).size() << " processes left";
}

TEST_F(JobsProcessTest, CoordinatorKill9AndRestartKeepsTheJobAndAgentsReconnect) {
  const std::string release = dir_ + "/release";
  const std::string id = Submit(ShellJob(
      absl::StrCat("while [ ! -e '", release, "' ]; do sleep 0.1; done; echo done $RANK")));
  ASSERT_TRUE(WaitForState(id, mesh::v1::JOB_STATE_RUNNING, absl::Seconds(20)));
  const int port = std::stoi(address_.substr(address_.rfind(':') + 1));

  coordinator_->Signal(SIGKILL);
  ASSERT_TRUE(coordinator_->Wait(absl::Seconds(10)).ok());
  coordinator_.reset();
  StartCoordinator(port);

  // Same id, same state; the agents come back and nothing was restarted.
  auto job = Get(id);
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->state(), mesh::v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(Eventually(absl::Seconds(20), [&] { return ReadyNodes() == 2; }));
  // Past the reconciliation window, the job is still running as generation 0.
  absl::SleepFor(absl::Seconds(3));
  job = Get(id);
  EXPECT_EQ(job->state(), mesh::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job->generation(), 0);

  std::ofstream(release).put('\n');
  const mesh::v1::Job done = WaitTerminal(id);
  EXPECT_EQ(done.state(), mesh::v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.restarts(), 0);
}

TEST_F(JobsProcessTest, Kill9OfAnAgentTakesItsWorkersAndFailsTheJobNamingTheNode) {
  const std::string id = Submit(ShellJob("sleep 300 & sleep 300"));
  ASSERT_TRUE(WaitForState(id, mesh::v1::JOB_STATE_RUNNING, absl::Seconds(20)));
  auto on_node1 = [&] {
    return ::mesh::testing::LiveProcessesWithEnv(
        {"MARKER=" + marker_, "MESH_JOB_ID=" + id, "GROUP_RANK=1"});
  };
  ASSERT_TRUE(Eventually(absl::Seconds(10), [&] { return on_node1().size() >= 4; }));

  agents_[1]->Signal(SIGKILL);
  ASSERT_TRUE(agents_[1]->Wait(absl::Seconds(10)).ok());
  EXPECT_TRUE(Eventually(absl::Seconds(5), [&] { return on_node1().empty(); }))
      << on_node1().size() << " processes of node-1 left";

  const mesh::v1::Job job = WaitTerminal(id, absl::Seconds(30));
  EXPECT_EQ(job.state(), mesh::v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.root_cause().node(), "node-1");
  EXPECT_THAT(job.root_cause().message(), HasSubstr("node-1"));
  // The other node's workers were killed when the job failed.
  EXPECT_TRUE(Eventually(absl::Seconds(10), [&] { return JobProcesses(id).empty(); }));
}

TEST_F(JobsProcessTest, InvalidSpecIsRejectedAndNothingIsStored) {
  mesh::v1::JobSpec spec = ShellJob("true");
  (*spec.mutable_env())["LD_PRELOAD"] = "/tmp/evil.so";
  mesh::v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  mesh::v1::SubmitJobResponse response;
  const grpc::Status status = jobs_->SubmitJob(Context().get(), request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("LD_PRELOAD"));

  // Through meshctl: refused by the coordinator (exit 4), the field named.
  auto [code, out] = Meshctl({"submit", "--nodes", "0", "--", "/bin/true"});
  EXPECT_EQ(code, 4) << out;

  // Nothing stored, even across a restart.
  const int port = std::stoi(address_.substr(address_.rfind(':') + 1));
  coordinator_->Signal(SIGKILL);
  ASSERT_TRUE(coordinator_->Wait(absl::Seconds(10)).ok());
  coordinator_.reset();
  StartCoordinator(port);
  mesh::v1::ListJobsRequest list;
  mesh::v1::ListJobsResponse jobs;
  ASSERT_TRUE(jobs_->ListJobs(Context().get(), list, &jobs).ok());
  EXPECT_EQ(jobs.jobs_size(), 0);
}

}  // namespace jobs_process_test
}  // namespace mesh
