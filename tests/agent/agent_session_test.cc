// Agent against a FakeNodeClient (no gRPC server, no sockets) and a
// FakeLauncher that never forks: registration, orders, the report outbox's
// retries and the session's reconnects, driven call by call.
#include <algorithm>
#include <atomic>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/agent.h"
#include "agent/coordinator_session.h"
#include "agent/node_client.h"
#include "tests/agent/fake_launcher.h"
#include "tests/util/proc.h"

namespace mesh::agent {
namespace agent_session_test {

using ::mesh::agent::testing::FakeLauncher;
using ::mesh::testing::WaitUntil;
using ::testing::ElementsAre;
using ::testing::SizeIs;

constexpr absl::Duration kTimeout = absl::Seconds(10);

// ---------------------------------------------------------------------------
// FakeNodeClient: a scripted NodeService. Each RPC records its request and
// answers with the next scripted status of its kind (OK once the script is
// used up). Sessions are "session-<n>", n counting successful
// registrations; heartbeats and streams of an older session get ABORTED,
// as from the real coordinator. Orders are pushed onto the open stream.
// ---------------------------------------------------------------------------
class FakeNodeClient final : public NodeClient {
 public:
  // Script the next answers of an RPC, in order.
  void FailRegister(std::vector<absl::Status> statuses) {
    absl::MutexLock lock(&mu_);
    register_script_.insert(register_script_.end(), statuses.begin(), statuses.end());
  }
  void FailExitReports(std::vector<absl::Status> statuses) {
    absl::MutexLock lock(&mu_);
    exit_script_.insert(exit_script_.end(), statuses.begin(), statuses.end());
  }
  void FailHeartbeats(std::vector<absl::Status> statuses) {
    absl::MutexLock lock(&mu_);
    heartbeat_script_.insert(heartbeat_script_.end(), statuses.begin(), statuses.end());
  }
  // NodeHeartbeat replies tell this interval from now on (0: none).
  void SetHeartbeatReplyInterval(double seconds) {
    absl::MutexLock lock(&mu_);
    heartbeat_reply_interval_ = seconds;
  }
  // RegisterNode blocks until CancelAll while this is set.
  void BlockRegister() {
    absl::MutexLock lock(&mu_);
    block_register_ = true;
  }

