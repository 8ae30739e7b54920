// NodeClient: the agent's side of mesh.v1.NodeService
// (protos/mesh/v1/job.proto), the handful of calls an agent makes to the
// coordinator.
//
// It is an interface so that the Agent and its parts can be unit-tested
// against a hand-written fake with no gRPC server; NewGrpcNodeClient
// (agent/grpc_node_client.h) returns the real one. Adding an RPC means one
// virtual here and one method in the gRPC client.
//
// Errors. Every call returns the coordinator's or the transport's status
// unchanged (code and message, as common/grpc_status.h converts them).
// UNAVAILABLE, DEADLINE_EXCEEDED and the like mean "try again"; ABORTED and
// NOT_FOUND on a call that carries a session id mean the session is gone
// and the node must register again (IsSessionError). After CancelAll every
// call in flight, and every later one, fails with CANCELLED.
//
// Thread safety: implementations must be thread-safe; any number of calls
// may be in flight at once. A stream is used by one thread at a time,
// except Cancel, which any thread may call at any time.
//
// Ownership: streams are owned by the caller and must be destroyed before
// the client that opened them.
#pragma once

#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "mesh/v1/job.pb.h"

namespace mesh::agent {

// An open WatchAssignments stream: the node's orders, in order.
class AssignmentStream {
 public:
  virtual ~AssignmentStream() = default;
  // Blocks for the next order. nullopt when the stream ended with OK; the
  // stream's status when it ended otherwise (CANCELLED after Cancel,
  // UNAVAILABLE when the coordinator went away, ABORTED or NOT_FOUND for a
  // stale session). Not called again once it returned anything but an
  // order.
  virtual absl::StatusOr<std::optional<v1::Assignment>> Next() = 0;
  // Ends the stream: a blocked or later Next returns CANCELLED (unless the
  // stream had already ended otherwise). Idempotent.
  virtual void Cancel() = 0;
};

// An open UploadLogs stream (client streaming). The first message carries
// the header (name, session, job, request id); each may carry a chunk.
class LogUploadStream {
 public:
  virtual ~LogUploadStream() = default;
  // False when the stream is broken (the coordinator ended the call, the
  // deadline passed, CancelAll): stop writing and call Finish.
  virtual bool Write(const v1::UploadLogsRequest& message) = 0;
  // Tells the coordinator that no more messages follow.
  virtual void WritesDone() = 0;
  // Waits for the call's end; its status. Called once, last.
  virtual absl::Status Finish() = 0;
};

class NodeClient {
 public:
  virtual ~NodeClient() = default;

  // Waits up to `timeout` for a connection to the coordinator rather than
  // failing at once while it is unreachable, so that a registration goes
  // through as soon as a restarted coordinator serves.
  virtual absl::StatusOr<v1::RegisterNodeResponse> RegisterNode(
      const v1::RegisterNodeRequest& request, absl::Duration timeout) = 0;
  virtual absl::StatusOr<v1::NodeHeartbeatResponse> NodeHeartbeat(
      const v1::NodeHeartbeatRequest& request, absl::Duration timeout) = 0;
  virtual absl::Status ReportWorkersStarted(const v1::ReportWorkersStartedRequest& request,
                                            absl::Duration timeout) = 0;
  virtual absl::Status ReportWorkerExit(const v1::ReportWorkerExitRequest& request,
                                        absl::Duration timeout) = 0;

  // Opens the stream. It has no deadline: it lives as long as the session,
  // and the caller ends it with Cancel. Opening never fails; an error shows
  // as the stream's status.
  virtual std::unique_ptr<AssignmentStream> WatchAssignments(
      const v1::WatchAssignmentsRequest& request) = 0;
  // Opens an upload that ends by itself (DEADLINE_EXCEEDED) after
  // `timeout`. Opening never fails; an error shows as Write's false.
  virtual std::unique_ptr<LogUploadStream> UploadLogs(absl::Duration timeout) = 0;

  // Cancels every call and stream in flight, and makes every later one fail
  // at once with CANCELLED. For shutdown; cannot be undone.
  virtual void CancelAll() = 0;
};

// Whether `status`, from a call that carried a session id, says the session
// is gone (ABORTED: superseded; NOT_FOUND: unknown), so the node must
// register again.
bool IsSessionError(const absl::Status& status);

}  // namespace mesh::agent
