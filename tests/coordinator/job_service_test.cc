// JobService through a real in-process CoordinatorServer on 127.0.0.1:0,
// with a FakeClock and the test playing the agents: submit, schedule,
// launch, run, succeed, cancel, restart, waits, watches and a restart of the
// coordinator over the same state directory.
#include "coordinator/job_service.h"

#include <sys/stat.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "tests/coordinator/job_rpc_test_util.h"

namespace mesh::coordinator::testing {
namespace job_service_test {

using namespace mesh::v1;  // NOLINT
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;

class JobServiceTest : public JobRpcTest {
 protected:
  void SetUp() override { StartServer(); }

  ListJobsResponse List() {
    ListJobsRequest request;
    ListJobsResponse response;
    grpc::Status status = jobs_->ListJobs(Context().get(), request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }

  // A watch known to be in place: it replays the recorded transitions and
  // has delivered the one into `state` (the job's current state).
  std::unique_ptr<StreamReader<WatchJobStateResponse>> WatchFrom(const std::string& id,
                                                                 JobState state) {
    auto watch = WatchState(id, /*replay=*/true);
    std::optional<WatchJobStateResponse> event;
    do {
      event = watch->Next();
    } while (event.has_value() && event->event().to() != state);
    EXPECT_TRUE(event.has_value()) << "no transition to " << JobState_Name(state);
    return watch;
  }

  // Starts WaitJob asynchronously; `done` is notified with its outcome.
  struct PendingWait {
    grpc::ClientContext ctx;
    WaitJobRequest request;
    WaitJobResponse response;
    grpc::Status status;
    absl::Notification done;
  };
  std::unique_ptr<PendingWait> StartWait(const std::string& job_id, double timeout_seconds) {
    auto wait = std::make_unique<PendingWait>();
    wait->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    wait->request.set_job_id(job_id);
    wait->request.set_timeout_seconds(timeout_seconds);
    PendingWait* w = wait.get();
    jobs_->async()->WaitJob(&w->ctx, &w->request, &w->response, [w](grpc::Status status) {
      w->status = std::move(status);
      w->done.Notify();
    });
    return wait;
  }
};

TEST_F(JobServiceTest, InvalidSpecIsInvalidArgumentNamingTheFieldAndStoresNothing) {
  JobSpec spec = Spec(1, 2);
  spec.clear_command();
  auto job = Submit(spec);
  ASSERT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument) << job.status();
  EXPECT_THAT(std::string(job.status().message()), StartsWith("spec.command"));

  JobSpec bad_env = Spec(1, 2);
  (*bad_env.mutable_env())["LD_PRELOAD"] = "/evil.so";
  auto second = Submit(bad_env);
  ASSERT_EQ(second.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("LD_PRELOAD"));

  JobSpec bad_hang = Spec(1, 2);
  bad_hang.set_hang_timeout_seconds(-1);
  auto third = Submit(bad_hang);
  ASSERT_EQ(third.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(third.status().message()), StartsWith("spec.hang_timeout_seconds"));
  JobSpec bad_policy = Spec(1, 2);
  bad_policy.set_on_hang(static_cast<HangPolicy>(9));
  auto fourth = Submit(bad_policy);
  ASSERT_EQ(fourth.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(fourth.status().message()), StartsWith("spec.on_hang"));

  // job.proto: memory_per_proc_bytes 0 or 1 MiB .. 16 TiB; max_pids 0..4194304.
  for (int64_t bytes : {int64_t{-1}, int64_t{(1 << 20) - 1}, (int64_t{16} << 40) + 1}) {
    JobSpec bad_memory = Spec(1, 2);
    bad_memory.set_memory_per_proc_bytes(bytes);
    auto refused = Submit(bad_memory);
    ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bytes;
    EXPECT_THAT(std::string(refused.status().message()),
                StartsWith(absl::StrCat("spec.memory_per_proc_bytes: ", bytes)));
  }
  for (int64_t pids : {int64_t{-1}, int64_t{4194305}}) {
    JobSpec bad_pids = Spec(1, 2);
    bad_pids.set_max_pids(pids);
    auto refused = Submit(bad_pids);
    ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << pids;
    EXPECT_THAT(std::string(refused.status().message()),
                StartsWith(absl::StrCat("spec.max_pids: ", pids)));
  }