  // Delivers `order` on the stream of the current session once it is open;
  // false when none opened within kTimeout.
  bool Push(const v1::Assignment& order) {
    absl::MutexLock lock(&mu_);
    auto open = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stream_ != nullptr && stream_->session == session_;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&open), kTimeout)) return false;
    stream_->orders.push_back(order);
    return true;
  }
  // Ends the open stream with `status`; false when none is open.
  bool Drop(absl::Status status) {
    absl::MutexLock lock(&mu_);
    if (stream_ == nullptr || stream_->end.has_value()) return false;
    stream_->end = std::move(status);
    return true;
  }

  // A coordinator restart: the open stream ends with `status` and every
  // session is forgotten, so calls of the old one get NOT_FOUND or ABORTED.
  bool Restart(absl::Status status) {
    absl::MutexLock lock(&mu_);
    session_ = "forgotten";
    if (stream_ == nullptr || stream_->end.has_value()) return false;
    stream_->end = std::move(status);
    return true;
  }

  // What the fake has seen so far.
  struct Record {
    int register_attempts = 0;
    std::vector<v1::RegisterNodeRequest> registrations;
    int heartbeats = 0;
    std::vector<absl::Duration> heartbeat_timeouts;  // Each call's, in order.
    std::vector<v1::ReportWorkersStartedRequest> started;
    int exit_attempts = 0;
    std::vector<v1::ReportWorkerExitRequest> exits;
    std::vector<std::string> watched;  // the session of each stream opened
  };
  Record record() const {
    absl::MutexLock lock(&mu_);
    return record_;
  }

  // NodeClient.
  absl::StatusOr<v1::RegisterNodeResponse> RegisterNode(const v1::RegisterNodeRequest& request,
                                                        absl::Duration) override {
    absl::MutexLock lock(&mu_);
    ++record_.register_attempts;
    mu_.Await(absl::Condition(
        +[](FakeNodeClient* c)
             ABSL_NO_THREAD_SAFETY_ANALYSIS { return !c->block_register_ || c->cancelled_; },
        this));
    if (cancelled_) return absl::CancelledError("cancelled");
    if (absl::Status s = NextLocked(register_script_); !s.ok()) return s;
    record_.registrations.push_back(request);
    session_ = absl::StrCat("session-", record_.registrations.size());
    v1::RegisterNodeResponse response;
    response.set_session_id(session_);
    response.set_heartbeat_interval_seconds(0.05);
    response.set_heartbeat_timeout_seconds(5);
    return response;
  }

  absl::StatusOr<v1::NodeHeartbeatResponse> NodeHeartbeat(const v1::NodeHeartbeatRequest& request,
                                                          absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    record_.heartbeat_timeouts.push_back(timeout);
    if (cancelled_) return absl::CancelledError("cancelled");
    if (request.session_id() != session_) return absl::AbortedError("stale session");
    if (absl::Status s = NextLocked(heartbeat_script_); !s.ok()) return s;
    ++record_.heartbeats;
    v1::NodeHeartbeatResponse response;
    response.set_heartbeat_interval_seconds(heartbeat_reply_interval_);
    return response;
  }

  absl::Status ReportWorkersStarted(const v1::ReportWorkersStartedRequest& request,
                                    absl::Duration) override {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return absl::CancelledError("cancelled");
    record_.started.push_back(request);
    return absl::OkStatus();
  }

  absl::Status ReportWorkerExit(const v1::ReportWorkerExitRequest& request,
                                absl::Duration) override {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return absl::CancelledError("cancelled");
    ++record_.exit_attempts;
    if (request.session_id() != session_) return absl::NotFoundError("unknown session");
    if (absl::Status s = NextLocked(exit_script_); !s.ok()) return s;
    record_.exits.push_back(request);
    return absl::OkStatus();
  }

  std::unique_ptr<AssignmentStream> WatchAssignments(
      const v1::WatchAssignmentsRequest& request) override {
    absl::MutexLock lock(&mu_);
    auto stream = std::make_unique<Stream>(this, request.session_id());
    record_.watched.push_back(request.session_id());
    if (cancelled_) stream->end = absl::CancelledError("cancelled");
    if (request.session_id() != session_) stream->end = absl::AbortedError("stale session");
    if (stream_ != nullptr && !stream_->end.has_value()) {
      stream_->end = absl::AbortedError("replaced");
    }
    stream_ = stream.get();
    return stream;
  }

  std::unique_ptr<LogUploadStream> UploadLogs(absl::Duration) override {
    return std::make_unique<Upload>();
  }

  void CancelAll() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (stream_ != nullptr && !stream_->end.has_value()) {
      stream_->end = absl::CancelledError("cancelled");
    }
  }

 private:
  // Its state is guarded by the client's mu_.
  struct Stream final : AssignmentStream {
    Stream(FakeNodeClient* client, std::string session)
        : client(client), session(std::move(session)) {}
    ~Stream() override {
      absl::MutexLock lock(&client->mu_);
      if (client->stream_ == this) client->stream_ = nullptr;
    }
    absl::StatusOr<std::optional<v1::Assignment>> Next() override {
      absl::MutexLock lock(&client->mu_);
      client->mu_.Await(absl::Condition(
          +[](Stream* s)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return !s->orders.empty() || s->end.has_value(); },
          this));
      if (!orders.empty()) {
        v1::Assignment order = std::move(orders.front());
        orders.pop_front();
        return order;
      }
      if (end->ok()) return std::nullopt;
      return *end;
    }
    void Cancel() override {
      absl::MutexLock lock(&client->mu_);
      if (!end.has_value()) end = absl::CancelledError("cancelled");
    }

    FakeNodeClient* const client;
    const std::string session;
    std::deque<v1::Assignment> orders;
    std::optional<absl::Status> end;
  };

  struct Upload final : LogUploadStream {
    bool Write(const v1::UploadLogsRequest&) override { return true; }
    void WritesDone() override {}
    absl::Status Finish() override { return absl::OkStatus(); }
  };

  absl::Status NextLocked(std::deque<absl::Status>& script) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (script.empty()) return absl::OkStatus();
    absl::Status status = std::move(script.front());
    script.pop_front();
    return status;
  }

  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool block_register_ ABSL_GUARDED_BY(mu_) = false;
  double heartbeat_reply_interval_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<absl::Status> register_script_ ABSL_GUARDED_BY(mu_);
  std::deque<absl::Status> heartbeat_script_ ABSL_GUARDED_BY(mu_);
  std::deque<absl::Status> exit_script_ ABSL_GUARDED_BY(mu_);
  Record record_ ABSL_GUARDED_BY(mu_);
  std::string session_ ABSL_GUARDED_BY(mu_);
  Stream* stream_ ABSL_GUARDED_BY(mu_) = nullptr;  // the newest open stream
};

