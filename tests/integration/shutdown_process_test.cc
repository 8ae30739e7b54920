// Graceful shutdown with the real binaries on 127.0.0.1 (docs/limits.md,
// "Graceful shutdown"):
//   - SIGTERM to mesh-coordinator ends every pending wait (a Join, a KvWait
//     on a missing key, a Barrier not every rank reaches, a WaitJob) with
//     UNAVAILABLE at once, long before their own deadlines; new calls are
//     refused; the process exits 0 within the shutdown grace plus a margin;
//     and a job acknowledged just before SIGTERM is there after a restart on
//     the same state directory.
//   - An agent leaves its workers running when the coordinator is stopped
//     with SIGTERM, and the job completes once the coordinator is back.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
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
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "mesh/v1/admin.grpc.pb.h"
#include "mesh/v1/job.grpc.pb.h"
#include "mesh/v1/worker.grpc.pb.h"
#include "tests/common/http_get.h"
#include "tests/util/cluster_queries.h"
#include "tests/util/mesh_cluster.h"
#include "tests/util/pending_call.h"
#include "tests/util/proc.h"
#include "tests/util/subprocess.h"

namespace mesh {
namespace shutdown_process_test {

using ::mesh::testing::ContextWithDeadline;
using ::mesh::testing::ExitCode;
using ::mesh::testing::MakeTempDir;
using ::mesh::testing::RankOf;
using ::mesh::testing::Subprocess;
using ::testing::HasSubstr;
using namespace mesh::v1;  // NOLINT

// --shutdown-grace of the coordinator under test, and how much longer its
// exit may take (process teardown, a loaded machine).
constexpr absl::Duration kGrace = absl::Seconds(2);
constexpr absl::Duration kExitMargin = absl::Seconds(5);
// The pending calls' own deadlines: far beyond anything a shutdown takes.
constexpr absl::Duration kWaitDeadline = absl::Seconds(120);

// {"--insecure"} when `binary --help` lists that flag, else {}: plaintext
// on loopback needs it once the binaries default to TLS, and is an unknown
// flag before.
std::vector<std::string> PlaintextFlags(const std::string& binary) {
  auto process = Subprocess::Start({binary, "--help"});
  EXPECT_TRUE(process.ok()) << process.status();
  if (!process.ok()) return {};
  bool listed = false;
  for (;;) {
    auto line = process->ReadLine(absl::Seconds(20));
    if (!line.ok()) break;
    listed |= absl::StrContains(*line, "--insecure");
  }
  EXPECT_TRUE(process->Wait(absl::Seconds(20)).ok());
  return listed ? std::vector<std::string>{"--insecure"} : std::vector<std::string>{};
}

class ShutdownProcessTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeTempDir("mesh-shutdown-test"); }

  void TearDown() override {
    agent_.reset();
    coordinator_.reset();
    std::system(absl::StrCat("rm -rf '", dir_, "'").c_str());
  }

  // Starts mesh-coordinator on `port` (0: any) with a state directory and
  // /metrics; connects the stubs.
  void StartCoordinator(int port) {
    std::vector<std::string> argv = {
        MESH_COORDINATOR_BIN, "--listen", "127.0.0.1", "--port", absl::StrCat(port), "--state-dir",
        dir_ + "/state", "--shutdown-grace", absl::StrCat(absl::ToDoubleSeconds(kGrace)),
        // Node timeout above the agent's 5 s reconnect backoff cap; our ranks
        // never heartbeat, and must not be declared dead mid-test.
        "--node-heartbeat-interval", "0.2", "--node-heartbeat-timeout", "10", "--heartbeat-timeout",
        "300", "--metrics-port", "0", "--sd-file", dir_ + "/targets.json"};
    for (const std::string& flag : PlaintextFlags(MESH_COORDINATOR_BIN)) argv.push_back(flag);
    auto started = ::mesh::testing::StartCoordinatorProcess(argv);
    ASSERT_TRUE(started.ok()) << started.status();
    address_ = started->address;
    port_ = started->port;
    coordinator_ = std::move(started->process);
    channel_ = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
    workers_ = WorkerService::NewStub(channel_);
    admin_ = AdminService::NewStub(channel_);
    jobs_ = JobService::NewStub(channel_);
  }

