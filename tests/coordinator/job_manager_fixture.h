// The JobManager test fixture (coordinator/job_manager.h): recording fakes
// for the agents' order streams and the state watchers, a FakeClock, an
// in-memory or file JobStore, and helpers that play the agents. Everything
// runs on one thread: time moves only through clock_.Advance() followed by
// Tick(), and no process is ever started. Shared by job_manager_test.cc and
// job_manager_elastic_test.cc.
#pragma once

#include "coordinator/job_manager.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/coordination.h"
#include "coordinator/sqlite_job_store.h"
#include "mesh/v1/job.pb.h"
#include "tests/util/status_matchers.h"

namespace mesh::coordinator {
namespace job_manager_test {

namespace v1 = ::mesh::v1;

using ::mesh::testing::IsOk;
using ::mesh::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::SizeIs;

using Action = v1::Assignment::Action;
constexpr Action kLaunch = v1::Assignment::ACTION_LAUNCH;
constexpr Action kKill = v1::Assignment::ACTION_KILL;
constexpr Action kUploadLogs = v1::Assignment::ACTION_UPLOAD_LOGS;

constexpr absl::Duration kHeartbeatInterval = absl::Seconds(2);
constexpr absl::Duration kHeartbeatTimeout = absl::Seconds(15);
constexpr absl::Duration kRecoveryGrace = absl::Seconds(10);
constexpr absl::Duration kKillGrace = absl::Seconds(7);
constexpr absl::Duration kMaxWait = absl::Minutes(1);
constexpr absl::Duration kLogAttachTimeout = absl::Seconds(10);

// ---- Recording fakes ----------------------------------------------------------

// A StreamSink that keeps every message and the end status, and flags any
// breach of the sink rules (Send after End, End twice) as a test failure.
template <typename Message>
class RecordingSink final : public StreamSink<Message> {
 public:
  void Send(const Message& message) override {
    if (ended()) ADD_FAILURE() << "Send after End: " << message.ShortDebugString();
    messages_.push_back(message);
  }
  void End(const absl::Status& status) override {
    if (ended()) ADD_FAILURE() << "End called twice: first " << *status_ << ", then " << status;
    status_ = status;
  }

  const std::vector<Message>& messages() const { return messages_; }
  bool ended() const { return status_.has_value(); }
  // UNKNOWN "not ended" until End has run.
  absl::Status status() const { return status_.value_or(absl::UnknownError("not ended")); }

 private:
  std::vector<Message> messages_;
  std::optional<absl::Status> status_;
};

using OrderSink = RecordingSink<v1::Assignment>;
using StateSink = RecordingSink<v1::WatchJobStateResponse>;
using ChunkSink = RecordingSink<v1::LogChunk>;

class FakeUploadControl final : public UploadControl {
 public:
  void Abort(const absl::Status& status) override {
    ++aborts_;
    status_ = status;
  }
  int aborts() const { return aborts_; }
  const absl::Status& status() const { return status_; }

 private:
  int aborts_ = 0;
  absl::Status status_;
};

// What a WaitJob callback was called with. The state is shared with the
// callback so that a late call never writes into a dead frame.
class JobWait {
 public:
  Callback<v1::Job> Done() {
    return [state = state_](absl::StatusOr<v1::Job> result) {
      ++state->calls;
      state->result = std::move(result);
    };
  }
  bool fired() const { return state_->calls > 0; }
  int calls() const { return state_->calls; }
  const absl::StatusOr<v1::Job>& result() const { return *state_->result; }

 private:
  struct State {
    int calls = 0;
    std::optional<absl::StatusOr<v1::Job>> result;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

// A fresh directory per test, removed with its files.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "job_manager_test.XXXXXX";
    char* dir = mkdtemp(tmpl.data());
    EXPECT_NE(dir, nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
      unlink(absl::StrCat(db(), suffix).c_str());
    }
    rmdir(path_.c_str());
  }
  std::string db() const { return path_ + "/state.db"; }