v1::Assignment Launch(const std::string& job, int64_t generation, std::vector<int> ranks) {
  v1::Assignment order;
  order.set_action(v1::Assignment::ACTION_LAUNCH);
  order.set_job_id(job);
  order.set_generation(generation);
  order.add_command("/opt/train");
  order.set_world_size(*std::max_element(ranks.begin(), ranks.end()) + 1);
  order.set_local_world_size(static_cast<int32_t>(ranks.size()));
  order.set_num_nodes(1);
  for (size_t i = 0; i < ranks.size(); ++i) {
    v1::RankLaunch* rank = order.add_ranks();
    rank->set_rank(ranks[i]);
    rank->set_local_rank(static_cast<int32_t>(i));
  }
  return order;
}

class AgentSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_dir_ = ::mesh::testing::MakeTempDir("mesh-agent-session-test");
    config_.coordinator = "coordinator.invalid:7450";  // never dialled
    config_.name = "node-a";
    config_.address = "127.0.0.1";
    config_.slots = 2;
    config_.work_dir = work_dir_;
    config_.grace = absl::Seconds(1);
    config_.rpc_timeout = absl::Seconds(2);
    config_.backoff_initial = absl::Milliseconds(10);
    config_.backoff_max = absl::Milliseconds(50);
    config_.base_env = {{"PATH", "/usr/bin:/bin"}};
  }
  void TearDown() override {
    agent_.reset();
    std::filesystem::remove_all(work_dir_);
  }

  // Starts an Agent on a fresh FakeNodeClient, kept in client_ (owned by the
  // Agent, valid while it lives).
  void StartAgent(std::function<void(FakeNodeClient&)> script = {}) {
    auto client = std::make_unique<FakeNodeClient>();
    client_ = client.get();
    if (script) script(*client);
    agent_ = std::make_unique<Agent>(config_, std::move(client), &launcher_);
    ASSERT_TRUE(agent_->Start().ok());
  }

  // Pushes `order` and waits for its started report; the pids by rank.
  std::map<int, pid_t> LaunchAndWait(const v1::Assignment& order) {
    const size_t before = client_->record().started.size();
    EXPECT_TRUE(client_->Push(order));
    EXPECT_TRUE(WaitUntil([&] { return client_->record().started.size() > before; }, kTimeout));
    std::map<int, pid_t> pids;
    const auto started = client_->record().started;
    if (started.size() <= before) return pids;
    for (const v1::RunningWorker& w : started.back().workers()) pids[w.rank()] = w.pid();
    return pids;
  }

  // The sessions named by the streams opened so far, once there are `n`.
  std::vector<std::string> WatchedOnce(size_t n) {
    WaitUntil([&] { return client_->record().watched.size() >= n; }, kTimeout);
    return client_->record().watched;
  }

  std::string work_dir_;
  FakeLauncher launcher_;
  AgentConfig config_;
  FakeNodeClient* client_ = nullptr;
  std::unique_ptr<Agent> agent_;  // destroyed before the launcher
};

