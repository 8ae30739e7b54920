#include "coordinator/node_service.h"

#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "coordinator/sink_write_reactor.h"

namespace mesh::coordinator {
namespace {

using namespace mesh::v1;  // NOLINT: the adapter names every message type.

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* ctx, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

class AssignmentReactor final : public SinkWriteReactor<Assignment> {
 public:
  explicit AssignmentReactor(JobManager* jobs) : jobs_(jobs) {}

 private:
  void Release(uint64_t handle) override { jobs_->UnwatchAssignments(handle); }
  JobManager* const jobs_;
};

// One UploadLogs call: attach with the first message, relay every chunk, end
// the upload exactly once.
//
// UploadEnded runs exactly once per successful attach, from whichever comes
// first: the agent's half-close (OK), the call breaking (CANCELLED), a chunk
// the manager refused (its status), or OnDone (the status the manager
// aborted with, else CANCELLED). It is claimed under mu_ and called without
// it. Abort runs under the manager's mutex and only finishes the call; the
// OnDone that follows calls UploadEnded, which waits for that mutex, so the
// reactor outlives every Abort and is deleted only after UploadEnded has
// returned. The reactor finishes only from OnReadDone or Abort, so at most
// one read is ever in flight and `request_` is touched only in OnReadDone.
class UploadReactor final : public grpc::ServerReadReactor<UploadLogsRequest>,
                            public UploadControl {
 public:
  UploadReactor(JobManager* jobs, const CallAuthorizer* authz, grpc::CallbackServerContext* ctx)
      : jobs_(jobs), authz_(authz), ctx_(ctx) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The agent half-closed (its last eof is sent), or the call broke.
      absl::Status status;
      {
        absl::MutexLock lock(&mu_);
        status = abort_status_;  // OK unless the manager aborted the call.
      }
      if (status.ok() && ctx_->IsCancelled()) {
        status = absl::CancelledError("the upload call broke off");
      }
      EndUpload(status);
      FinishOnce(ToGrpcStatus(status));
      return;
    }
    if (!Attached()) {
      // The first message names the node; only its agent may upload.
      if (absl::Status denied = authz_->Node(*ctx_, request_.name()); !denied.ok()) {
        FinishOnce(ToGrpcStatus(denied));
        return;
      }
      // Not under mu_: the manager may call Abort (which takes mu_) with its
      // own mutex held.
      auto upload = jobs_->AttachUpload(request_.name(), request_.session_id(),
                                        request_.log_request_id(), this);
      if (!upload.ok()) {
        FinishOnce(ToGrpcStatus(upload.status()));
        return;
      }
      absl::MutexLock lock(&mu_);
      upload_ = *upload;
      attached_ = true;
    }
    if (request_.has_chunk()) {
      const absl::Status status = jobs_->UploadChunk(upload_id(), request_.chunk());
      if (!status.ok()) {
        // CANCELLED: the reader went away; anything else is the agent's bug.
        EndUpload(status);
        FinishOnce(ToGrpcStatus(status));
        return;
      }
    }
    absl::MutexLock lock(&mu_);
    if (finished_) return;  // Aborted meanwhile; OnDone ends the upload.
    StartRead(&request_);
  }

  void OnCancel() override { EndUpload(absl::CancelledError("the upload call was cancelled")); }

  void OnDone() override {
    absl::Status status;
    {
      absl::MutexLock lock(&mu_);
      status = abort_status_.ok() ? absl::CancelledError("the upload call ended") : abort_status_;
    }
    EndUpload(status);
    delete this;
  }

  // UploadControl, under the manager's mutex.
  void Abort(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    abort_status_ = status;
    finished_ = true;
    Finish(ToGrpcStatus(status));
  }

 private:
  bool Attached() {
    absl::MutexLock lock(&mu_);
    return attached_;
  }

  uint64_t upload_id() {
    absl::MutexLock lock(&mu_);
    return upload_;
  }

  void EndUpload(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_) {
    std::optional<uint64_t> upload;
    {
      absl::MutexLock lock(&mu_);
      if (!attached_ || ended_) return;
      ended_ = true;
      upload = upload_;
    }
    jobs_->UploadEnded(*upload, status);
  }

  void FinishOnce(const grpc::Status& status) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  JobManager* const jobs_;
  const CallAuthorizer* const authz_;
  grpc::CallbackServerContext* const ctx_;
  UploadLogsRequest request_;

  absl::Mutex mu_;
  uint64_t upload_ ABSL_GUARDED_BY(mu_) = 0;
  bool attached_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;  // UploadEnded claimed.
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status abort_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerUnaryReactor* NodeServiceImpl::RegisterNode(Ctx* ctx,
                                                        const RegisterNodeRequest* request,
                                                        RegisterNodeResponse* response) {
  if (absl::Status denied = authz_->Node(*ctx, request->name()); !denied.ok()) {
    return Finish(ctx, denied);
  }
  auto registered = jobs_->RegisterNode(*request);
  if (registered.ok()) *response = *std::move(registered);
  return Finish(ctx, registered.status());
}

grpc::ServerUnaryReactor* NodeServiceImpl::NodeHeartbeat(Ctx* ctx,
                                                         const NodeHeartbeatRequest* request,
                                                         NodeHeartbeatResponse* response) {
  if (absl::Status denied = authz_->Node(*ctx, request->name()); !denied.ok()) {
    return Finish(ctx, denied);
  }
  absl::StatusOr<absl::Duration> interval =
      jobs_->NodeHeartbeat(request->name(), request->session_id());
  if (interval.ok()) response->set_heartbeat_interval_seconds(absl::ToDoubleSeconds(*interval));
  return Finish(ctx, interval.status());
}

grpc::ServerWriteReactor<Assignment>* NodeServiceImpl::WatchAssignments(
    Ctx* ctx, const WatchAssignmentsRequest* request) {
  auto* reactor = new AssignmentReactor(jobs_);
  reactor->Begin([&](AssignmentSink* sink) -> absl::StatusOr<uint64_t> {
    if (absl::Status denied = authz_->Node(*ctx, request->name()); !denied.ok()) return denied;
    return jobs_->WatchAssignments(request->name(), request->session_id(), sink);
  });
  return reactor;
}

grpc::ServerUnaryReactor* NodeServiceImpl::ReportWorkersStarted(
    Ctx* ctx, const ReportWorkersStartedRequest* request, ReportWorkersStartedResponse*) {
  if (absl::Status denied = authz_->Node(*ctx, request->name()); !denied.ok()) {
    return Finish(ctx, denied);
  }
  return Finish(ctx, jobs_->ReportWorkersStarted(*request));
}

grpc::ServerUnaryReactor* NodeServiceImpl::ReportWorkerExit(Ctx* ctx,
                                                            const ReportWorkerExitRequest* request,
                                                            ReportWorkerExitResponse*) {
  if (absl::Status denied = authz_->Node(*ctx, request->name()); !denied.ok()) {
    return Finish(ctx, denied);
  }
  return Finish(ctx, jobs_->ReportWorkerExit(*request));
}

grpc::ServerReadReactor<UploadLogsRequest>* NodeServiceImpl::UploadLogs(Ctx* ctx,
                                                                        UploadLogsResponse*) {
  return new UploadReactor(jobs_, authz_, ctx);
}

}  // namespace mesh::coordinator