  void StartAgent() {
    std::vector<std::string> argv = {MESH_AGENT_BIN,
                                     "--coordinator",
                                     address_,
                                     "--name",
                                     "node-0",
                                     "--address",
                                     "127.0.0.1",
                                     "--slots",
                                     "2",
                                     "--gpus",
                                     "none",
                                     "--work-dir",
                                     dir_ + "/agent-0",
                                     "--grace",
                                     "1",
                                     "--unowned-job-user",
                                     mesh::testing::CurrentUserName()};
    for (const std::string& flag : PlaintextFlags(MESH_AGENT_BIN)) argv.push_back(flag);
    auto process = Subprocess::Start(argv);
    ASSERT_TRUE(process.ok()) << process.status();
    agent_ = std::make_unique<Subprocess>(*std::move(process));
  }

  // mesh_coordinator_pending_waits from the coordinator's /metrics, whose
  // port is the first target of the service-discovery file; -1 when either
  // cannot be read yet.
  int PendingWaits() {
    std::ifstream file(dir_ + "/targets.json");
    std::stringstream text;
    text << file.rdbuf();
    const std::string sd = text.str();
    const size_t at = sd.find("127.0.0.1:");
    if (at == std::string::npos) return -1;
    int metrics_port = 0;
    const std::string digits = sd.substr(at + 10, sd.find('"', at) - at - 10);
    if (!absl::SimpleAtoi(digits, &metrics_port)) return -1;
    auto reply = ::mesh::testing::HttpGet(metrics_port, "/metrics", absl::Seconds(5));
    if (!reply.ok() || reply->status != 200) return -1;
    for (absl::string_view line : absl::StrSplit(reply->body, '\n')) {
      if (!absl::ConsumePrefix(&line, "mesh_coordinator_pending_waits ")) continue;
      double value = -1;
      return absl::SimpleAtod(line, &value) ? static_cast<int>(value) : -1;
    }
    return -1;
  }

  void CreateJob(const std::string& id, int world_size) {
    const absl::Status status = ::mesh::testing::CreateBareJob(*admin_, id, world_size);
    ASSERT_TRUE(status.ok()) << status;
  }

  grpc::Status Join(const RankContext& rank, absl::Duration timeout) {
    return ::mesh::testing::JoinRank(*workers_, rank, timeout);
  }

  JobSpec ShellJob(const std::string& script, int nproc) {
    return ::mesh::testing::ShellJobSpec(script, /*nodes=*/1, nproc, marker_);
  }

  int ReadyNodes() { return ::mesh::testing::ReadyNodes(*jobs_).value_or(-1); }

  std::string dir_;
  std::string address_;
  int port_ = 0;
  std::string marker_ =
      absl::StrCat("shutdown-process-test-", getpid(), "-", absl::ToUnixNanos(absl::Now()));
  std::unique_ptr<Subprocess> coordinator_;
  std::unique_ptr<Subprocess> agent_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<WorkerService::Stub> workers_;
  std::unique_ptr<AdminService::Stub> admin_;
  std::unique_ptr<JobService::Stub> jobs_;
};

using PendingCall = ::mesh::testing::PendingCall<grpc::Status>;