TEST_F(AgentSessionTest, RegistersThenHeartbeatsWithItsSession) {
  StartAgent();
  ASSERT_TRUE(WaitUntil([&] { return agent_->registrations() == 1; }, kTimeout));
  const std::vector<v1::RegisterNodeRequest> registrations = client_->record().registrations;
  ASSERT_THAT(registrations, SizeIs(1));
  EXPECT_EQ(registrations[0].name(), "node-a");
  EXPECT_EQ(registrations[0].address(), "127.0.0.1");
  EXPECT_EQ(registrations[0].slots(), 2);
  EXPECT_EQ(registrations[0].running_size(), 0);
  EXPECT_EQ(agent_->session_id(), "session-1");
  EXPECT_TRUE(WaitUntil([&] { return client_->record().heartbeats >= 3; }, kTimeout));
  EXPECT_THAT(WatchedOnce(1), ElementsAre("session-1"));
}

TEST_F(AgentSessionTest, HeartbeatsFollowTheIntervalTheLatestReplyGives) {
  StartAgent();
  // Registration said 50 ms, and replies that say nothing keep it.
  ASSERT_TRUE(WaitUntil([&] { return client_->record().heartbeats >= 5; }, kTimeout));
  // Each call gets at most the interval, but never under a second (nor over
  // the RPC timeout, 2 s here).
  EXPECT_EQ(client_->record().heartbeat_timeouts.front(), absl::Seconds(1));
  // A reply that says 30 s (the coordinator's cluster grew): after the
  // heartbeat that carried it, and the one that may already be on its way,
  // no other comes for the next second, where 50 ms would send some 20.
  client_->SetHeartbeatReplyInterval(30);
  const int told = client_->record().heartbeats;
  ASSERT_TRUE(WaitUntil([&] { return client_->record().heartbeats > told; }, kTimeout));
  absl::SleepFor(absl::Milliseconds(100));
  const int after = client_->record().heartbeats;
  absl::SleepFor(absl::Seconds(1));
  EXPECT_EQ(client_->record().heartbeats, after);
  // And back to short: heartbeats resume after the 30 s wait only, so a
  // session that re-registers (a new epoch) takes its interval from
  // RegisterNode again.
  client_->SetHeartbeatReplyInterval(0);
  ASSERT_TRUE(client_->Restart(absl::UnavailableError("coordinator restarted")));
  ASSERT_TRUE(WaitUntil([&] { return agent_->registrations() == 2; }, kTimeout));
  const int fresh = client_->record().heartbeats;
  EXPECT_TRUE(WaitUntil([&] { return client_->record().heartbeats >= fresh + 5; }, kTimeout));
}

TEST_F(AgentSessionTest, LaunchOrderStartsEveryRankAndReportsThePids) {
  StartAgent();
  const std::map<int, pid_t> pids = LaunchAndWait(Launch("job-1", 0, {4, 5}));
  ASSERT_THAT(pids, SizeIs(2));
  EXPECT_EQ(launcher_.launched(), 2u);
  const v1::ReportWorkersStartedRequest report = client_->record().started.back();
  EXPECT_EQ(report.name(), "node-a");
  EXPECT_EQ(report.session_id(), "session-1");
  EXPECT_EQ(report.job_id(), "job-1");
  const auto procs = launcher_.procs();
  for (const auto& [rank, pid] : pids) {
    ASSERT_EQ(procs.count(pid), 1u) << "rank " << rank;
    EXPECT_EQ(procs.at(pid).spec.stdout_log,
              absl::StrCat(work_dir_, "/jobs/job-1/gen-0/rank-", rank, ".log"));
  }
  EXPECT_THAT(agent_->RunningWorkers(), SizeIs(2));
}

