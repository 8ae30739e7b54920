// JobClient: a thin, typed, blocking client for mesh.v1.JobService
// (protos/mesh/v1/job.proto), used by meshctl's job commands.
//
// Unary calls take a deadline and return the server's status unchanged
// (FromGrpcStatus). Streams (GetLogs, WatchJobState) have no deadline, since
// following a job may take days; they end when the server ends them, when the
// callback returns false, or when a StreamCanceller attached to them is
// cancelled from another thread (e.g. on Ctrl-C).
//
// Possible errors of every call (job.proto): UNAVAILABLE (coordinator
// unreachable or shutting down), DEADLINE_EXCEEDED (unary deadline passed),
// NOT_FOUND (unknown job id), INVALID_ARGUMENT (bad spec, page token or
// state, named by the server), FAILED_PRECONDITION (GetLogs of a job not
// placed yet); CANCELLED when a stream was stopped by its callback or
// canceller.
//
// Thread safety: thread-safe (gRPC stubs are). Ownership: shares `channel`.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "mesh/v1/job.grpc.pb.h"

namespace mesh::cli {

// Ends a stream from any thread. Cancel() is sticky: a stream that starts
// after it ends at once with CANCELLED. One stream at a time may use it.
// Thread safety: thread-safe. Must outlive the stream call using it.
class StreamCanceller {
 public:
  void Cancel();
  bool cancelled() const;

 private:
  friend class JobClient;
  // False when already cancelled (the call must not start).
  bool Attach(grpc::ClientContext* context);
  void Detach();

  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
};

class JobClient {
 public:
  explicit JobClient(std::shared_ptr<grpc::Channel> channel);

  absl::StatusOr<mesh::v1::SubmitJobResponse> SubmitJob(const mesh::v1::JobSpec& spec,
                                                        absl::Duration timeout);
  absl::StatusOr<mesh::v1::Job> GetJob(const std::string& job_id, absl::Duration timeout);
  absl::StatusOr<mesh::v1::ListJobsResponse> ListJobs(const mesh::v1::ListJobsRequest& request,
                                                      absl::Duration timeout);
  // The job after the call (a terminal job is returned unchanged).
  absl::StatusOr<mesh::v1::Job> CancelJob(const std::string& job_id, const std::string& reason,
                                          absl::Duration timeout);
  // One WaitJob call: the server waits up to `server_wait` (> 0) and then
  // answers DEADLINE_EXCEEDED; the call's own deadline is server_wait +
  // `slack`, so a server that never answers cannot hang the client either.
  absl::StatusOr<mesh::v1::Job> WaitJob(const std::string& job_id, absl::Duration server_wait,
                                        absl::Duration slack);
  absl::StatusOr<mesh::v1::ListNodesResponse> ListNodes(absl::Duration timeout);

  // Streams WatchJobState; `on_event` returns false to stop (CANCELLED).
  absl::Status WatchJobState(
      const std::string& job_id, bool replay,
      const std::function<bool(const mesh::v1::WatchJobStateResponse&)>& on_event,
      StreamCanceller* canceller);

  // Streams GetLogs; `on_chunk` runs once per chunk, in order, on the
  // calling thread, and returns false to stop (CANCELLED). OK when the
  // server ended the stream. `canceller` may be null.
  absl::Status GetLogs(const mesh::v1::GetLogsRequest& request,
                       const std::function<bool(const mesh::v1::LogChunk&)>& on_chunk,
                       StreamCanceller* canceller);

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<mesh::v1::JobService::Stub> stub_;
};

}  // namespace mesh::cli