TEST_F(ShutdownProcessTest, SigtermEndsPendingWaitsRefusesCallsExitsZeroAndKeepsCommittedJobs) {
  StartCoordinator(/*port=*/0);

  // kv: one rank, joined; barrier: two ranks, both joined; join: two ranks,
  // only rank 0 comes.
  CreateJob("kv", 1);
  ASSERT_TRUE(Join(RankOf("kv", 0), absl::Seconds(10)).ok());
  CreateJob("barrier", 2);
  {
    PendingCall other([&] { return Join(RankOf("barrier", 1), absl::Seconds(10)); });
    ASSERT_TRUE(Join(RankOf("barrier", 0), absl::Seconds(10)).ok());
  }
  CreateJob("join", 2);
  // Acknowledged before SIGTERM: PENDING, as no agent runs.
  const absl::StatusOr<Job> acknowledged = ::mesh::testing::SubmitJob(*jobs_, ShellJob("true", 1));
  ASSERT_TRUE(acknowledged.ok()) << acknowledged.status();
  const std::string job_id = acknowledged->id();

  std::vector<std::unique_ptr<PendingCall>> calls;
  calls.push_back(std::make_unique<PendingCall>([&] {
    WaitJobRequest request;
    request.set_job_id(job_id);
    request.set_timeout_seconds(absl::ToDoubleSeconds(kWaitDeadline));
    WaitJobResponse response;
    return jobs_->WaitJob(ContextWithDeadline(kWaitDeadline).get(), request, &response);
  }));
  calls.push_back(std::make_unique<PendingCall>([&] {
    KvWaitRequest request;
    *request.mutable_context() = RankOf("kv", 0);
    request.add_keys("never-set");
    request.set_timeout_seconds(absl::ToDoubleSeconds(kWaitDeadline));
    KvWaitResponse response;
    return workers_->KvWait(ContextWithDeadline(kWaitDeadline).get(), request, &response);
  }));
  calls.push_back(std::make_unique<PendingCall>([&] {
    BarrierRequest request;
    *request.mutable_context() = RankOf("barrier", 0);
    request.set_name("rank-1-never-comes");
    request.set_timeout_seconds(absl::ToDoubleSeconds(kWaitDeadline));
    BarrierResponse response;
    return workers_->Barrier(ContextWithDeadline(kWaitDeadline).get(), request, &response);
  }));
  calls.push_back(
      std::make_unique<PendingCall>([&] { return Join(RankOf("join", 0), kWaitDeadline); }));
  // The join, KV wait and barrier are parked on the server (WaitJob has no
  // gauge; it was sent first).
  ASSERT_TRUE(::mesh::testing::WaitUntil([&] { return PendingWaits() == 3; }, absl::Seconds(20)))
      << "pending waits: " << PendingWaits();
  for (auto& call : calls) ASSERT_FALSE(call->ended()) << call->status().error_message();

  const absl::Time sigterm = absl::Now();
  coordinator_->Signal(SIGTERM);
  ASSERT_TRUE(::mesh::testing::WaitUntil(
      [&] {
        for (auto& call : calls) {
          if (!call->ended()) return false;
        }
        return true;
      },
      kGrace + kExitMargin));
  for (size_t i = 0; i < calls.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("call ", i));
    const grpc::Status status = calls[i]->status();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
    // Ended by the server's shutdown, not by a dropped connection.
    EXPECT_THAT(status.error_message(), HasSubstr("shutting down"));
    // At once: not after the grace, let alone their own deadline.
    EXPECT_LT(calls[i]->ended_at() - sigterm, kGrace);
  }

  // A new call once shutdown has begun is refused, quickly: UNAVAILABLE
  // from the services, or CANCELLED from gRPC itself when the call reaches
  // a server that is already closing (see docs/limits.md).
  KvSetRequest set;
  *set.mutable_context() = RankOf("kv", 0);
  set.set_key("late");
  set.set_value("v");
  KvSetResponse set_response;
  const absl::Time before_late = absl::Now();
  const grpc::Status late =
      workers_->KvSet(ContextWithDeadline(kWaitDeadline).get(), set, &set_response);
  EXPECT_THAT(late.error_code(),
              ::testing::AnyOf(grpc::StatusCode::UNAVAILABLE, grpc::StatusCode::CANCELLED))
      << late.error_message();
  EXPECT_LT(absl::Now() - before_late, kGrace + absl::Seconds(1));
  SubmitJobRequest submit;
  *submit.mutable_spec() = ShellJob("true", 1);
  SubmitJobResponse submitted;
  EXPECT_THAT(jobs_->SubmitJob(ContextWithDeadline().get(), submit, &submitted).error_code(),
              ::testing::AnyOf(grpc::StatusCode::UNAVAILABLE, grpc::StatusCode::CANCELLED));

  auto exited = coordinator_->Wait(kGrace + kExitMargin - (absl::Now() - sigterm));
  ASSERT_TRUE(exited.ok()) << "still running " << absl::Now() - sigterm << " after SIGTERM";
  EXPECT_EQ(ExitCode(*exited), 0);
  coordinator_.reset();

  // The acknowledged job survived; the refused one was never stored.
  StartCoordinator(port_);
  const absl::StatusOr<Job> job = ::mesh::testing::GetJob(*jobs_, job_id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), JOB_STATE_PENDING);
  EXPECT_EQ(job->spec().command(2), "true");
  ListJobsRequest list;
  ListJobsResponse listed;
  ASSERT_TRUE(jobs_->ListJobs(ContextWithDeadline().get(), list, &listed).ok());
  EXPECT_EQ(listed.jobs_size(), 1);
}