  EXPECT_THAT(List().jobs(), IsEmpty());
}

TEST_F(JobServiceTest, LimitsAtTheirBoundsAreStoredAndComeBack) {
  JobSpec spec = Spec(1, 2);
  spec.set_memory_per_proc_bytes(int64_t{1} << 20);
  spec.set_max_pids(4194304);
  auto job = Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().memory_per_proc_bytes(), int64_t{1} << 20);
  EXPECT_EQ(job->spec().max_pids(), 4194304);
  JobSpec top = Spec(1, 2);
  top.set_memory_per_proc_bytes(int64_t{16} << 40);
  auto second = Submit(top);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->spec().memory_per_proc_bytes(), int64_t{16} << 40);
  EXPECT_EQ(second->spec().max_pids(), 0);
  // GetJob reads them back from the store.
  EXPECT_EQ(GetJob(job->id()).spec().memory_per_proc_bytes(), int64_t{1} << 20);
  EXPECT_EQ(GetJob(job->id()).spec().max_pids(), 4194304);
}

// A denied env name (LD_LIBRARY_PATH) is INVALID_ARGUMENT naming the field
// and the operator's flag, until the coordinator's operator allows it
// (mesh-coordinator --allow-job-env); then it is stored and comes back.
TEST_F(JobServiceTest, ADeniedEnvNameNeedsTheOperatorsAllowJobEnv) {
  JobSpec spec = Spec(1, 2);
  (*spec.mutable_env())["LD_LIBRARY_PATH"] = "/opt/conda/lib";
  auto refused = Submit(spec);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              StartsWith("spec.env[\"LD_LIBRARY_PATH\"]: denied: "));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("--allow-job-env"));
  EXPECT_THAT(List().jobs(), IsEmpty());

  StopServer();
  configure_ = [](CoordinatorConfig& config) {
    config.jobs.spec_limits.allowed_job_env = {"LD_LIBRARY_PATH"};
  };
  StartServer();
  ASSERT_NE(server_, nullptr);
  auto job = Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(GetJob(job->id()).spec().env().at("LD_LIBRARY_PATH"), "/opt/conda/lib");
  // Only the listed name: LD_PRELOAD stays refused.
  (*spec.mutable_env())["LD_PRELOAD"] = "/x.so";
  auto other = Submit(spec);
  ASSERT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument) << other.status();
  EXPECT_THAT(std::string(other.status().message()), StartsWith("spec.env[\"LD_PRELOAD\"]"));
}

// A coordinator cannot start with an allow list naming a reserved or
// malformed name.
TEST_F(JobServiceTest, AnAllowListWithAReservedNameDoesNotStart) {
  StopServer();
  for (const char* name : {"RANK", "MESH_TOKEN", "", "PATH"}) {
    CoordinatorConfig config;
    config.port = 0;
    config.clock = &clock_;
    config.run_ticker = false;
    config.jobs.spec_limits.allowed_job_env = {"LD_LIBRARY_PATH", name};
    auto server = CoordinatorServer::Start(config);
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(std::string(server.status().message()), HasSubstr("--allow-job-env")) << name;
  }
}

// What the agent knows beyond the exit status reaches the root cause: the
// loader's message for exit code 127, and an OOM kill.
TEST_F(JobServiceTest, TheAgentsDetailAndOomKillAreInTheRootCause) {
  auto agent = Register("node-a", "10.0.0.5", 4);
  ASSERT_NE(agent, nullptr);
  auto job = Submit(Spec(1, 2, /*max_restarts=*/1));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(agent->orders->Next()->action(), Assignment::ACTION_LAUNCH);
  ASSERT_TRUE(Started(*agent, job->id(), 0, {0, 1}).ok());

  ReportWorkerExitRequest missing_lib;
  missing_lib.set_job_id(job->id());
  missing_lib.set_generation(0);
  missing_lib.set_rank(0);
  missing_lib.set_exit_code(127);
  missing_lib.set_detail(
      "error while loading shared libraries: libfoo.so.1: cannot open shared object file: No "
      "such file or directory");
  ASSERT_TRUE(ReportExit(*agent, missing_lib).ok());
  Job now = GetJob(job->id());
  EXPECT_EQ(now.generation(), 1);
  EXPECT_EQ(now.root_cause().exit_code(), 127);
  EXPECT_FALSE(now.root_cause().oom_killed());
  EXPECT_EQ(now.root_cause().message(),
            "rank 0 (node node-a) exited with code 127: error while loading shared libraries: "
            "libfoo.so.1: cannot open shared object file: No such file or directory");

  ASSERT_TRUE(Started(*agent, job->id(), 1, {0, 1}).ok());
  ReportWorkerExitRequest oom;
  oom.set_job_id(job->id());
  oom.set_generation(1);
  oom.set_rank(1);
  oom.set_signal(9);
  oom.set_oom_killed(true);
  oom.set_detail("killed by the kernel: out of memory (memory limit 8 GiB)");
  ASSERT_TRUE(ReportExit(*agent, oom).ok());
  now = GetJob(job->id());
  EXPECT_EQ(now.state(), JOB_STATE_FAILED);
  EXPECT_EQ(now.root_cause().rank(), 1);
  EXPECT_EQ(now.root_cause().signal(), 9);
  EXPECT_TRUE(now.root_cause().oom_killed());
  EXPECT_EQ(now.root_cause().message(),
            "rank 1 (node node-a) was killed by the kernel: out of memory (memory limit 8 GiB)");
}

