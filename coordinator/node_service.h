// gRPC adapter for mesh.v1.NodeService (the agents' side) over JobManager,
// callback API.
//
// Converts protos to JobManager calls and absl::Status to grpc::Status (same
// codes and messages); holds no state of its own. Errors are the manager's
// (job_manager.h): ABORTED for a stale session (re-register), NOT_FOUND for
// an unknown node, INVALID_ARGUMENT for a bad registration or rank,
// UNAVAILABLE after shutdown.
//
//   WatchAssignments  a stream of orders; a newer stream for the node ends
//                     this one with ABORTED; UNAVAILABLE on shutdown.
//   UploadLogs        the first message attaches the call to its GetLogs
//                     request (AttachUpload's errors end the call); every
//                     chunk is relayed. The agent's half-close ends the
//                     upload OK. When the reader has gone away the call
//                     ends early (CANCELLED, or the status the manager
//                     aborts it with); the agent stops reading its logs.
//
// Thread safety: thread-safe.
#pragma once

#include "coordinator/auth_grpc.h"
#include "coordinator/job_manager.h"
#include "mesh/v1/job.grpc.pb.h"

namespace mesh::coordinator {

class NodeServiceImpl final : public mesh::v1::NodeService::CallbackService {
 public:
  // `jobs` must outlive this service and every call it started: shut it down
  // (which ends every stream) before the gRPC server. `authz` lets each
  // agent act only for its own node (coordinator/auth_grpc.h).
  NodeServiceImpl(JobManager* jobs, const CallAuthorizer* authz) : jobs_(jobs), authz_(authz) {}

  using Ctx = grpc::CallbackServerContext;
  using Unary = grpc::ServerUnaryReactor;

  Unary* RegisterNode(Ctx*, const mesh::v1::RegisterNodeRequest*,
                      mesh::v1::RegisterNodeResponse*) override;
  Unary* NodeHeartbeat(Ctx*, const mesh::v1::NodeHeartbeatRequest*,
                       mesh::v1::NodeHeartbeatResponse*) override;
  grpc::ServerWriteReactor<mesh::v1::Assignment>* WatchAssignments(
      Ctx*, const mesh::v1::WatchAssignmentsRequest*) override;
  Unary* ReportWorkersStarted(Ctx*, const mesh::v1::ReportWorkersStartedRequest*,
                              mesh::v1::ReportWorkersStartedResponse*) override;
  Unary* ReportWorkerExit(Ctx*, const mesh::v1::ReportWorkerExitRequest*,
                          mesh::v1::ReportWorkerExitResponse*) override;
  grpc::ServerReadReactor<mesh::v1::UploadLogsRequest>* UploadLogs(
      Ctx*, mesh::v1::UploadLogsResponse*) override;

 private:
  JobManager* const jobs_;
  const CallAuthorizer* const authz_;
};

}  // namespace mesh::coordinator
