#include "agent/replica_node_client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace mesh::agent {
namespace replica_node_client_test {

// A NodeClient whose calls answer from a script (OK when it runs out) and
// count what they were asked.
class ScriptedClient final : public NodeClient {
 public:
  void Answer(absl::Status status) {
    absl::MutexLock lock(&mu_);
    script_.push_back(std::move(status));
  }
  int calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  absl::Duration last_timeout() const {
    absl::MutexLock lock(&mu_);
    return last_timeout_;
  }

  absl::StatusOr<v1::RegisterNodeResponse> RegisterNode(const v1::RegisterNodeRequest&,
                                                        absl::Duration timeout) override {
    absl::Status status = Next(timeout);
    if (!status.ok()) return status;
    return v1::RegisterNodeResponse();
  }
  absl::StatusOr<v1::NodeHeartbeatResponse> NodeHeartbeat(const v1::NodeHeartbeatRequest&,
                                                          absl::Duration timeout) override {
    absl::Status status = Next(timeout);
    if (!status.ok()) return status;
    return v1::NodeHeartbeatResponse();
  }
  absl::Status ReportWorkersStarted(const v1::ReportWorkersStartedRequest&,
                                    absl::Duration timeout) override {
    return Next(timeout);
  }
  absl::Status ReportWorkerExit(const v1::ReportWorkerExitRequest&,
                                absl::Duration timeout) override {
    return Next(timeout);
  }
  std::unique_ptr<AssignmentStream> WatchAssignments(const v1::WatchAssignmentsRequest&) override {
    absl::MutexLock lock(&mu_);
    ++streams_;
    return nullptr;
  }
  std::unique_ptr<LogUploadStream> UploadLogs(absl::Duration) override { return nullptr; }
  void CancelAll() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }

  int streams() const {
    absl::MutexLock lock(&mu_);
    return streams_;
  }
  bool cancelled() const {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }

 private:
  absl::Status Next(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    ++calls_;
    last_timeout_ = timeout;
    if (script_.empty()) return absl::OkStatus();
    absl::Status status = script_.front();
    script_.pop_front();
    return status;
  }

  mutable absl::Mutex mu_;
  std::deque<absl::Status> script_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  int streams_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration last_timeout_ ABSL_GUARDED_BY(mu_);
};

class ReplicaNodeClientTest : public ::testing::Test {
 protected:
  ReplicaNodeClientTest() {
    std::vector<std::unique_ptr<NodeClient>> clients;
    for (int i = 0; i < 3; ++i) {
      auto client = std::make_unique<ScriptedClient>();
      replicas_.push_back(client.get());
      clients.push_back(std::move(client));
    }
    client_ = NewReplicaNodeClient({"a:1", "b:2", "c:3"}, std::move(clients));
  }

  std::vector<ScriptedClient*> replicas_;  // Owned by client_.
  std::unique_ptr<NodeClient> client_;
};

TEST_F(ReplicaNodeClientTest, CallsStayWithAReplicaThatAnswers) {
  EXPECT_TRUE(client_->NodeHeartbeat({}, absl::Seconds(1)).ok());
  // An error that is not about the replica (a refused report) stays too.
  replicas_[0]->Answer(absl::InvalidArgumentError("bad report"));
  EXPECT_EQ(client_->ReportWorkerExit({}, absl::Seconds(1)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(client_->ReportWorkersStarted({}, absl::Seconds(1)).ok());
  EXPECT_EQ(replicas_[0]->calls(), 3);
  EXPECT_EQ(replicas_[1]->calls(), 0);
}

TEST_F(ReplicaNodeClientTest, UnavailableOrLateMovesTheNextCallToTheNextReplica) {
  replicas_[0]->Answer(absl::UnavailableError("standby; the leader is at c:3"));
  // The failed call itself is the caller's to retry.
  EXPECT_EQ(client_->NodeHeartbeat({}, absl::Seconds(1)).status().code(),
            absl::StatusCode::kUnavailable);
  replicas_[1]->Answer(absl::DeadlineExceededError("no answer"));
  EXPECT_EQ(client_->ReportWorkerExit({}, absl::Seconds(1)).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(client_->NodeHeartbeat({}, absl::Seconds(1)).ok());
  EXPECT_EQ(replicas_[2]->calls(), 1);
  // Streams go where the calls go.
  (void)client_->WatchAssignments({});
  EXPECT_EQ(replicas_[2]->streams(), 1);
  EXPECT_EQ(replicas_[0]->streams(), 0);
}

TEST_F(ReplicaNodeClientTest, RegistrationTriesEveryReplicaWithinItsTimeout) {
  replicas_[0]->Answer(absl::DeadlineExceededError("down"));
  replicas_[1]->Answer(absl::UnavailableError("standby"));
  EXPECT_TRUE(client_->RegisterNode({}, absl::Seconds(10)).ok());
  EXPECT_EQ(replicas_[0]->calls(), 1);
  EXPECT_EQ(replicas_[1]->calls(), 1);
  EXPECT_EQ(replicas_[2]->calls(), 1);
  // Each replica gets a short try, not the whole timeout.
  EXPECT_LE(replicas_[0]->last_timeout(), absl::Seconds(1));
  // A refusal that is not about the replica ends the registration at once.
  replicas_[2]->Answer(absl::PermissionDeniedError("not this node"));
  EXPECT_EQ(client_->RegisterNode({}, absl::Seconds(10)).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(replicas_[2]->calls(), 2);
}

TEST_F(ReplicaNodeClientTest, CancelAllReachesEveryReplica) {
  client_->CancelAll();
  for (ScriptedClient* replica : replicas_) EXPECT_TRUE(replica->cancelled());
}

}  // namespace replica_node_client_test
}  // namespace mesh::agent
