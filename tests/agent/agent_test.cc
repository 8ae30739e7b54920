// Over 800 lines on purpose: the Agent end to end in process against a fake
// NodeService over real gRPC, its sections sharing one fixture (fake
// service, fake launcher, metrics). The agent's parts are tested alone in
// agent_session_test.cc and the other files of this folder.

// Agent against an in-process fake NodeService (gRPC callback service on
// 127.0.0.1:0) and a FakeLauncher that never forks.
#include "agent/agent.h"

#include <signal.h>
#include <unistd.h>

#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "agent/agent_main.h"
#include "common/version.h"
#include "mesh/v1/job.grpc.pb.h"
#include "tests/agent/fake_launcher.h"
#include "tests/common/test_metrics.h"

namespace mesh::agent {

using testing::EnvValue;
namespace agent_test {

using ::mesh::agent::testing::FakeLauncher;

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr absl::Duration kTimeout = absl::Seconds(10);

template <typename F>
bool WaitUntil(F done, absl::Duration timeout = kTimeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

// ---------------------------------------------------------------------------
// FakeNodeService: records everything, pushes orders, drops streams.
// ---------------------------------------------------------------------------
class FakeNodeService final : public v1::NodeService::CallbackService {
 public:
  class Watch;

  grpc::ServerUnaryReactor* RegisterNode(grpc::CallbackServerContext* context,
                                         const v1::RegisterNodeRequest* request,
                                         v1::RegisterNodeResponse* response) override {
    {
      absl::MutexLock lock(&mu_);
      if (!register_status_.ok()) return Reply(context, register_status_);
      registrations_.push_back(*request);
      session_ = absl::StrCat("session-", registrations_.size());
      response->set_session_id(session_);
      response->set_heartbeat_interval_seconds(0.05);
      response->set_heartbeat_timeout_seconds(5);
    }
    return Reply(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* NodeHeartbeat(grpc::CallbackServerContext* context,
                                          const v1::NodeHeartbeatRequest* request,
                                          v1::NodeHeartbeatResponse*) override {
    absl::MutexLock lock(&mu_);
    if (request->session_id() != session_) {
      return Reply(context, grpc::Status(grpc::StatusCode::ABORTED, "stale session"));
    }
    if (!heartbeat_status_.ok()) return Reply(context, heartbeat_status_);
    ++heartbeats_;
    return Reply(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ReportWorkersStarted(grpc::CallbackServerContext* context,
                                                 const v1::ReportWorkersStartedRequest* request,
                                                 v1::ReportWorkersStartedResponse*) override {
    absl::MutexLock lock(&mu_);
    started_.push_back(*request);
    return Reply(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ReportWorkerExit(grpc::CallbackServerContext* context,
                                             const v1::ReportWorkerExitRequest* request,
                                             v1::ReportWorkerExitResponse*) override {
    absl::MutexLock lock(&mu_);
    ++exit_attempts_;
    if (!exit_status_.ok()) return Reply(context, exit_status_);
    exits_.push_back(*request);
    return Reply(context, grpc::Status::OK);
  }

  grpc::ServerWriteReactor<v1::Assignment>* WatchAssignments(
      grpc::CallbackServerContext*, const v1::WatchAssignmentsRequest* request) override;

  grpc::ServerReadReactor<v1::UploadLogsRequest>* UploadLogs(grpc::CallbackServerContext*,
                                                             v1::UploadLogsResponse*) override;

  // Sends `order` on the open watch stream, waiting for one to be open.
  bool Push(const v1::Assignment& order);
  // Ends the open watch stream with `status`.
  bool Drop(grpc::Status status);

  void SetExitStatus(grpc::Status status) {
    absl::MutexLock lock(&mu_);
    exit_status_ = std::move(status);
  }
  void SetRegisterStatus(grpc::Status status) {
    absl::MutexLock lock(&mu_);
    register_status_ = std::move(status);
  }
  void SetHeartbeatStatus(grpc::Status status) {
    absl::MutexLock lock(&mu_);
    heartbeat_status_ = std::move(status);
  }

  // Snapshots.
  std::vector<v1::RegisterNodeRequest> registrations() const {
    absl::MutexLock lock(&mu_);
    return registrations_;
  }
  std::string session() const {
    absl::MutexLock lock(&mu_);
    return session_;
  }
  int heartbeats() const {
    absl::MutexLock lock(&mu_);
    return heartbeats_;
  }
  int exit_attempts() const {
    absl::MutexLock lock(&mu_);
    return exit_attempts_;
  }
  std::vector<v1::ReportWorkersStartedRequest> started() const {
    absl::MutexLock lock(&mu_);
    return started_;
  }
  std::vector<v1::ReportWorkerExitRequest> exits() const {
    absl::MutexLock lock(&mu_);
    return exits_;
  }
  std::vector<v1::UploadLogsRequest> upload_messages() const {
    absl::MutexLock lock(&mu_);
    return upload_messages_;
  }
  int uploads_finished() const {
    absl::MutexLock lock(&mu_);
    return uploads_finished_;
  }

 private:
  class Upload;

  static grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* context,
                                         grpc::Status status) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(std::move(status));
    return reactor;
  }

  mutable absl::Mutex mu_;
  std::vector<v1::RegisterNodeRequest> registrations_ ABSL_GUARDED_BY(mu_);
  std::string session_ ABSL_GUARDED_BY(mu_);
  int heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  int exit_attempts_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::Status exit_status_ ABSL_GUARDED_BY(mu_);
  grpc::Status register_status_ ABSL_GUARDED_BY(mu_);
  grpc::Status heartbeat_status_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::ReportWorkersStartedRequest> started_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::ReportWorkerExitRequest> exits_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::UploadLogsRequest> upload_messages_ ABSL_GUARDED_BY(mu_);
  int uploads_finished_ ABSL_GUARDED_BY(mu_) = 0;
  Watch* watch_ ABSL_GUARDED_BY(mu_) = nullptr;
};

// One WatchAssignments stream. Its state is guarded by the service's mu_;
// gRPC runs OnWriteDone/OnDone on its own threads, never inside
// StartWrite/Finish.
class FakeNodeService::Watch final : public grpc::ServerWriteReactor<v1::Assignment> {
 public:
  explicit Watch(FakeNodeService* service) : service_(service) {}

  void PushLocked(const v1::Assignment& order) {
    queue_.push_back(order);
    if (!writing_ && !finished_) {
      writing_ = true;
      StartWrite(&queue_.front());
    }
  }
  void FinishLocked(grpc::Status status) {
    if (finished_) return;
    finished_ = true;
    Finish(std::move(status));
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&service_->mu_);
    queue_.pop_front();
    writing_ = false;
    if (!ok) return FinishLocked(grpc::Status(grpc::StatusCode::UNKNOWN, "write failed"));
    if (!queue_.empty() && !finished_) {
      writing_ = true;
      StartWrite(&queue_.front());
    }
  }
  void OnCancel() override {
    absl::MutexLock lock(&service_->mu_);
    FinishLocked(grpc::Status::CANCELLED);
  }
  void OnDone() override {
    {
      absl::MutexLock lock(&service_->mu_);
      if (service_->watch_ == this) service_->watch_ = nullptr;
    }
    delete this;
  }

 private:
  FakeNodeService* const service_;
  std::deque<v1::Assignment> queue_;
  bool writing_ = false;
  bool finished_ = false;
};

class FakeNodeService::Upload final : public grpc::ServerReadReactor<v1::UploadLogsRequest> {
 public:
  explicit Upload(FakeNodeService* service) : service_(service) { StartRead(&message_); }
  void OnReadDone(bool ok) override {
    absl::MutexLock lock(&service_->mu_);
    if (!ok) {
      ++service_->uploads_finished_;
      Finish(grpc::Status::OK);
      return;
    }
    service_->upload_messages_.push_back(message_);
    StartRead(&message_);
  }
  void OnDone() override { delete this; }

 private:
  FakeNodeService* const service_;
  v1::UploadLogsRequest message_;
};

grpc::ServerWriteReactor<v1::Assignment>* FakeNodeService::WatchAssignments(
    grpc::CallbackServerContext*, const v1::WatchAssignmentsRequest* request) {
  auto* watch = new Watch(this);
  absl::MutexLock lock(&mu_);
  if (request->session_id() != session_) {
    watch->FinishLocked(grpc::Status(grpc::StatusCode::ABORTED, "stale session"));
    return watch;
  }
  if (watch_ != nullptr) watch_->FinishLocked(grpc::Status(grpc::StatusCode::ABORTED, "replaced"));
  watch_ = watch;
  return watch;
}

grpc::ServerReadReactor<v1::UploadLogsRequest>* FakeNodeService::UploadLogs(
    grpc::CallbackServerContext*, v1::UploadLogsResponse*) {
  return new Upload(this);
}

bool FakeNodeService::Push(const v1::Assignment& order) {
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(absl::Condition(
                                +[](Watch** w) { return *w != nullptr; }, &watch_),
                            kTimeout)) {
    return false;
  }
  watch_->PushLocked(order);
  return true;
}

bool FakeNodeService::Drop(grpc::Status status) {
  absl::MutexLock lock(&mu_);
  if (watch_ == nullptr) return false;
  watch_->FinishLocked(std::move(status));
  watch_ = nullptr;
  return true;
}

// ---------------------------------------------------------------------------
// Fixture.
// ---------------------------------------------------------------------------

v1::Assignment Launch(const std::string& job, int64_t generation, int nranks, bool gpus = false) {
  v1::Assignment order;
  order.set_action(v1::Assignment::ACTION_LAUNCH);
  order.set_job_id(job);
  order.set_generation(generation);
  order.add_command("/opt/train");
  order.add_command("--steps=10");
  (*order.mutable_env())["ZED"] = "last";
  (*order.mutable_env())["ALPHA"] = "first";
  order.set_world_size(nranks * 2);
  order.set_node_rank(1);
  order.set_num_nodes(2);
  order.set_local_world_size(nranks);
  order.set_master_addr("10.0.0.1");
  order.set_master_port(29500);
  order.set_restart_count(static_cast<int32_t>(generation));
  order.set_max_restarts(3);
  order.set_gpu_job(gpus);
  for (int i = 0; i < nranks; ++i) {
    v1::RankLaunch* rank = order.add_ranks();
    rank->set_rank(nranks + i);
    rank->set_local_rank(i);
    if (gpus) rank->add_gpus(i);
  }
  return order;
}

v1::Assignment Kill(const std::string& job, int64_t generation, double grace = 0) {
  v1::Assignment order;
  order.set_action(v1::Assignment::ACTION_KILL);
  order.set_job_id(job);
  order.set_generation(generation);
  order.set_grace_period_seconds(grace);
  return order;
}

bool HasEnv(const LaunchSpec& spec, const std::string& entry) {
  return std::find(spec.env.begin(), spec.env.end(), entry) != spec.env.end();
}

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/mesh-agent-test-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    work_dir_ = dir_template;
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    config_.coordinator = absl::StrCat("127.0.0.1:", port);
    config_.name = "node-a";
    config_.address = "127.0.0.1";
    config_.slots = 4;
    config_.gpus = {GpuDevice{0, "GPU-aaaa", "Test GPU", 1 << 30}, GpuDevice{1, "", "", 0}};
    config_.work_dir = work_dir_;
    config_.grace = absl::Seconds(1);
    config_.rpc_timeout = absl::Seconds(2);
    config_.backoff_initial = absl::Milliseconds(20);
    config_.backoff_max = absl::Milliseconds(200);
    config_.log_poll_interval = absl::Milliseconds(10);
    config_.base_env = {{"PATH", "/usr/bin:/bin"}};
  }
  void TearDown() override {
    if (agent_ != nullptr) agent_->Shutdown();
    agent_.reset();
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    std::filesystem::remove_all(work_dir_);
  }

  void StartAgent() {
    agent_ = std::make_unique<Agent>(config_, &launcher_, &registry_);
    ASSERT_TRUE(agent_->Start().ok());
    ASSERT_TRUE(WaitUntil([&] { return service_.registrations().size() == 1; }));
  }

  // Launches `order` and waits for its started report; returns the pids by
  // rank.
  std::map<int, pid_t> LaunchAndWait(const v1::Assignment& order) {
    const size_t before = service_.started().size();
    EXPECT_TRUE(service_.Push(order));
    EXPECT_TRUE(WaitUntil([&] { return service_.started().size() > before; }));
    std::map<int, pid_t> pids;
    auto started = service_.started();
    if (started.size() <= before) return pids;
    for (const v1::RunningWorker& w : started.back().workers()) pids[w.rank()] = w.pid();
    return pids;
  }

  std::string work_dir_;
  FakeNodeService service_;
  std::unique_ptr<grpc::Server> server_;
  FakeLauncher launcher_;
  AgentConfig config_;
  metrics::testing::TestRegistry registry_;
  std::unique_ptr<Agent> agent_;  // destroyed before the launcher and the registry
};

TEST_F(AgentTest, RegistersItsSlotsGpusAndVersionThenHeartbeats) {
  StartAgent();
  const v1::RegisterNodeRequest reg = service_.registrations().at(0);
  EXPECT_EQ(reg.name(), "node-a");
  EXPECT_EQ(reg.address(), "127.0.0.1");
  EXPECT_EQ(reg.slots(), 4);
  EXPECT_EQ(reg.agent_version(), kVersion);
  ASSERT_EQ(reg.gpus_size(), 2);
  EXPECT_EQ(reg.gpus(0).index(), 0);
  EXPECT_EQ(reg.gpus(0).uuid(), "GPU-aaaa");
  EXPECT_EQ(reg.gpus(0).model(), "Test GPU");
  EXPECT_EQ(reg.gpus(0).memory_bytes(), 1 << 30);
  EXPECT_EQ(reg.gpus(1).index(), 1);
  EXPECT_THAT(reg.running(), IsEmpty());
  EXPECT_TRUE(WaitUntil([&] { return service_.heartbeats() >= 3; }));
  EXPECT_EQ(agent_->session_id(), "session-1");
}

TEST_F(AgentTest, LaunchStartsEachRankWithItsEnvironment) {
  StartAgent();
  const std::map<int, pid_t> pids = LaunchAndWait(Launch("job-a", 0, 2, /*gpus=*/true));
  ASSERT_EQ(pids.size(), 2u);
  const auto procs = launcher_.procs();
  ASSERT_EQ(procs.size(), 2u);
  const LaunchSpec& spec = procs.at(pids.at(3)).spec;  // ranks 2 and 3
  EXPECT_THAT(spec.argv, ElementsAre("/opt/train", "--steps=10"));
  for (const char* entry :
       {"RANK=3", "LOCAL_RANK=1", "WORLD_SIZE=4", "LOCAL_WORLD_SIZE=2", "GROUP_RANK=1",
        "MESH_JOB_ID=job-a", "MESH_GENERATION=0", "MESH_RANK=3", "CUDA_VISIBLE_DEVICES=1",
        "MASTER_ADDR=10.0.0.1", "MASTER_PORT=29500", "TORCHELASTIC_MAX_RESTARTS=3", "ALPHA=first",
        "ZED=last", "PATH=/usr/bin:/bin"}) {
    EXPECT_TRUE(HasEnv(spec, entry)) << entry;
  }
  EXPECT_TRUE(HasEnv(spec, "MESH_COORDINATOR=" + config_.coordinator));
  EXPECT_TRUE(HasEnv(procs.at(pids.at(2)).spec, "CUDA_VISIBLE_DEVICES=0"));
  const std::string gen_dir = work_dir_ + "/jobs/job-a/gen-0";
  EXPECT_EQ(spec.stdout_log, gen_dir + "/rank-3.log");
  EXPECT_EQ(spec.working_dir, gen_dir);
  EXPECT_EQ(spec.max_log_bytes, config_.log_max_bytes);
  EXPECT_TRUE(std::filesystem::is_directory(gen_dir));

  const v1::ReportWorkersStartedRequest started = service_.started().at(0);
  EXPECT_EQ(started.name(), "node-a");
  EXPECT_EQ(started.session_id(), "session-1");
  EXPECT_EQ(started.job_id(), "job-a");
  EXPECT_EQ(started.generation(), 0);
  EXPECT_EQ(agent_->RunningWorkers().size(), 2u);
}

TEST_F(AgentTest, DuplicateLaunchIsANoOp) {
  StartAgent();
  LaunchAndWait(Launch("job-a", 0, 2));
  ASSERT_TRUE(service_.Push(Launch("job-a", 0, 2)));
  // Orders apply in order: once job-b runs, the duplicate was handled.
  LaunchAndWait(Launch("job-b", 0, 1));
  EXPECT_EQ(launcher_.launched(), 3u);
  EXPECT_EQ(service_.started().size(), 2u);
}

TEST_F(AgentTest, ExitsAreReportedWithCodeOrSignal) {
  StartAgent();
  const std::map<int, pid_t> pids = LaunchAndWait(Launch("job-a", 0, 2));
  ASSERT_EQ(pids.size(), 2u);
  launcher_.Exit(pids.at(2), 3);
  launcher_.Exit(pids.at(3), 0, SIGKILL);
  ASSERT_TRUE(WaitUntil([&] { return service_.exits().size() == 2; }));
  std::map<int, v1::ReportWorkerExitRequest> by_rank;
  for (const auto& exit : service_.exits()) by_rank[exit.rank()] = exit;
  EXPECT_EQ(by_rank.at(2).termination_case(), v1::ReportWorkerExitRequest::kExitCode);
  EXPECT_EQ(by_rank.at(2).exit_code(), 3);
  EXPECT_EQ(by_rank.at(3).termination_case(), v1::ReportWorkerExitRequest::kSignal);
  EXPECT_EQ(by_rank.at(3).signal(), SIGKILL);
  EXPECT_EQ(by_rank.at(3).job_id(), "job-a");
  EXPECT_EQ(by_rank.at(3).session_id(), "session-1");
  EXPECT_GT(by_rank.at(3).time_unix_ms(), 0);
  EXPECT_TRUE(WaitUntil([&] { return agent_->RunningWorkers().empty(); }));
}

TEST_F(AgentTest, LaunchFailureIsReportedForEveryRank) {
  StartAgent();
  launcher_.FailLaunches(absl::NotFoundError("no such program /opt/train"));
  ASSERT_TRUE(service_.Push(Launch("job-a", 0, 2)));
  ASSERT_TRUE(WaitUntil([&] { return service_.exits().size() == 2; }));
  for (const auto& exit : service_.exits()) {
    EXPECT_EQ(exit.termination_case(), v1::ReportWorkerExitRequest::kLaunchError);
    EXPECT_THAT(exit.launch_error(), ::testing::HasSubstr("/opt/train"));
  }
  EXPECT_THAT(service_.started(), IsEmpty());
}

TEST_F(AgentTest, KillStopsTheJobsWorkersWithTheOrdersGrace) {
  StartAgent();
  const std::map<int, pid_t> pids = LaunchAndWait(Launch("job-a", 0, 2));
  ASSERT_TRUE(service_.Push(Kill("job-a", 0, 2.5)));
  ASSERT_TRUE(WaitUntil([&] { return agent_->RunningWorkers().empty(); }));
  for (const auto& [rank, pid] : pids) {
    const auto proc = launcher_.procs().at(pid);
    ASSERT_TRUE(proc.terminated.has_value()) << rank;
    EXPECT_EQ(*proc.terminated, absl::Seconds(2.5));
  }
  // A relaunch of the killed generation (a replayed order) is a no-op; the
  // next job's launch shows the order was handled. Stopped workers are not
  // reported as failures.
  ASSERT_TRUE(service_.Push(Launch("job-a", 0, 2)));
  LaunchAndWait(Launch("job-b", 0, 1));
  EXPECT_EQ(launcher_.launched(), 3u);
  EXPECT_THAT(service_.exits(), IsEmpty());
}

// Records which generations the agent asks to clear of strays.
class FakeStrayKiller final : public StrayKiller {
 public:
  int KillStrays(const std::string& job_id, int64_t generation) override {
    absl::MutexLock lock(&mu_);
    calls_.emplace_back(job_id, generation);
    return 0;
  }
  std::vector<std::pair<std::string, int64_t>> calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::pair<std::string, int64_t>> calls_;
};

TEST_F(AgentTest, StoppedGenerationsAreClearedOfStraysOnceTheirWorkersExited) {
  FakeStrayKiller strays;
  config_.instance = "node-a.1.abc";
  agent_ = std::make_unique<Agent>(config_, &launcher_, &registry_, &strays);
  ASSERT_TRUE(agent_->Start().ok());
  ASSERT_TRUE(WaitUntil([&] { return service_.registrations().size() == 1; }));
  const std::map<int, pid_t> pids = LaunchAndWait(Launch("job-a", 0, 2));
  ASSERT_EQ(pids.size(), 2u);
  EXPECT_TRUE(
      HasEnv(launcher_.procs().at(pids.begin()->second).spec, "MESH_AGENT_INSTANCE=node-a.1.abc"));
  EXPECT_THAT(strays.calls(), IsEmpty());  // Running: nothing is a stray yet.
  LaunchAndWait(Launch("job-a", 1, 2));    // A restart stops generation 0.
  ASSERT_TRUE(WaitUntil([&] { return strays.calls().size() == 1; }));
  EXPECT_EQ(strays.calls().at(0), std::make_pair(std::string("job-a"), int64_t{0}));
  ASSERT_TRUE(service_.Push(Kill("job-a", 1, 1)));  // The job's end.
  ASSERT_TRUE(WaitUntil([&] { return strays.calls().size() == 2; }));
  EXPECT_EQ(strays.calls().at(1), std::make_pair(std::string("job-a"), int64_t{1}));
  agent_->Shutdown();
  agent_.reset();  // Before `strays`.
}

TEST_F(AgentTest, LaunchOfTheNextGenerationStopsTheOldOneFirst) {
  StartAgent();
  const std::map<int, pid_t> old_pids = LaunchAndWait(Launch("job-a", 0, 2));
  const std::map<int, pid_t> new_pids = LaunchAndWait(Launch("job-a", 1, 2));
  ASSERT_EQ(new_pids.size(), 2u);
  const std::vector<std::string> events = launcher_.events();
  auto position = [&](const std::string& event) {
    return std::find(events.begin(), events.end(), event) - events.begin();
  };
  for (const auto& [rank, old_pid] : old_pids) {
    for (const auto& [rank2, new_pid] : new_pids) {
      EXPECT_LT(position(absl::StrCat("terminate ", old_pid)),
                position(absl::StrCat("launch ", new_pid)));
    }
  }
  EXPECT_TRUE(HasEnv(launcher_.procs().at(new_pids.at(2)).spec, "MESH_GENERATION=1"));
  EXPECT_TRUE(HasEnv(launcher_.procs().at(new_pids.at(2)).spec, "TORCHELASTIC_RESTART_COUNT=1"));
  EXPECT_THAT(service_.exits(), IsEmpty());
  EXPECT_EQ(agent_->RunningWorkers().size(), 2u);
}

TEST_F(AgentTest, StreamDropReRegistersKeepsWorkersAndResendsExits) {
  StartAgent();
  const std::map<int, pid_t> pids = LaunchAndWait(Launch("job-a", 0, 2));
  launcher_.Exit(pids.at(3), 1);
  ASSERT_TRUE(WaitUntil([&] { return service_.exits().size() == 1; }));
  EXPECT_EQ(service_.exits().at(0).session_id(), "session-1");

  ASSERT_TRUE(service_.Drop(grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator restart")));
  ASSERT_TRUE(WaitUntil([&] { return service_.registrations().size() == 2; }));
  const v1::RegisterNodeRequest again = service_.registrations().at(1);
  ASSERT_EQ(again.running_size(), 1);
  EXPECT_EQ(again.running(0).job_id(), "job-a");
  EXPECT_EQ(again.running(0).rank(), 2);
  EXPECT_EQ(again.running(0).pid(), pids.at(2));
  EXPECT_FALSE(launcher_.procs().at(pids.at(2)).terminated.has_value())
      << "a re-registration must not stop workers";
  // The exit record of the current generation is sent again.
  ASSERT_TRUE(WaitUntil([&] { return service_.exits().size() == 2; }));
  EXPECT_EQ(service_.exits().at(1).session_id(), "session-2");
  EXPECT_EQ(service_.exits().at(1).rank(), 3);
  EXPECT_EQ(service_.exits().at(1).exit_code(), 1);
  // And the new session takes orders.
  launcher_.Exit(pids.at(2), 0);
  ASSERT_TRUE(WaitUntil([&] { return service_.exits().size() == 3; }));
  EXPECT_EQ(service_.exits().at(2).rank(), 2);
}

TEST_F(AgentTest, UnacknowledgedExitIsRetriedWithTheNewSession) {
  StartAgent();
  const std::map<int, pid_t> pids = LaunchAndWait(Launch("job-a", 0, 1));
  service_.SetExitStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "busy"));
  launcher_.Exit(pids.at(1), 7);
  ASSERT_TRUE(WaitUntil([&] { return service_.exit_attempts() >= 2; }));
  ASSERT_TRUE(service_.Drop(grpc::Status(grpc::StatusCode::UNAVAILABLE, "restart")));
  ASSERT_TRUE(WaitUntil([&] { return service_.registrations().size() == 2; }));
  service_.SetExitStatus(grpc::Status::OK);
  ASSERT_TRUE(WaitUntil([&] { return !service_.exits().empty(); }));
  EXPECT_EQ(service_.exits().at(0).exit_code(), 7);
  EXPECT_EQ(service_.exits().at(0).session_id(), "session-2");
  // Sent once: the re-send of exit records skips a report still queued.
  // Reports go out in order, so once a later report (another job's exit)
  // has arrived, a duplicate queued before it would have arrived too.
  const std::map<int, pid_t> later = LaunchAndWait(Launch("job-b", 0, 1));
  launcher_.Exit(later.at(1), 0);
  ASSERT_TRUE(WaitUntil([&] {
    for (const auto& exit : service_.exits()) {
      if (exit.job_id() == "job-b") return true;
    }
    return false;
  }));
  int job_a_exits = 0;
  for (const auto& exit : service_.exits()) job_a_exits += exit.job_id() == "job-a" ? 1 : 0;
  EXPECT_EQ(job_a_exits, 1);
}

TEST_F(AgentTest, StaleSessionOnAReportReRegisters) {
  StartAgent();
  // A report that gets ABORTED means the session is stale.
  service_.SetExitStatus(grpc::Status(grpc::StatusCode::ABORTED, "stale session"));
  const std::map<int, pid_t> pids = LaunchAndWait(Launch("job-a", 0, 1));
  launcher_.Exit(pids.at(1), 2);
  ASSERT_TRUE(WaitUntil([&] { return service_.registrations().size() >= 2; }));
  service_.SetExitStatus(grpc::Status::OK);
  ASSERT_TRUE(WaitUntil([&] { return !service_.exits().empty(); }));
  EXPECT_EQ(service_.exits().at(0).exit_code(), 2);
}

std::string UploadedData(const std::vector<v1::UploadLogsRequest>& messages, int rank) {
  std::string data;
  for (const auto& m : messages) {
    if (m.has_chunk() && m.chunk().rank() == rank) data += m.chunk().data();
  }
  return data;
}

TEST_F(AgentTest, UploadLogsSendsTheLogAndEof) {
  StartAgent();
  LaunchAndWait(Launch("job-a", 0, 1));
  const std::string log = work_dir_ + "/jobs/job-a/gen-0/rank-1.log";
  std::ofstream(log) << "hello\nworld\n";
  v1::Assignment order;
  order.set_action(v1::Assignment::ACTION_UPLOAD_LOGS);
  order.set_job_id("job-a");
  order.set_generation(0);
  order.set_log_request_id("req-1");
  ASSERT_TRUE(service_.Push(order));
  ASSERT_TRUE(WaitUntil([&] { return service_.uploads_finished() == 1; }));
  auto messages = service_.upload_messages();
  ASSERT_FALSE(messages.empty());
  EXPECT_EQ(messages[0].name(), "node-a");
  EXPECT_EQ(messages[0].session_id(), "session-1");
  EXPECT_EQ(messages[0].job_id(), "job-a");
  EXPECT_EQ(messages[0].log_request_id(), "req-1");
  EXPECT_EQ(UploadedData(messages, 1), "hello\nworld\n");
  ASSERT_TRUE(messages.back().has_chunk());
  EXPECT_TRUE(messages.back().chunk().eof());
  EXPECT_FALSE(messages.back().chunk().missing());
  EXPECT_EQ(messages.back().chunk().offset(), 12);

  // Tail of one line, and a rank this node has no log for.
  order.set_log_request_id("req-2");
  order.set_log_tail(1);
  order.add_log_ranks(1);
  order.add_log_ranks(5);
  ASSERT_TRUE(service_.Push(order));
  ASSERT_TRUE(WaitUntil([&] { return service_.uploads_finished() == 2; }));
  messages = service_.upload_messages();
  std::vector<v1::UploadLogsRequest> second;
  bool in_second = false;
  for (const auto& m : messages) {
    if (m.log_request_id() == "req-2") in_second = true;
    if (in_second) second.push_back(m);
  }
  EXPECT_EQ(UploadedData(second, 1), "world\n");
  ASSERT_TRUE(second.back().has_chunk());
  EXPECT_EQ(second.back().chunk().rank(), 5);
  EXPECT_TRUE(second.back().chunk().eof());
  EXPECT_TRUE(second.back().chunk().missing());
}

TEST_F(AgentTest, FollowedUploadEndsAfterTheWorkerExits) {
  StartAgent();
  const std::map<int, pid_t> pids = LaunchAndWait(Launch("job-a", 0, 1));
  const std::string log = work_dir_ + "/jobs/job-a/gen-0/rank-1.log";
  std::ofstream(log) << "a\n";
  v1::Assignment order;
  order.set_action(v1::Assignment::ACTION_UPLOAD_LOGS);
  order.set_job_id("job-a");
  order.set_generation(0);
  order.set_log_request_id("req-f");
  order.set_log_follow(true);
  ASSERT_TRUE(service_.Push(order));
  ASSERT_TRUE(WaitUntil([&] { return UploadedData(service_.upload_messages(), 1) == "a\n"; }));
  std::ofstream(log, std::ios::app) << "b\npartial";
  ASSERT_TRUE(WaitUntil([&] { return UploadedData(service_.upload_messages(), 1) == "a\nb\n"; }));
  EXPECT_EQ(service_.uploads_finished(), 0) << "still following a running worker";
  launcher_.Exit(pids.at(1), 0);
  ASSERT_TRUE(WaitUntil([&] { return service_.uploads_finished() == 1; }));
  const auto messages = service_.upload_messages();
  EXPECT_EQ(UploadedData(messages, 1), "a\nb\npartial");
  ASSERT_TRUE(messages.back().has_chunk());
  EXPECT_TRUE(messages.back().chunk().eof());
}

// A follow shows every rank as it writes, not one rank after another: rank
// 3's output arrives while rank 2 still runs.
TEST_F(AgentTest, FollowedUploadInterleavesRunningRanks) {
  StartAgent();
  const std::map<int, pid_t> pids = LaunchAndWait(Launch("job-a", 0, 2));
  const std::string dir = work_dir_ + "/jobs/job-a/gen-0/";
  std::ofstream(dir + "rank-2.log") << "two\n";
  std::ofstream(dir + "rank-3.log") << "three\n";
  v1::Assignment order;
  order.set_action(v1::Assignment::ACTION_UPLOAD_LOGS);
  order.set_job_id("job-a");
  order.set_generation(0);
  order.set_log_request_id("req-i");
  order.set_log_follow(true);
  ASSERT_TRUE(service_.Push(order));
  ASSERT_TRUE(WaitUntil([&] {
    const auto messages = service_.upload_messages();
    return UploadedData(messages, 2) == "two\n" && UploadedData(messages, 3) == "three\n";
  }));
  EXPECT_EQ(service_.uploads_finished(), 0) << "both ranks still run";
  std::ofstream(dir + "rank-3.log", std::ios::app) << "more\n";
  ASSERT_TRUE(
      WaitUntil([&] { return UploadedData(service_.upload_messages(), 3) == "three\nmore\n"; }));
  launcher_.Exit(pids.at(2), 0);
  launcher_.Exit(pids.at(3), 0);
  ASSERT_TRUE(WaitUntil([&] { return service_.uploads_finished() == 1; }));
  int eofs = 0;
  for (const auto& m : service_.upload_messages()) eofs += m.has_chunk() && m.chunk().eof();
  EXPECT_EQ(eofs, 2);
}

TEST_F(AgentTest, ShutdownStopsEveryWorker) {
  StartAgent();
  const std::map<int, pid_t> pids = LaunchAndWait(Launch("job-a", 0, 2));
  agent_->Shutdown();
  for (const auto& [rank, pid] : pids) {
    EXPECT_TRUE(launcher_.procs().at(pid).terminated.has_value()) << rank;
  }
  EXPECT_THAT(service_.exits(), IsEmpty());
}

// ---------------------------------------------------------------------------
// Metrics.
// ---------------------------------------------------------------------------

TEST(WorkerExitReasonTest, BoundedClasses) {
  auto exited = [](int code) {
    ExitInfo e;
    e.exit_code = code;
    return WorkerExitReason(e);
  };
  auto signaled = [](int signal) {
    ExitInfo e;
    e.signal = signal;
    return WorkerExitReason(e);
  };
  EXPECT_EQ(exited(0), "exit_0");
  EXPECT_EQ(exited(1), "exit_1");
  EXPECT_EQ(exited(2), "exit_2_127");
  EXPECT_EQ(exited(127), "exit_2_127");
  EXPECT_EQ(exited(128), "exit_128_255");
  EXPECT_EQ(exited(255), "exit_128_255");
  EXPECT_EQ(signaled(SIGKILL), "signal_SIGKILL");
  EXPECT_EQ(signaled(SIGTERM), "signal_SIGTERM");
  EXPECT_EQ(signaled(SIGSEGV), "signal_SIGSEGV");
  EXPECT_EQ(signaled(SIGABRT), "signal_SIGABRT");
  EXPECT_EQ(signaled(SIGBUS), "signal_SIGBUS");
  EXPECT_EQ(signaled(SIGFPE), "signal_SIGFPE");
  EXPECT_EQ(signaled(SIGILL), "signal_SIGILL");
  EXPECT_EQ(signaled(SIGINT), "signal_SIGINT");
  EXPECT_EQ(signaled(SIGUSR1), "signal_other");
  EXPECT_EQ(signaled(SIGHUP), "signal_other");
}

TEST_F(AgentTest, MetricsCountLaunchesRestartsAndExitsByReason) {
  StartAgent();
  EXPECT_EQ(registry_.GaugeValue("mesh_agent_slots"), 4);
  EXPECT_EQ(registry_.GaugeValue("mesh_agent_gpus"), 2);
  const std::map<int, pid_t> pids = LaunchAndWait(Launch("job-a", 0, 2));
  ASSERT_EQ(pids.size(), 2u);
  EXPECT_EQ(registry_.CounterValue("mesh_agent_launches_total"), 2);
  EXPECT_EQ(registry_.CounterValue("mesh_agent_restarts_total"), 0);
  EXPECT_EQ(registry_.HistogramCount("mesh_agent_launch_duration_seconds"), 1u);
  EXPECT_EQ(registry_.GaugeValue("mesh_agent_workers", {"running"}), 2);
  EXPECT_EQ(registry_.GaugeValue("mesh_agent_workers", {"stopping"}), 0);

  launcher_.Exit(pids.at(2), 3);
  launcher_.Exit(pids.at(3), 0, SIGSEGV);
  ASSERT_TRUE(WaitUntil([&] { return service_.exits().size() == 2; }));
  EXPECT_EQ(registry_.CounterValue("mesh_agent_worker_exits_total", {"exit_2_127"}), 1);
  EXPECT_EQ(registry_.CounterValue("mesh_agent_worker_exits_total", {"signal_SIGSEGV"}), 1);
  EXPECT_EQ(registry_.GaugeValue("mesh_agent_workers", {"running"}), 0);

  // The restart: generation 1's ranks count as launches and restarts.
  const std::map<int, pid_t> restarted = LaunchAndWait(Launch("job-a", 1, 2));
  ASSERT_EQ(restarted.size(), 2u);
  EXPECT_EQ(registry_.CounterValue("mesh_agent_launches_total"), 4);
  EXPECT_EQ(registry_.CounterValue("mesh_agent_restarts_total"), 2);
  EXPECT_EQ(registry_.HistogramCount("mesh_agent_launch_duration_seconds"), 2u);
  EXPECT_EQ(registry_.GaugeValue("mesh_agent_workers", {"running"}), 2);

  // A kill: the agent's SIGTERM is an exit too, by its signal.
  ASSERT_TRUE(service_.Push(Kill("job-a", 1)));
  ASSERT_TRUE(WaitUntil([&] { return agent_->RunningWorkers().empty(); }));
  EXPECT_EQ(registry_.CounterValue("mesh_agent_worker_exits_total", {"signal_SIGTERM"}), 2);
  EXPECT_EQ(registry_.GaugeValue("mesh_agent_workers", {"running"}), 0);
  EXPECT_EQ(registry_.GaugeValue("mesh_agent_workers", {"stopping"}), 0);

  // Launch errors count once per rank, and launch nothing.
  launcher_.FailLaunches(absl::NotFoundError("no such program"));
  ASSERT_TRUE(service_.Push(Launch("job-b", 0, 3)));
  ASSERT_TRUE(WaitUntil([&] {
    return registry_.CounterValue("mesh_agent_worker_exits_total", {"launch_error"}) == 3;
  }));
  EXPECT_EQ(registry_.CounterValue("mesh_agent_launches_total"), 4);
  // Every reason has its series from the start, and there are no others.
  EXPECT_EQ(registry_.Children("mesh_agent_worker_exits_total").size(), 14u);
  EXPECT_EQ(registry_.CounterValue("mesh_agent_worker_exits_total", {"exit_0"}), 0);
}

TEST_F(AgentTest, PerJobGpuMetricsComeFromTheJobsGpusAndGoWithTheJob) {
  config_.gpu_usage = [] {
    return std::vector<GpuUsage>{{0, 0.5, int64_t{1} << 30}, {1, 1.0, int64_t{2} << 30}};
  };
  StartAgent();
  ASSERT_EQ(LaunchAndWait(Launch("job-g", 0, 2, /*gpus=*/true)).size(), 2u);
  ASSERT_TRUE(WaitUntil([&] {
    return registry_.GaugeValue("mesh_agent_job_gpu_memory_bytes", {"job-g"}) ==
           static_cast<double>(int64_t{3} << 30);
  }));
  EXPECT_EQ(registry_.GaugeValue("mesh_agent_job_gpus", {"job-g"}), 2);
  EXPECT_EQ(registry_.GaugeValue("mesh_agent_job_gpu_utilization_ratio", {"job-g"}), 0.75);

  // Gone with the job: no series piles up across jobs.
  ASSERT_TRUE(service_.Push(Kill("job-g", 0)));
  ASSERT_TRUE(WaitUntil([&] { return registry_.Children("mesh_agent_job_gpus").empty(); }));
  EXPECT_TRUE(registry_.Children("mesh_agent_job_gpu_utilization_ratio").empty());
  EXPECT_TRUE(registry_.Children("mesh_agent_job_gpu_memory_bytes").empty());
}

TEST_F(AgentTest, MetricsShowConnectionAndHeartbeatAge) {
  StartAgent();
  ASSERT_TRUE(WaitUntil([&] { return registry_.GaugeValue("mesh_agent_connected") == 1; }));
  ASSERT_TRUE(WaitUntil([&] { return service_.heartbeats() >= 3; }));
  // Heartbeats every 50 ms are acknowledged: the age stays small.
  EXPECT_LT(registry_.GaugeValue("mesh_agent_heartbeat_age_seconds"), 1.0);
  // Unacknowledged heartbeats (within the 5 s timeout): the age grows while
  // the agent stays connected.
  service_.SetHeartbeatStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "busy"));
  ASSERT_TRUE(
      WaitUntil([&] { return registry_.GaugeValue("mesh_agent_heartbeat_age_seconds") >= 0.3; }));
  EXPECT_EQ(registry_.GaugeValue("mesh_agent_connected"), 1);
  service_.SetHeartbeatStatus(grpc::Status::OK);
  ASSERT_TRUE(
      WaitUntil([&] { return registry_.GaugeValue("mesh_agent_heartbeat_age_seconds") < 0.3; }));