// job.proto: hang_timeout_seconds 0 and on_hang UNSPECIFIED are normalized
// to the values in force.
TEST_F(JobServiceTest, HangSettingsAreNormalizedToTheirDefaults) {
  auto job = Submit(Spec(1, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().hang_timeout_seconds(), 300);
  EXPECT_EQ(job->spec().on_hang(), HANG_POLICY_RESTART);
  JobSpec set = Spec(1, 2);
  set.set_hang_timeout_seconds(42);
  set.set_on_hang(HANG_POLICY_FAIL);
  auto second = Submit(set);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->spec().hang_timeout_seconds(), 42);
  EXPECT_EQ(second->spec().on_hang(), HANG_POLICY_FAIL);
}

// docs/elastic.md through the RPCs: grow is normalized and checked, and a
// lost node of an elastic job shrinks it without counting a restart, the
// resize in GetJob with its reason.
TEST_F(JobServiceTest, AnElasticJobShrinksOnALostNodeAndGetJobShowsTheResize) {
  JobSpec fixed = Spec(2, 2);
  fixed.set_grow(GROW_POLICY_ON_RESTART);
  auto refused = Submit(fixed);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), StartsWith("spec.grow: "));

  auto a = Register("node-a", "10.0.0.1", 2);
  auto b = Register("node-b", "10.0.0.2", 2);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  JobSpec elastic = Spec(1, 2);  // max_restarts 0: only a resize keeps it alive.
  elastic.mutable_nodes()->set_max(2);
  auto job = Submit(elastic);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().grow(), GROW_POLICY_NEVER);
  EXPECT_THAT(job->nodes(), ElementsAre("node-a", "node-b"));
  ASSERT_TRUE(Started(*a, job->id(), 0, {0, 1}).ok());
  ASSERT_TRUE(Started(*b, job->id(), 0, {2, 3}).ok());

  // node-a heartbeats through NodeService; node-b falls silent.
  for (int i = 0; i < 4; ++i) {
    NodeHeartbeatRequest beat;
    beat.set_name(a->name);
    beat.set_session_id(a->session);
    NodeHeartbeatResponse beat_reply;
    ASSERT_TRUE(nodes_->NodeHeartbeat(Context().get(), beat, &beat_reply).ok());
    clock_.Advance(absl::Seconds(5));
    server_->jobs().Tick();
  }

  const Job now = GetJob(job->id());
  EXPECT_EQ(now.state(), JOB_STATE_SCHEDULED);
  EXPECT_EQ(now.generation(), 1);
  EXPECT_EQ(now.restarts(), 0);
  EXPECT_THAT(now.nodes(), ElementsAre("node-a"));
  EXPECT_EQ(now.root_cause().node(), "node-b");
  ASSERT_EQ(now.resizes_size(), 1);
  EXPECT_EQ(now.resizes(0).from_nodes(), 2);
  EXPECT_EQ(now.resizes(0).to_nodes(), 1);
  EXPECT_EQ(now.resizes(0).generation(), 1);
  EXPECT_THAT(now.resizes(0).reason(), HasSubstr("node node-b lost"));
}

