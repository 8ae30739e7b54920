#include "agent/replica_node_client.h"

#include <algorithm>
#include <utility>

#include <spdlog/spdlog.h>

#include "common/check.h"

namespace mesh::agent {
namespace {

// Whether a call's failure says "not this replica".
bool WrongReplica(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status);
}

// How long one registration attempt waits for one replica.
constexpr absl::Duration kPerReplica = absl::Seconds(1);

class ReplicaNodeClient final : public NodeClient {
 public:
  ReplicaNodeClient(std::vector<std::string> targets,
                    std::vector<std::unique_ptr<NodeClient>> clients)
      : tracker_(std::move(targets)), clients_(std::move(clients)) {}

  // Registration waits for a connection (NodeClient::RegisterNode), which a
  // replica that is down never gives: each replica gets a short try in
  // turn, within `timeout`, so the leader is found within a round.
  absl::StatusOr<v1::RegisterNodeResponse> RegisterNode(const v1::RegisterNodeRequest& request,
                                                        absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      const absl::Duration left = deadline - absl::Now();
      absl::StatusOr<v1::RegisterNodeResponse> result = Call([&](NodeClient& c) {
        return c.RegisterNode(request, std::max(absl::ZeroDuration(), std::min(left, kPerReplica)));
      });
      if (result.ok() || !WrongReplica(result.status()) || absl::Now() >= deadline) return result;
    }
  }
  absl::StatusOr<v1::NodeHeartbeatResponse> NodeHeartbeat(const v1::NodeHeartbeatRequest& request,
                                                          absl::Duration timeout) override {
    return Call([&](NodeClient& c) { return c.NodeHeartbeat(request, timeout); });
  }
  absl::Status ReportWorkersStarted(const v1::ReportWorkersStartedRequest& request,
                                    absl::Duration timeout) override {
    return Call([&](NodeClient& c) { return c.ReportWorkersStarted(request, timeout); });
  }
  absl::Status ReportWorkerExit(const v1::ReportWorkerExitRequest& request,
                                absl::Duration timeout) override {
    return Call([&](NodeClient& c) { return c.ReportWorkerExit(request, timeout); });
  }
  // Streams follow the replica of the registration that preceded them: the
  // session opens them right after RegisterNode succeeded.
  std::unique_ptr<AssignmentStream> WatchAssignments(
      const v1::WatchAssignmentsRequest& request) override {
    return clients_[tracker_.current()]->WatchAssignments(request);
  }
  std::unique_ptr<LogUploadStream> UploadLogs(absl::Duration timeout) override {
    return clients_[tracker_.current()]->UploadLogs(timeout);
  }
  void CancelAll() override {
    for (auto& client : clients_) client->CancelAll();
  }

 private:
  template <typename F>
  auto Call(F call) -> decltype(call(std::declval<NodeClient&>())) {
    const size_t i = tracker_.current();
    auto result = call(*clients_[i]);
    absl::Status status;
    if constexpr (std::is_same_v<decltype(result), absl::Status>) {
      status = result;
    } else {
      status = result.status();
    }
    if (WrongReplica(status)) {
      tracker_.Rotate(i);
      spdlog::debug("coordinator replica {} did not serve ({}); next: {}", tracker_.target(i),
                    status.ToString(), tracker_.target(tracker_.current()));
    }
    return result;
  }

  LeaderTracker tracker_;
  const std::vector<std::unique_ptr<NodeClient>> clients_;
};

}  // namespace

std::unique_ptr<NodeClient> NewReplicaNodeClient(std::vector<std::string> targets,
                                                 std::vector<std::unique_ptr<NodeClient>> clients) {
  MESH_CHECK(!targets.empty() && targets.size() == clients.size(),
             "NewReplicaNodeClient: one client per target");
  return std::make_unique<ReplicaNodeClient>(std::move(targets), std::move(clients));
}

}  // namespace mesh::agent
