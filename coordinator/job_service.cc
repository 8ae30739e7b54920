#include "coordinator/job_service.h"

#include <chrono>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "coordinator/rpc_helpers.h"
#include "coordinator/sink_write_reactor.h"

namespace mesh::coordinator {
namespace {

using namespace mesh::v1;  // NOLINT: the adapter names every message type.

class JobStateReactor final : public SinkWriteReactor<WatchJobStateResponse> {
 public:
  explicit JobStateReactor(JobManager* jobs) : jobs_(jobs) {}

 private:
  void Release(uint64_t handle) override { jobs_->UnwatchJobState(handle); }
  JobManager* const jobs_;
};

class LogReactor final : public SinkWriteReactor<LogChunk> {
 public:
  explicit LogReactor(JobManager* jobs)
      : SinkWriteReactor(JobServiceImpl::kMaxQueuedLogBytes,
                         absl::ResourceExhaustedError("reader too slow; use --tail")),
        jobs_(jobs) {}

 private:
  void Release(uint64_t handle) override { jobs_->CancelLogs(handle); }
  JobManager* const jobs_;
};

}  // namespace

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(Ctx* ctx, const SubmitJobRequest* request,
                                                    SubmitJobResponse* response) {
  absl::StatusOr<std::string> owner = authz_->OwnerName(*ctx);
  if (!owner.ok()) return FinishUnary(ctx, owner.status());
  if (absl::Status denied = authz_->JobClient(*ctx); !denied.ok()) return FinishUnary(ctx, denied);
  auto submitted = jobs_->Submit(request->spec(), *std::move(owner));
  if (submitted.ok()) *response = *std::move(submitted);
  return FinishUnary(ctx, submitted.status());
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(Ctx* ctx, const GetJobRequest* request,
                                                 GetJobResponse* response) {
  if (absl::Status denied = authz_->JobClient(*ctx); !denied.ok()) return FinishUnary(ctx, denied);
  auto job = jobs_->GetJob(request->job_id());
  if (job.ok()) *response->mutable_job() = *std::move(job);
  return FinishUnary(ctx, job.status());
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(Ctx* ctx, const ListJobsRequest* request,
                                                   ListJobsResponse* response) {
  if (absl::Status denied = authz_->JobClient(*ctx); !denied.ok()) return FinishUnary(ctx, denied);
  auto page = jobs_->ListJobs(*request);
  if (page.ok()) *response = *std::move(page);
  return FinishUnary(ctx, page.status());
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(Ctx* ctx, const CancelJobRequest* request,
                                                    CancelJobResponse* response) {
  if (absl::Status denied = authz_->JobControl(*ctx, request->job_id()); !denied.ok()) {
    return FinishUnary(ctx, denied);
  }
  auto job = jobs_->Cancel(request->job_id(), request->reason());
  if (job.ok()) *response->mutable_job() = *std::move(job);
  return FinishUnary(ctx, job.status());
}

grpc::ServerUnaryReactor* JobServiceImpl::WaitJob(Ctx* ctx, const WaitJobRequest* request,
                                                  WaitJobResponse* response) {
  if (absl::Status denied = authz_->JobClient(*ctx); !denied.ok()) return FinishUnary(ctx, denied);
  // The default reactor stays alive until Finish, which the callback calls
  // exactly once (the manager guarantees it, Shutdown included).
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  jobs_->WaitJob(request->job_id(), EffectiveTimeout(ctx, request->timeout_seconds()),
                 [reactor, response](absl::StatusOr<Job> job) {
                   if (job.ok()) *response->mutable_job() = *std::move(job);
                   reactor->Finish(ToGrpcStatus(job.status()));
                 });
  return reactor;
}

grpc::ServerWriteReactor<WatchJobStateResponse>* JobServiceImpl::WatchJobState(
    Ctx* ctx, const WatchJobStateRequest* request) {
  auto* reactor = new JobStateReactor(jobs_);
  reactor->Begin([&](JobStateSink* sink) -> absl::StatusOr<uint64_t> {
    if (absl::Status denied = authz_->JobClient(*ctx); !denied.ok()) return denied;
    return jobs_->WatchJobState(request->job_id(), request->replay(), sink);
  });
  return reactor;
}

grpc::ServerWriteReactor<LogChunk>* JobServiceImpl::GetLogs(Ctx* ctx,
                                                            const GetLogsRequest* request) {
  auto* reactor = new LogReactor(jobs_);
  reactor->Begin([&](LogSink* sink) -> absl::StatusOr<uint64_t> {
    if (absl::Status denied = authz_->JobControl(*ctx, request->job_id()); !denied.ok()) {
      return denied;
    }
    return jobs_->StartLogs(*request, sink);
  });
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::ListNodes(Ctx* ctx, const ListNodesRequest*,
                                                    ListNodesResponse* response) {
  if (absl::Status denied = authz_->JobClient(*ctx); !denied.ok()) return FinishUnary(ctx, denied);
  for (Node& node : jobs_->ListNodes()) *response->add_nodes() = std::move(node);
  return FinishUnary(ctx, absl::OkStatus());
}

}  // namespace mesh::coordinator