 private:
  std::string path_;
};

// ---- Small helpers ---------------------------------------------------------------

// A valid spec for `nodes` × `nproc` ranks; mesh (nodes, nproc) named dp, tp.
inline v1::JobSpec Spec(int nodes = 2, int nproc = 2) {
  v1::JobSpec spec;
  spec.set_name("train");
  spec.add_command("/usr/bin/python3");
  spec.add_command("train.py");
  spec.add_command("--lr=3e-4");
  (*spec.mutable_env())["NCCL_DEBUG"] = "WARN";
  spec.set_working_dir("/data/jobs/./gpt");
  spec.mutable_nodes()->set_min(nodes);
  spec.set_nproc_per_node(nproc);
  spec.add_mesh_shape(nodes);
  spec.add_mesh_shape(nproc);
  spec.add_mesh_dim_names("dp");
  spec.add_mesh_dim_names("tp");
  return spec;
}

inline v1::JobSpec SpecWithRestarts(int max_restarts) {
  v1::JobSpec spec = Spec();
  spec.set_max_restarts(max_restarts);
  return spec;
}

inline std::vector<JobState> EventStates(const v1::Job& job) {
  std::vector<JobState> states;
  for (const v1::JobStateEvent& event : job.events()) states.push_back(event.to());
  return states;
}

// (action, generation) of each order, in order.
inline std::vector<std::pair<Action, int64_t>> ActionsOf(
    const std::vector<v1::Assignment>& orders) {
  std::vector<std::pair<Action, int64_t>> out;
  for (const v1::Assignment& order : orders) out.emplace_back(order.action(), order.generation());
  return out;
}

inline std::vector<v1::Assignment> OrdersWith(const std::vector<v1::Assignment>& orders,
                                              Action action) {
  std::vector<v1::Assignment> out;
  for (const v1::Assignment& order : orders) {
    if (order.action() == action) out.push_back(order);
  }
  return out;
}

// (rank, local_rank) of each rank of a LAUNCH.
inline std::vector<std::pair<int, int>> RanksOf(const v1::Assignment& launch) {
  std::vector<std::pair<int, int>> out;
  for (const v1::RankLaunch& rank : launch.ranks())
    out.emplace_back(rank.rank(), rank.local_rank());
  return out;
}

inline v1::LogChunk Chunk(int rank, const std::string& data, bool eof = false) {
  v1::LogChunk chunk;
  chunk.set_rank(rank);
  chunk.set_stream(v1::LogChunk::STREAM_STDOUT);
  chunk.set_data(data);
  chunk.set_eof(eof);
  return chunk;
}

// ---- Fixture ----------------------------------------------------------------------

// One fake agent: its registration and its latest order stream.
struct Agent {
  std::string name;
  std::string address;
  int slots = 2;
  int gpus = 0;
  std::string session;
  uint64_t watch = 0;
  OrderSink* orders = nullptr;  // Owned by the fixture.
};

class JobManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    OpenStore(":memory:");
    CreateManager();
  }

  void TearDown() override {
    if (manager_ != nullptr) manager_->Shutdown();
  }

  static JobManagerOptions TestOptions() {
    JobManagerOptions options;
    options.spec_limits.working_dir_root = "/data";
    options.node_heartbeat_interval = kHeartbeatInterval;
    options.node_heartbeat_timeout = kHeartbeatTimeout;
    options.node_recovery_grace = kRecoveryGrace;
    options.kill_grace = kKillGrace;
    options.max_wait = kMaxWait;
    options.log_attach_timeout = kLogAttachTimeout;
    return options;
  }

  void OpenStore(const std::string& path) {
    auto store = SqliteJobStore::Open(path, &clock_);
    ASSERT_THAT(store, IsOk());
    store_ = std::move(*store);
  }

  void CreateManager() {
    JobManagerOptions options = TestOptions();
    options.unix_account = unix_account_;
    ASSERT_THAT(ValidateJobManagerOptions(options), IsOk());
    coordination_ = std::make_unique<Coordination>(&clock_, CoordinationOptions{});
    manager_ = std::make_unique<JobManager>(&clock_, store_.get(), coordination_.get(), options);
  }