TEST_F(ShutdownProcessTest, AgentKeepsWorkersRunningThroughCoordinatorSigtermAndRestart) {
  StartCoordinator(/*port=*/0);
  StartAgent();
  ASSERT_TRUE(::mesh::testing::WaitUntil([&] { return ReadyNodes() == 1; }, absl::Seconds(20)));
  const std::string release = dir_ + "/release";
  const absl::StatusOr<Job> submitted = ::mesh::testing::SubmitJob(
      *jobs_,
      ShellJob(absl::StrCat("while [ ! -e '", release, "' ]; do sleep 0.1; done; echo done $RANK"),
               2));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string id = submitted->id();
  ASSERT_TRUE(::mesh::testing::WaitForState(*jobs_, id, JOB_STATE_RUNNING, absl::Seconds(20)));
  // The two worker shells: the agent's children. Their short-lived `sleep`
  // children share the environment (and are called "sh" too between fork
  // and exec), so they are told apart by their parent.
  auto workers = [&] {
    std::vector<pid_t> shells;
    for (pid_t pid :
         ::mesh::testing::LiveProcessesWithEnv({"MARKER=" + marker_, "MESH_JOB_ID=" + id})) {
      if (::mesh::testing::ParentOf(pid) == agent_->pid()) shells.push_back(pid);
    }
    return shells;
  };
  ASSERT_TRUE(::mesh::testing::WaitUntil([&] { return workers().size() == 2; }, absl::Seconds(10)));
  const std::vector<pid_t> before = workers();

  coordinator_->Signal(SIGTERM);
  auto exited = coordinator_->Wait(kGrace + kExitMargin);
  ASSERT_TRUE(exited.ok()) << exited.status();
  EXPECT_EQ(ExitCode(*exited), 0);
  coordinator_.reset();

  // With no coordinator for a while (the agent retries in the meantime),
  // the same workers run on: none exits.
  EXPECT_FALSE(::mesh::testing::WaitUntil([&] { return workers() != before; }, absl::Seconds(3)))
      << workers().size() << " of " << before.size() << " workers left";
  ASSERT_TRUE(agent_->Wait(absl::ZeroDuration()).status().code() ==
              absl::StatusCode::kDeadlineExceeded)
      << "the agent exited";

  StartCoordinator(port_);
  ASSERT_TRUE(::mesh::testing::WaitUntil([&] { return ReadyNodes() == 1; }, absl::Seconds(20)));
  EXPECT_EQ(workers(), before);
  std::ofstream(release).put('\n');

  const absl::StatusOr<Job> done = ::mesh::testing::WaitTerminal(*jobs_, id, absl::Seconds(60));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done->restarts(), 0);
  EXPECT_EQ(done->generation(), 0);
}

}  // namespace shutdown_process_test
}  // namespace mesh
