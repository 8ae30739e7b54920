// gRPC adapter for mesh.v1.JobService (meshctl's side) over JobManager,
// callback API.
//
// Converts protos to JobManager calls and absl::Status to grpc::Status (same
// codes, same messages); holds no state of its own. Errors are the
// manager's (job_manager.h): NOT_FOUND for an unknown job id,
// INVALID_ARGUMENT naming the bad field, UNAVAILABLE after shutdown, the
// store's errors for SubmitJob/CancelJob. In addition:
//
//   WaitJob        DEADLINE_EXCEEDED after the effective timeout: the smaller
//                  of timeout_seconds and what is left of the client's gRPC
//                  deadline (neither: the manager's max_wait). No thread
//                  blocks; the reply is sent from the manager's callback.
//   WatchJobState  a stream; ends OK after the terminal transition,
//                  UNAVAILABLE on shutdown, CANCELLED when the client leaves.
//   GetLogs        a stream relayed from the agents' uploads. A reader that
//                  falls behind by more than kMaxQueuedLogBytes (32 MiB of
//                  chunks queued at the coordinator) gets RESOURCE_EXHAUSTED
//                  "reader too slow; use --tail" and the uploads are
//                  cancelled, so a slow client cannot make the coordinator
//                  buffer a job's whole output.
//
// Thread safety: thread-safe.
#pragma once

#include <cstddef>

#include "coordinator/auth_grpc.h"
#include "coordinator/job_manager.h"
#include "mesh/v1/job.grpc.pb.h"

namespace mesh::coordinator {

class JobServiceImpl final : public mesh::v1::JobService::CallbackService {
 public:
  // Bytes of log chunks a GetLogs call may have waiting behind the write in
  // flight before it ends with RESOURCE_EXHAUSTED.
  static constexpr size_t kMaxQueuedLogBytes = size_t{32} << 20;

  // `jobs` must outlive this service and every call it started: shut it down
  // (which ends every wait and stream) before the gRPC server.
  // `authz` decides who may submit, read and control which job
  // (coordinator/auth_grpc.h).
  JobServiceImpl(JobManager* jobs, const CallAuthorizer* authz) : jobs_(jobs), authz_(authz) {}

  using Ctx = grpc::CallbackServerContext;
  using Unary = grpc::ServerUnaryReactor;

  Unary* SubmitJob(Ctx*, const mesh::v1::SubmitJobRequest*, mesh::v1::SubmitJobResponse*) override;
  Unary* GetJob(Ctx*, const mesh::v1::GetJobRequest*, mesh::v1::GetJobResponse*) override;
  Unary* ListJobs(Ctx*, const mesh::v1::ListJobsRequest*, mesh::v1::ListJobsResponse*) override;
  Unary* CancelJob(Ctx*, const mesh::v1::CancelJobRequest*, mesh::v1::CancelJobResponse*) override;
  Unary* WaitJob(Ctx*, const mesh::v1::WaitJobRequest*, mesh::v1::WaitJobResponse*) override;
  grpc::ServerWriteReactor<mesh::v1::WatchJobStateResponse>* WatchJobState(
      Ctx*, const mesh::v1::WatchJobStateRequest*) override;
  grpc::ServerWriteReactor<mesh::v1::LogChunk>* GetLogs(Ctx*,
                                                        const mesh::v1::GetLogsRequest*) override;
  Unary* ListNodes(Ctx*, const mesh::v1::ListNodesRequest*, mesh::v1::ListNodesResponse*) override;

 private:
  JobManager* const jobs_;
  const CallAuthorizer* const authz_;
};

}  // namespace mesh::coordinator