  // Switches to a store file in a temporary directory (for recovery tests).
  // Call first, before anything is submitted or registered.
  void UseFileStore() {
    manager_.reset();
    coordination_.reset();
    store_.reset();
    dir_ = std::make_unique<TempDir>();
    OpenStore(dir_->db());
    CreateManager();
  }

  // The coordinator process dies and a new one starts on the same store
  // file: a new store connection, Coordination and JobManager; Recover().
  // Agents keep their (now stale) sessions.
  void RestartCoordinator(bool recover = true) {
    manager_.reset();
    coordination_.reset();
    store_.reset();
    OpenStore(dir_->db());
    CreateManager();
    if (recover) {
      ASSERT_THAT(manager_->Recover(), IsOk());
    }
  }

  JobManager& manager() { return *manager_; }

  // A new sink or upload control that lives as long as the fixture: longer
  // than the manager, which may call it until its Unwatch/Cancel or
  // UploadEnded, or Shutdown.
  template <typename T>
  T* Keep() {
    auto object = std::make_shared<T>();
    keep_alive_.push_back(object);
    return object.get();
  }

  // ---- Agents ----

  v1::RegisterNodeRequest RegisterRequest(const Agent& agent) {
    v1::RegisterNodeRequest request;
    request.set_name(agent.name);
    request.set_address(agent.address);
    request.set_slots(agent.slots);
    for (int i = 0; i < agent.gpus; ++i) {
      v1::NodeGpu* gpu = request.add_gpus();
      gpu->set_index(i);
      gpu->set_model("NVIDIA H100 80GB HBM3");
    }
    request.set_agent_version("0.1.0");
    return request;
  }

  // Registers `agent` (again), listing `running` workers; keeps the session.
  absl::Status Register(Agent& agent, const std::vector<v1::RunningWorker>& running = {}) {
    v1::RegisterNodeRequest request = RegisterRequest(agent);
    for (const v1::RunningWorker& worker : running) *request.add_running() = worker;
    absl::StatusOr<v1::RegisterNodeResponse> response = manager().RegisterNode(request);
    if (!response.ok()) return response.status();
    agent.session = response->session_id();
    return absl::OkStatus();
  }

  // Opens a new order stream for `agent` into a fresh sink.
  absl::Status Watch(Agent& agent) {
    agent.orders = Keep<OrderSink>();
    absl::StatusOr<uint64_t> handle =
        manager().WatchAssignments(agent.name, agent.session, agent.orders);
    if (!handle.ok()) return handle.status();
    agent.watch = *handle;
    return absl::OkStatus();
  }

  // A new agent, registered and watching. Addresses are 10.0.0.1, .2, ...
  Agent& AddAgent(const std::string& name, int slots = 2, int gpus = 0) {
    auto agent = std::make_unique<Agent>();
    agent->name = name;
    agent->address = absl::StrCat("10.0.0.", agents_.size() + 1);
    agent->slots = slots;
    agent->gpus = gpus;
    EXPECT_THAT(Register(*agent), IsOk());
    EXPECT_THAT(Watch(*agent), IsOk());
    agents_.push_back(std::move(agent));
    return *agents_.back();
  }

  absl::Status Heartbeat(const Agent& agent) {
    return manager().NodeHeartbeat(agent.name, agent.session).status();
  }

  static v1::RunningWorker Worker(const std::string& job_id, int64_t generation, int rank) {
    v1::RunningWorker worker;
    worker.set_job_id(job_id);
    worker.set_generation(generation);
    worker.set_rank(rank);
    worker.set_pid(1000 + rank);
    return worker;
  }

  absl::Status Started(const Agent& agent, const std::string& job_id, int64_t generation,
                       const std::vector<int>& ranks) {
    v1::ReportWorkersStartedRequest request;
    request.set_name(agent.name);
    request.set_session_id(agent.session);
    request.set_job_id(job_id);
    request.set_generation(generation);
    for (int rank : ranks) *request.add_workers() = Worker(job_id, generation, rank);
    return manager().ReportWorkersStarted(request);
  }