TEST_F(AgentSessionTest, ExitReportIsRetriedUntilTheCoordinatorAcknowledgesIt) {
  StartAgent([](FakeNodeClient& client) {
    client.FailExitReports(
        {absl::UnavailableError("coordinator busy"), absl::DeadlineExceededError("slow")});
  });
  const std::map<int, pid_t> pids = LaunchAndWait(Launch("job-1", 0, {0}));
  ASSERT_EQ(pids.count(0), 1u);
  launcher_.Exit(pids.at(0), 3);
  ASSERT_TRUE(WaitUntil([&] { return client_->record().exits.size() == 1; }, kTimeout));
  EXPECT_EQ(client_->record().exit_attempts, 3);
  const v1::ReportWorkerExitRequest exit = client_->record().exits[0];
  EXPECT_EQ(exit.job_id(), "job-1");
  EXPECT_EQ(exit.rank(), 0);
  EXPECT_EQ(exit.exit_code(), 3);
  EXPECT_EQ(exit.session_id(), "session-1");
  // Acknowledged once, never sent again.
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(client_->record().exit_attempts, 3);
  EXPECT_THAT(agent_->RunningWorkers(), SizeIs(0));
}

TEST_F(AgentSessionTest, RefusedExitReportIsDroppedNotRetried) {
  StartAgent([](FakeNodeClient& client) {
    client.FailExitReports({absl::InvalidArgumentError("no such job")});
  });
  const std::map<int, pid_t> pids = LaunchAndWait(Launch("job-1", 0, {0, 1}));
  ASSERT_THAT(pids, SizeIs(2));
  launcher_.Exit(pids.at(0), 1);
  launcher_.Exit(pids.at(1), 2);
  // The first is refused for good and dropped; the second goes through.
  ASSERT_TRUE(WaitUntil([&] { return client_->record().exits.size() == 1; }, kTimeout));
  EXPECT_EQ(client_->record().exits[0].rank(), 1);
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(client_->record().exit_attempts, 2);
}

TEST_F(AgentSessionTest, RegistrationIsRetriedWhileTheCoordinatorIsUnavailable) {
  StartAgent([](FakeNodeClient& client) {
    client.FailRegister({absl::UnavailableError("connection refused"),
                         absl::UnavailableError("connection refused"),
                         absl::DeadlineExceededError("handshake")});
  });
  ASSERT_TRUE(WaitUntil([&] { return agent_->registrations() == 1; }, kTimeout));
  EXPECT_EQ(client_->record().register_attempts, 4);
  EXPECT_EQ(agent_->session_id(), "session-1");
  EXPECT_THAT(WatchedOnce(1), ElementsAre("session-1"));
}

TEST_F(AgentSessionTest, StreamLostAsUnavailableReRegistersListingTheRunningWorkers) {
  StartAgent();
  const std::map<int, pid_t> pids = LaunchAndWait(Launch("job-1", 0, {0, 1}));
  ASSERT_THAT(pids, SizeIs(2));
  // The coordinator goes away, refuses one registration, then is back.
  client_->FailRegister({absl::UnavailableError("connection refused")});
  ASSERT_TRUE(client_->Drop(absl::UnavailableError("socket closed")));
  ASSERT_TRUE(WaitUntil([&] { return agent_->registrations() == 2; }, kTimeout));
  EXPECT_EQ(client_->record().register_attempts, 3);
  EXPECT_EQ(agent_->session_id(), "session-2");
  const v1::RegisterNodeRequest again = client_->record().registrations.back();
  std::set<int> ranks;
  for (const v1::RunningWorker& w : again.running()) {
    EXPECT_EQ(w.job_id(), "job-1");
    EXPECT_EQ(w.pid(), pids.at(w.rank()));
    ranks.insert(w.rank());
  }
  EXPECT_THAT(ranks, ElementsAre(0, 1));
  // The workers were left alone, and orders flow on the new stream.
  EXPECT_THAT(launcher_.events(), SizeIs(2));
  EXPECT_THAT(WatchedOnce(2), ElementsAre("session-1", "session-2"));
  EXPECT_THAT(LaunchAndWait(Launch("job-2", 0, {7})), SizeIs(1));
}