TEST_F(JobServiceTest, ValidSpecIsPendingWithAReasonUntilANodeRegisters) {
  auto job = Submit(Spec(1, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_FALSE(job->id().empty());
  EXPECT_EQ(job->state(), JOB_STATE_PENDING);
  EXPECT_THAT(job->pending_reason(), Not(IsEmpty()));
  EXPECT_EQ(job->generation(), 0);

  const ListJobsResponse listed = List();
  ASSERT_EQ(listed.jobs_size(), 1);
  EXPECT_EQ(listed.jobs(0).id(), job->id());
  EXPECT_EQ(listed.jobs(0).state(), JOB_STATE_PENDING);

  GetJobRequest request;
  request.set_job_id("job-404");
  GetJobResponse response;
  EXPECT_EQ(jobs_->GetJob(Context().get(), request, &response).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(JobServiceTest, JobRunsToSuccessThroughLaunchStartAndExits) {
  auto job = Submit(Spec(1, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  auto wait = StartWait(job->id(), 0);  // The server's maximum wait.
  auto watch = WatchState(job->id(), /*replay=*/true);

  auto agent = Register("node-a", "10.0.0.5", 4);
  ASSERT_NE(agent, nullptr);
  auto launch = agent->orders->Next();
  ASSERT_TRUE(launch.has_value());
  EXPECT_EQ(launch->action(), Assignment::ACTION_LAUNCH);
  EXPECT_EQ(launch->job_id(), job->id());
  EXPECT_EQ(launch->generation(), 0);
  EXPECT_EQ(launch->world_size(), 2);
  EXPECT_EQ(launch->num_nodes(), 1);
  EXPECT_EQ(launch->node_rank(), 0);
  EXPECT_EQ(launch->local_world_size(), 2);
  EXPECT_EQ(launch->master_addr(), "10.0.0.5");
  EXPECT_GT(launch->master_port(), 0);
  EXPECT_THAT(launch->command(), ElementsAre("/usr/bin/python3", "train.py"));
  ASSERT_EQ(launch->ranks_size(), 2);
  EXPECT_EQ(launch->ranks(0).rank(), 0);
  EXPECT_EQ(launch->ranks(0).local_rank(), 0);
  EXPECT_EQ(launch->ranks(1).rank(), 1);
  EXPECT_EQ(launch->ranks(1).local_rank(), 1);

  Job scheduled = GetJob(job->id());
  EXPECT_EQ(scheduled.state(), JOB_STATE_SCHEDULED);
  EXPECT_THAT(scheduled.nodes(), ElementsAre("node-a"));

  ASSERT_TRUE(Started(*agent, job->id(), 0, {0, 1}).ok());
  EXPECT_EQ(GetJob(job->id()).state(), JOB_STATE_RUNNING);
  EXPECT_FALSE(wait->done.HasBeenNotified());

  ASSERT_TRUE(Exited(*agent, job->id(), 0, 0, 0).ok());
  EXPECT_EQ(GetJob(job->id()).state(), JOB_STATE_RUNNING);
  ASSERT_TRUE(Exited(*agent, job->id(), 0, 1, 0).ok());

  ASSERT_TRUE(wait->done.WaitForNotificationWithTimeout(kWait));
  ASSERT_TRUE(wait->status.ok()) << wait->status.error_message();
  EXPECT_EQ(wait->response.job().state(), JOB_STATE_SUCCEEDED);
  EXPECT_EQ(wait->response.job().id(), job->id());
  EXPECT_THAT(wait->response.job().events(), Not(IsEmpty()));

  // The replay and the live transitions, in order, then OK.
  std::vector<JobState> states;
  while (auto event = watch->Next()) {
    EXPECT_EQ(event->event().to(), event->job().state());
    states.push_back(event->event().to());
  }
  auto status = watch->Status();
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->ok()) << status->error_message();
  ASSERT_GE(states.size(), 4u);
  EXPECT_EQ(states.front(), JOB_STATE_PENDING);
  EXPECT_THAT(std::vector<JobState>(states.end() - 3, states.end()),
              ElementsAre(JOB_STATE_SCHEDULED, JOB_STATE_RUNNING, JOB_STATE_SUCCEEDED));

  // The agent is told to forget the job.
  auto kill = agent->orders->Next();
  ASSERT_TRUE(kill.has_value());
  EXPECT_EQ(kill->action(), Assignment::ACTION_KILL);
  EXPECT_EQ(kill->job_id(), job->id());

  // A watch of a terminal job replays and ends at once.
  auto late = WatchState(job->id(), /*replay=*/true);
  auto late_status = late->Status();
  ASSERT_TRUE(late_status.has_value());
  EXPECT_TRUE(late_status->ok());
  EXPECT_EQ(late->Rest().back().job().state(), JOB_STATE_SUCCEEDED);
}

TEST_F(JobServiceTest, CancelSendsKillAndEndsTheWatch) {
  auto agent = Register("node-a", "10.0.0.5", 4);
  ASSERT_NE(agent, nullptr);
  auto job = Submit(Spec(1, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  auto launch = agent->orders->Next();
  ASSERT_TRUE(launch.has_value());
  ASSERT_EQ(launch->action(), Assignment::ACTION_LAUNCH);
  auto watch = WatchFrom(job->id(), JOB_STATE_SCHEDULED);

  CancelJobRequest request;
  request.set_job_id(job->id());
  request.set_reason("user asked");
  CancelJobResponse response;
  ASSERT_TRUE(jobs_->CancelJob(Context().get(), request, &response).ok());
  EXPECT_EQ(response.job().state(), JOB_STATE_CANCELLED);

  auto kill = agent->orders->Next();
  ASSERT_TRUE(kill.has_value());
  EXPECT_EQ(kill->action(), Assignment::ACTION_KILL);
  EXPECT_EQ(kill->job_id(), job->id());
  EXPECT_EQ(kill->generation(), 0);
  EXPECT_GT(kill->grace_period_seconds(), 0);

  auto event = watch->Next();
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->event().to(), JOB_STATE_CANCELLED);
  EXPECT_THAT(event->event().reason(), HasSubstr("user asked"));
  auto status = watch->Status();
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->ok()) << status->error_message();

  // Cancelling again returns the job as it is.
  ASSERT_TRUE(jobs_->CancelJob(Context().get(), request, &response).ok());
  EXPECT_EQ(response.job().state(), JOB_STATE_CANCELLED);
  request.set_job_id("job-404");
  EXPECT_EQ(jobs_->CancelJob(Context().get(), request, &response).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(JobServiceTest, FailedRankRestartsAtTheNextGenerationKillThenLaunch) {
  auto agent = Register("node-a", "10.0.0.5", 4);
  ASSERT_NE(agent, nullptr);
  auto job = Submit(Spec(1, 2, /*max_restarts=*/1));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(agent->orders->Next()->action(), Assignment::ACTION_LAUNCH);
  ASSERT_TRUE(Started(*agent, job->id(), 0, {0, 1}).ok());
  auto watch = WatchFrom(job->id(), JOB_STATE_RUNNING);

  ASSERT_TRUE(Exited(*agent, job->id(), 0, 1, 3).ok());

  auto kill = agent->orders->Next();
  ASSERT_TRUE(kill.has_value());
  EXPECT_EQ(kill->action(), Assignment::ACTION_KILL);
  EXPECT_EQ(kill->generation(), 0);
  auto relaunch = agent->orders->Next();
  ASSERT_TRUE(relaunch.has_value());
  EXPECT_EQ(relaunch->action(), Assignment::ACTION_LAUNCH);
  EXPECT_EQ(relaunch->generation(), 1);
  EXPECT_EQ(relaunch->restart_count(), 1);
  EXPECT_EQ(relaunch->ranks_size(), 2);

  auto restarting = watch->Next();
  ASSERT_TRUE(restarting.has_value());
  EXPECT_EQ(restarting->event().to(), JOB_STATE_RESTARTING);
  EXPECT_EQ(restarting->event().generation(), 1);
  auto scheduled = watch->Next();
  ASSERT_TRUE(scheduled.has_value());
  EXPECT_EQ(scheduled->event().to(), JOB_STATE_SCHEDULED);

  const Job now = GetJob(job->id());
  EXPECT_EQ(now.state(), JOB_STATE_SCHEDULED);
  EXPECT_EQ(now.generation(), 1);
  EXPECT_EQ(now.restarts(), 1);
  EXPECT_EQ(now.root_cause().rank(), 1);
  EXPECT_EQ(now.root_cause().exit_code(), 3);
  EXPECT_EQ(now.root_cause().node(), "node-a");

  // A late report for generation 0 is accepted and changes nothing.
  EXPECT_TRUE(Exited(*agent, job->id(), 0, 0, 1).ok());
  EXPECT_EQ(GetJob(job->id()).generation(), 1);
}

TEST_F(JobServiceTest, WaitJobTimesOutWithDeadlineExceeded) {
  auto job = Submit(Spec(1, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  auto wait = StartWait(job->id(), 5);
  // The wait runs on the fake clock and fires on a Tick; the call may reach
  // the server after any given Advance, so keep moving time until it ends.
  const absl::Time give_up = absl::Now() + kWait;
  while (!wait->done.WaitForNotificationWithTimeout(absl::Milliseconds(20)) &&
         absl::Now() < give_up) {
    clock_.Advance(absl::Seconds(6));
    server_->jobs().Tick();
  }
  ASSERT_TRUE(wait->done.HasBeenNotified());
  EXPECT_EQ(wait->status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << wait->status.error_message();

  auto unknown = StartWait("job-404", 5);
  ASSERT_TRUE(unknown->done.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(unknown->status.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(JobServiceTest, ShutdownEndsWaitsAndWatchesWithUnavailable) {
  auto job = Submit(Spec(1, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  auto wait = StartWait(job->id(), 0);
  auto watch = WatchState(job->id(), /*replay=*/true);
  ASSERT_TRUE(watch->Next().has_value());  // The replayed PENDING: the watch is in place.
  server_->Shutdown(absl::Seconds(1));
  ASSERT_TRUE(wait->done.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(wait->status.error_code(), grpc::StatusCode::UNAVAILABLE);
  auto status = watch->Status();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(JobServiceTest, WatchOfAnUnknownJobIsNotFound) {
  auto watch = WatchState("job-404", /*replay=*/true);
  auto status = watch->Status();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(JobServiceTest, ListNodesShowsRegisteredNodes) {
  auto b = Register("node-b", "10.0.0.6", 2);
  auto a = Register("node-a", "10.0.0.5", 4);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ListNodesRequest request;
  ListNodesResponse response;
  ASSERT_TRUE(jobs_->ListNodes(Context().get(), request, &response).ok());
  ASSERT_EQ(response.nodes_size(), 2);
  EXPECT_EQ(response.nodes(0).name(), "node-a");
  EXPECT_EQ(response.nodes(0).slots(), 4);
  EXPECT_EQ(response.nodes(0).state(), NODE_STATE_READY);
  EXPECT_EQ(response.nodes(1).name(), "node-b");
}

// A restart over the same state directory keeps the job, id and state.
class JobServiceDurability : public JobRpcTest {};

TEST_F(JobServiceDurability, RestartWithTheSameStateDirKeepsJobs) {
  const std::filesystem::path root =
      std::filesystem::path(::testing::TempDir()) /
      ("job_service_test_" + std::to_string(::getpid()) + "_" + std::to_string(std::rand()));
  const std::string state_dir = (root / "state").string();  // Neither exists yet.

  StartServer(state_dir);
  ASSERT_NE(server_, nullptr);
  JobSpec spec = Spec(1, 2);
  spec.set_memory_per_proc_bytes(int64_t{8} << 30);
  spec.set_max_pids(4096);
  auto job = Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  StopServer();

  struct stat info;
  ASSERT_EQ(::stat(state_dir.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0700u);
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(state_dir) / "coordinator.db"));

  StartServer(state_dir);
  ASSERT_NE(server_, nullptr);
  ListJobsRequest request;
  ListJobsResponse response;
  ASSERT_TRUE(jobs_->ListJobs(Context().get(), request, &response).ok());
  ASSERT_EQ(response.jobs_size(), 1);
  EXPECT_EQ(response.jobs(0).id(), job->id());
  EXPECT_EQ(response.jobs(0).state(), JOB_STATE_PENDING);
  // The per-worker limits survive the restart.
  EXPECT_EQ(GetJob(job->id()).spec().memory_per_proc_bytes(), int64_t{8} << 30);
  EXPECT_EQ(GetJob(job->id()).spec().max_pids(), 4096);
  // A new job gets a new id.
  auto next = Submit(Spec(1, 2));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_NE(next->id(), job->id());
  StopServer();
  std::filesystem::remove_all(root);
}

TEST_F(JobServiceDurability, StateDirThatIsAFileFailsToStart) {
  const std::filesystem::path file =
      std::filesystem::path(::testing::TempDir()) /
      ("job_service_test_file_" + std::to_string(::getpid()) + "_" + std::to_string(std::rand()));
  {
    std::FILE* f = std::fopen(file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
  }
  CoordinatorConfig config;
  config.port = 0;
  config.clock = &clock_;
  config.run_ticker = false;
  config.state_dir = file.string();
  auto server = CoordinatorServer::Start(config);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition) << server.status();
  std::filesystem::remove(file);
}

}  // namespace job_service_test
}  // namespace mesh::coordinator::testing