  // A lost session that cannot be re-established: disconnected.
  service_.SetRegisterStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "down"));
  ASSERT_TRUE(service_.Drop(grpc::Status(grpc::StatusCode::UNAVAILABLE, "restart")));
  ASSERT_TRUE(WaitUntil([&] { return registry_.GaugeValue("mesh_agent_connected") == 0; }));
  service_.SetRegisterStatus(grpc::Status::OK);
  ASSERT_TRUE(WaitUntil([&] { return registry_.GaugeValue("mesh_agent_connected") == 1; }));
  agent_->Shutdown();
  EXPECT_EQ(registry_.GaugeValue("mesh_agent_connected"), 0);
}

TEST_F(AgentTest, RegistrationCarriesTheMetricsPort) {
  config_.metrics_port = 9123;
  StartAgent();
  EXPECT_EQ(service_.registrations().at(0).metrics_port(), 9123);
}

TEST_F(AgentTest, BadMetricsPortsAreRefused) {
  for (auto [first, last] : {std::pair{9600, 9500}, {-1, 5}, {65535, 65536}}) {
    AgentConfig config = config_;
    config.worker_metrics_port_first = first;
    config.worker_metrics_port_last = last;
    Agent agent(config, &launcher_);
    EXPECT_EQ(agent.Start().code(), absl::StatusCode::kInvalidArgument) << first << "-" << last;
  }
  AgentConfig config = config_;
  config.metrics_port = 70000;
  Agent agent(config, &launcher_);
  EXPECT_EQ(agent.Start().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(AgentTest, WorkersGetMetricsPortsFromTheRangeNeverTwiceWhileAlive) {
  config_.worker_metrics_port_first = 9500;
  config_.worker_metrics_port_last = 9502;
  StartAgent();
  // Each started rank's port: in its env and in the started report.
  auto ports_of = [&](const v1::ReportWorkersStartedRequest& started) {
    std::map<int, int> ports;
    for (const v1::RunningWorker& w : started.workers()) {
      const std::string env = EnvValue(launcher_.procs().at(w.pid()).spec, "MESH_METRICS_PORT");
      EXPECT_EQ(env, w.metrics_port() == 0 ? "" : absl::StrCat(w.metrics_port()))
          << "rank " << w.rank();
      ports[w.rank()] = w.metrics_port();
    }
    return ports;
  };
  const std::map<int, pid_t> a = LaunchAndWait(Launch("job-a", 0, 2));
  const std::map<int, int> a_ports = ports_of(service_.started().back());
  EXPECT_EQ(a_ports, (std::map<int, int>{{2, 9500}, {3, 9501}}));

  // Three ports for four live workers: the last one runs without.
  LaunchAndWait(Launch("job-b", 0, 2));
  const std::map<int, int> b_ports = ports_of(service_.started().back());
  EXPECT_EQ(b_ports, (std::map<int, int>{{2, 9502}, {3, 0}}));

  // A re-registration lists the ports of the live workers.
  ASSERT_TRUE(service_.Drop(grpc::Status(grpc::StatusCode::UNAVAILABLE, "restart")));
  ASSERT_TRUE(WaitUntil([&] { return service_.registrations().size() == 2; }));
  std::map<std::string, int> registered;
  const v1::RegisterNodeRequest again = service_.registrations().at(1);
  for (const v1::RunningWorker& w : again.running()) {
    registered[absl::StrCat(w.job_id(), "/", w.rank())] = w.metrics_port();
  }
  EXPECT_EQ(registered,
            (std::map<std::string, int>{
                {"job-a/2", 9500}, {"job-a/3", 9501}, {"job-b/2", 9502}, {"job-b/3", 0}}));

  // job-a rank 3 exits: its port is the only free one, and the next worker
  // gets it.
  launcher_.Exit(a.at(3), 0);
  ASSERT_TRUE(WaitUntil([&] { return agent_->RunningWorkers().size() == 3; }));
  LaunchAndWait(Launch("job-c", 0, 1));
  EXPECT_EQ(ports_of(service_.started().back()), (std::map<int, int>{{1, 9501}}));
  for (const v1::RunningWorker& w : agent_->RunningWorkers()) {
    if (w.job_id() == "job-c") {
      EXPECT_EQ(w.metrics_port(), 9501);
    }
  }
}

TEST(AgentMainTest, BadFlagsExitTwo) {
  const std::vector<std::vector<const char*>> cases = {
      {"mesh-agent", "--no-such-flag"},
      {"mesh-agent", "--slots", "-1"},
      {"mesh-agent", "--gpus", "0,x"},
      {"mesh-agent", "--gpus", "3-1"},
      {"mesh-agent", "--coordinator", "no-port"},
      {"mesh-agent", "--coordinator", "host:99999"},
      {"mesh-agent", "--grace", "-1"},
      {"mesh-agent", "--log-format", "xml"},
      {"mesh-agent", "--config", "/nonexistent/agent.yaml"},
      {"mesh-agent", "--metrics-port", "70000"},
      {"mesh-agent", "--worker-metrics-ports", "9600-9500"},
      {"mesh-agent", "--worker-metrics-ports", "0-10"},
      {"mesh-agent", "--worker-metrics-ports", "x"},
  };
  for (const auto& argv : cases) {
    EXPECT_EQ(RunAgentMain(static_cast<int>(argv.size()), argv.data()), kAgentExitUsage)
        << argv[1] << " " << (argv.size() > 2 ? argv[2] : "");
  }
  const std::vector<const char*> discover = {"mesh-agent", "--discover", "--gpus",
                                             "none",       "--slots",    "3"};
  EXPECT_EQ(RunAgentMain(static_cast<int>(discover.size()), discover.data()), kAgentExitOk);
}

}  // namespace agent_test
}  // namespace mesh::agent
