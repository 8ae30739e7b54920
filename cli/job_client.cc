#include "cli/job_client.h"

#include <chrono>

#include "common/grpc_deadline.h"
#include "common/grpc_status.h"

namespace mesh::cli {
namespace {

// Reads a server stream to its end; one code path for both streams.
template <typename Message>
absl::Status ReadStream(grpc::ClientContext& context, grpc::ClientReaderInterface<Message>& reader,
                        const std::function<bool(const Message&)>& on_message,
                        StreamCanceller* canceller, bool attached) {
  Message message;
  bool stopped = !attached;
  while (!stopped && reader.Read(&message)) {
    if (!on_message(message)) {
      stopped = true;
      context.TryCancel();
    }
  }
  // Finish must follow the last Read even when we cancelled.
  grpc::Status status = reader.Finish();
  if (stopped || (canceller != nullptr && canceller->cancelled())) {
    return absl::CancelledError("stream stopped by the client");
  }
  return FromGrpcStatus(status);
}

}  // namespace

void StreamCanceller::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (context_ != nullptr) context_->TryCancel();
}

bool StreamCanceller::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

bool StreamCanceller::Attach(grpc::ClientContext* context) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return false;
  context_ = context;
  return true;
}

void StreamCanceller::Detach() {
  absl::MutexLock lock(&mu_);
  context_ = nullptr;
}

JobClient::JobClient(std::shared_ptr<grpc::Channel> channel)
    : channel_(std::move(channel)), stub_(mesh::v1::JobService::NewStub(channel_)) {}

absl::StatusOr<mesh::v1::SubmitJobResponse> JobClient::SubmitJob(const mesh::v1::JobSpec& spec,
                                                                 absl::Duration timeout) {
  grpc::ClientContext context;
  SetDeadlineAfter(context, timeout);
  mesh::v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  mesh::v1::SubmitJobResponse response;
  grpc::Status status = stub_->SubmitJob(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<mesh::v1::Job> JobClient::GetJob(const std::string& job_id, absl::Duration timeout) {
  grpc::ClientContext context;
  SetDeadlineAfter(context, timeout);
  mesh::v1::GetJobRequest request;
  request.set_job_id(job_id);
  mesh::v1::GetJobResponse response;
  grpc::Status status = stub_->GetJob(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return std::move(*response.mutable_job());
}

absl::StatusOr<mesh::v1::ListJobsResponse> JobClient::ListJobs(
    const mesh::v1::ListJobsRequest& request, absl::Duration timeout) {
  grpc::ClientContext context;
  SetDeadlineAfter(context, timeout);
  mesh::v1::ListJobsResponse response;
  grpc::Status status = stub_->ListJobs(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<mesh::v1::Job> JobClient::CancelJob(const std::string& job_id,
                                                   const std::string& reason,
                                                   absl::Duration timeout) {
  grpc::ClientContext context;
  SetDeadlineAfter(context, timeout);
  mesh::v1::CancelJobRequest request;
  request.set_job_id(job_id);
  request.set_reason(reason);
  mesh::v1::CancelJobResponse response;
  grpc::Status status = stub_->CancelJob(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return std::move(*response.mutable_job());
}

absl::StatusOr<mesh::v1::Job> JobClient::WaitJob(const std::string& job_id,
                                                 absl::Duration server_wait, absl::Duration slack) {
  grpc::ClientContext context;
  SetDeadlineAfter(context, server_wait + slack);
  mesh::v1::WaitJobRequest request;
  request.set_job_id(job_id);
  request.set_timeout_seconds(absl::ToDoubleSeconds(server_wait));
  mesh::v1::WaitJobResponse response;
  grpc::Status status = stub_->WaitJob(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return std::move(*response.mutable_job());
}

absl::StatusOr<mesh::v1::ListNodesResponse> JobClient::ListNodes(absl::Duration timeout) {
  grpc::ClientContext context;
  SetDeadlineAfter(context, timeout);
  mesh::v1::ListNodesResponse response;
  grpc::Status status = stub_->ListNodes(&context, {}, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::Status JobClient::WatchJobState(
    const std::string& job_id, bool replay,
    const std::function<bool(const mesh::v1::WatchJobStateResponse&)>& on_event,
    StreamCanceller* canceller) {
  grpc::ClientContext context;
  const bool attached = canceller == nullptr || canceller->Attach(&context);
  if (!attached) return absl::CancelledError("stream stopped by the client");
  mesh::v1::WatchJobStateRequest request;
  request.set_job_id(job_id);
  request.set_replay(replay);
  auto reader = stub_->WatchJobState(&context, request);
  absl::Status status =
      ReadStream<mesh::v1::WatchJobStateResponse>(context, *reader, on_event, canceller, attached);
  if (canceller != nullptr) canceller->Detach();
  return status;
}

absl::Status JobClient::GetLogs(const mesh::v1::GetLogsRequest& request,
                                const std::function<bool(const mesh::v1::LogChunk&)>& on_chunk,
                                StreamCanceller* canceller) {
  grpc::ClientContext context;
  const bool attached = canceller == nullptr || canceller->Attach(&context);
  if (!attached) return absl::CancelledError("stream stopped by the client");
  auto reader = stub_->GetLogs(&context, request);
  absl::Status status =
      ReadStream<mesh::v1::LogChunk>(context, *reader, on_chunk, canceller, attached);
  if (canceller != nullptr) canceller->Detach();
  return status;
}

}  // namespace mesh::cli