TEST_F(AgentSessionTest, ExitRefusedForAStaleSessionIsSentOnceWithTheNextSession) {
  StartAgent();
  const std::map<int, pid_t> pids = LaunchAndWait(Launch("job-1", 0, {0}));
  ASSERT_EQ(pids.count(0), 1u);
  // The coordinator restarts and forgets session-1. The exit is sent with
  // it (NOT_FOUND) or held until the next session; either way it reaches
  // the coordinator once, with session-2.
  client_->FailRegister({absl::UnavailableError("restarting")});
  ASSERT_TRUE(client_->Restart(absl::UnavailableError("coordinator restarted")));
  launcher_.Exit(pids.at(0), 0);
  ASSERT_TRUE(WaitUntil([&] { return !client_->record().exits.empty(); }, kTimeout));
  EXPECT_EQ(agent_->session_id(), "session-2");
  absl::SleepFor(absl::Milliseconds(200));
  const std::vector<v1::ReportWorkerExitRequest> exits = client_->record().exits;
  ASSERT_THAT(exits, SizeIs(1));
  EXPECT_EQ(exits[0].session_id(), "session-2");
  EXPECT_EQ(exits[0].exit_code(), 0);
}

TEST_F(AgentSessionTest, HeartbeatAnsweredAbortedReRegisters) {
  StartAgent([](FakeNodeClient& client) {
    client.FailHeartbeats({absl::AbortedError("node re-registered elsewhere")});
  });
  ASSERT_TRUE(WaitUntil([&] { return agent_->registrations() == 2; }, kTimeout));
  EXPECT_EQ(agent_->session_id(), "session-2");
  EXPECT_TRUE(WaitUntil(
      [&] {
        const std::vector<std::string> watched = client_->record().watched;
        return !watched.empty() && watched.back() == "session-2";
      },
      kTimeout));
}

// A report sent the moment on_up announces a session can find it stale
// before the session is recorded as up (the agent's outbox does exactly
// that). Its RequestReconnect must still end that session: ignoring it
// left the reports waiting for a session change that never came.
TEST(CoordinatorSessionTest, AReconnectRequestedWhileOnUpRunsEndsThatSession) {
  FakeNodeClient client;
  AgentConfig config;
  config.name = "node-a";
  config.coordinator = "fake";
  config.backoff_initial = absl::Milliseconds(10);
  config.backoff_max = absl::Milliseconds(50);
  AgentMetrics metrics(metrics::NoopRegistry());
  std::unique_ptr<CoordinatorSession> session;
  std::atomic<int> ups{0};
  CoordinatorSession::Callbacks callbacks;
  callbacks.running_workers = [] { return std::vector<v1::RunningWorker>(); };
  callbacks.on_up = [&](uint64_t epoch, const std::string&) {
    if (ups.fetch_add(1) == 0) session->RequestReconnect(epoch, "a report found it stale");
  };
  callbacks.on_down = [](uint64_t) {};
  callbacks.on_order = [](const v1::Assignment&) {};
  session = std::make_unique<CoordinatorSession>(&config, &client, &metrics, callbacks);
  session->Start();
  EXPECT_TRUE(WaitUntil([&] { return session->registrations() == 2; }, kTimeout));
  EXPECT_EQ(session->session_id(), "session-2");
  session->Stop();
}

TEST_F(AgentSessionTest, ShutdownCancelsARegistrationInFlight) {
  StartAgent([](FakeNodeClient& client) { client.BlockRegister(); });
  ASSERT_TRUE(WaitUntil([&] { return client_->record().register_attempts == 1; }, kTimeout));
  const absl::Time start = absl::Now();
  agent_->Shutdown();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_EQ(agent_->registrations(), 0);
}

}  // namespace agent_session_test
}  // namespace mesh::agent