  v1::ReportWorkerExitRequest ExitRequest(const Agent& agent, const std::string& job_id,
                                          int64_t generation, int rank) {
    v1::ReportWorkerExitRequest request;
    request.set_name(agent.name);
    request.set_session_id(agent.session);
    request.set_job_id(job_id);
    request.set_generation(generation);
    request.set_rank(rank);
    request.set_time_unix_ms(absl::ToUnixMillis(clock_.Now()));
    return request;
  }

  absl::Status Exited(const Agent& agent, const std::string& job_id, int64_t generation, int rank,
                      int code) {
    v1::ReportWorkerExitRequest request = ExitRequest(agent, job_id, generation, rank);
    request.set_exit_code(code);
    return manager().ReportWorkerExit(request);
  }

  absl::Status Signaled(const Agent& agent, const std::string& job_id, int64_t generation, int rank,
                        int signal) {
    v1::ReportWorkerExitRequest request = ExitRequest(agent, job_id, generation, rank);
    request.set_signal(signal);
    return manager().ReportWorkerExit(request);
  }

  absl::Status LaunchFailed(const Agent& agent, const std::string& job_id, int64_t generation,
                            int rank, const std::string& error) {
    v1::ReportWorkerExitRequest request = ExitRequest(agent, job_id, generation, rank);
    request.set_launch_error(error);
    return manager().ReportWorkerExit(request);
  }

  // Moves the clock by `total` in steps of 5 s (below the heartbeat
  // timeout); after each step every agent in `alive` heartbeats and the
  // manager ticks.
  void AdvanceWithHeartbeats(absl::Duration total, const std::vector<Agent*>& alive) {
    while (total > absl::ZeroDuration()) {
      const absl::Duration step = std::min(total, absl::Seconds(5));
      clock_.Advance(step);
      total -= step;
      for (Agent* agent : alive) EXPECT_THAT(Heartbeat(*agent), IsOk()) << agent->name;
      manager().Tick();
    }
  }

  // ---- Jobs ----

  std::string Submit(v1::JobSpec spec) {
    absl::StatusOr<v1::SubmitJobResponse> response = manager().Submit(std::move(spec));
    EXPECT_THAT(response, IsOk());
    return response.ok() ? response->job().id() : "";
  }

  v1::Job Job(const std::string& id) {
    absl::StatusOr<v1::Job> job = manager().GetJob(id);
    EXPECT_THAT(job, IsOk());
    return job.ok() ? *job : v1::Job();
  }

  JobState StateOf(const std::string& id) { return Job(id).state(); }

  v1::Node NodeInfo(const std::string& name) {
    for (const v1::Node& node : manager().ListNodes()) {
      if (node.name() == name) return node;
    }
    ADD_FAILURE() << "no node " << name;
    return v1::Node();
  }

  // Two 2-slot nodes, node-a and node-b, registered and watching.
  void AddTwoNodes() {
    a_ = &AddAgent("node-a");
    b_ = &AddAgent("node-b");
  }

  // Submits the 2 × 2 job on node-a and node-b (AddTwoNodes first) and
  // reports every rank started: the job is RUNNING at generation 0.
  std::string RunJob(v1::JobSpec spec = Spec()) {
    const std::string id = Submit(std::move(spec));
    EXPECT_EQ(StateOf(id), v1::JOB_STATE_SCHEDULED);
    EXPECT_THAT(Started(*a_, id, 0, {0, 1}), IsOk());
    EXPECT_THAT(Started(*b_, id, 0, {2, 3}), IsOk());
    EXPECT_EQ(StateOf(id), v1::JOB_STATE_RUNNING);
    return id;
  }

  FakeClock clock_;
  // JobManagerOptions.unix_account of the next CreateManager; null: none.
  std::function<std::optional<JobManagerOptions::UnixAccount>(absl::string_view)> unix_account_;
  std::unique_ptr<TempDir> dir_;
  // Declared before the manager so that they outlive it.
  std::vector<std::shared_ptr<void>> keep_alive_;
  std::vector<std::unique_ptr<Agent>> agents_;
  Agent* a_ = nullptr;
  Agent* b_ = nullptr;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<Coordination> coordination_;
  std::unique_ptr<JobManager> manager_;
};

}  // namespace job_manager_test
}  // namespace mesh::coordinator
