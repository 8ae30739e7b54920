#include "agent/grpc_node_client.h"

#include <set>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/coordinator_targets.h"
#include "common/grpc_status.h"
#include "mesh/v1/job.grpc.pb.h"

namespace mesh::agent {
namespace {

void SetDeadline(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

// The contexts of the calls in flight, so that CancelAll reaches them.
class CallRegistry {
 public:
  // Cancels `context` at once when CancelAll has been called.
  void Add(grpc::ClientContext* context) {
    absl::MutexLock lock(&mu_);
    if (cancelled_) context->TryCancel();
    contexts_.insert(context);
  }
  void Remove(grpc::ClientContext* context) {
    absl::MutexLock lock(&mu_);
    contexts_.erase(context);
  }
  void CancelAll() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    for (grpc::ClientContext* context : contexts_) context->TryCancel();
  }

 private:
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::set<grpc::ClientContext*> contexts_ ABSL_GUARDED_BY(mu_);
};

// Keeps a context in the registry for the lifetime of the guard.
class TrackedCall {
 public:
  TrackedCall(CallRegistry* registry, grpc::ClientContext* context)
      : registry_(registry), context_(context) {
    registry_->Add(context_);
  }
  ~TrackedCall() { registry_->Remove(context_); }
  TrackedCall(const TrackedCall&) = delete;
  TrackedCall& operator=(const TrackedCall&) = delete;

 private:
  CallRegistry* const registry_;
  grpc::ClientContext* const context_;
};

class GrpcAssignmentStream final : public AssignmentStream {
 public:
  GrpcAssignmentStream(v1::NodeService::Stub* stub, CallRegistry* registry,
                       const v1::WatchAssignmentsRequest& request)
      : registry_(registry) {
    registry_->Add(&context_);
    reader_ = stub->WatchAssignments(&context_, request);
  }
  ~GrpcAssignmentStream() override { registry_->Remove(&context_); }

  absl::StatusOr<std::optional<v1::Assignment>> Next() override {
    v1::Assignment order;
    if (reader_->Read(&order)) return order;
    absl::Status status = FromGrpcStatus(reader_->Finish());
    if (status.ok()) return std::nullopt;
    return status;
  }
  void Cancel() override { context_.TryCancel(); }

 private:
  CallRegistry* const registry_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<v1::Assignment>> reader_;
};

class GrpcLogUploadStream final : public LogUploadStream {
 public:
  GrpcLogUploadStream(v1::NodeService::Stub* stub, CallRegistry* registry, absl::Duration timeout)
      : registry_(registry) {
    SetDeadline(context_, timeout);
    registry_->Add(&context_);
    writer_ = stub->UploadLogs(&context_, &response_);
  }
  ~GrpcLogUploadStream() override { registry_->Remove(&context_); }

  bool Write(const v1::UploadLogsRequest& message) override { return writer_->Write(message); }
  void WritesDone() override { writer_->WritesDone(); }
  absl::Status Finish() override { return FromGrpcStatus(writer_->Finish()); }

 private:
  CallRegistry* const registry_;
  grpc::ClientContext context_;
  v1::UploadLogsResponse response_;
  std::unique_ptr<grpc::ClientWriter<v1::UploadLogsRequest>> writer_;
};

class GrpcNodeClient final : public NodeClient {
 public:
  explicit GrpcNodeClient(std::shared_ptr<grpc::Channel> channel)
      : channel_(std::move(channel)), stub_(v1::NodeService::NewStub(channel_)) {}

  absl::StatusOr<v1::RegisterNodeResponse> RegisterNode(const v1::RegisterNodeRequest& request,
                                                        absl::Duration timeout) override {
    // Wait for a connection rather than fail fast while the channel is in
    // TRANSIENT_FAILURE: a connection attempt makes progress only while
    // some thread polls for it, and without a waiting RPC that is gRPC's
    // backup poller, every 5 s. Failing fast, the agent re-registered up to
    // 5 s after a restarted coordinator was serving (its SETTINGS frame sat
    // unread, and each attempt timed out as "tcp handshaker shutdown");
    // waiting, the calling thread drives the handshake and the call goes
    // through as soon as the coordinator accepts.
    return Unary<v1::RegisterNodeResponse>(&v1::NodeService::Stub::RegisterNode, request, timeout,
                                           /*wait_for_ready=*/true);
  }

  absl::StatusOr<v1::NodeHeartbeatResponse> NodeHeartbeat(const v1::NodeHeartbeatRequest& request,
                                                          absl::Duration timeout) override {
    return Unary<v1::NodeHeartbeatResponse>(&v1::NodeService::Stub::NodeHeartbeat, request,
                                            timeout);
  }

  absl::Status ReportWorkersStarted(const v1::ReportWorkersStartedRequest& request,
                                    absl::Duration timeout) override {
    return Unary<v1::ReportWorkersStartedResponse>(&v1::NodeService::Stub::ReportWorkersStarted,
                                                   request, timeout)
        .status();
  }

  absl::Status ReportWorkerExit(const v1::ReportWorkerExitRequest& request,
                                absl::Duration timeout) override {
    return Unary<v1::ReportWorkerExitResponse>(&v1::NodeService::Stub::ReportWorkerExit, request,
                                               timeout)
        .status();
  }

  std::unique_ptr<AssignmentStream> WatchAssignments(
      const v1::WatchAssignmentsRequest& request) override {
    return std::make_unique<GrpcAssignmentStream>(stub_.get(), &calls_, request);
  }

  std::unique_ptr<LogUploadStream> UploadLogs(absl::Duration timeout) override {
    return std::make_unique<GrpcLogUploadStream>(stub_.get(), &calls_, timeout);
  }

  void CancelAll() override { calls_.CancelAll(); }

 private:
  // One unary call: the caller's timeout as deadline, cancelled by
  // CancelAll, the status converted.
  template <typename Response, typename Request>
  absl::StatusOr<Response> Unary(grpc::Status (v1::NodeService::Stub::*method)(grpc::ClientContext*,
                                                                               const Request&,
                                                                               Response*),
                                 const Request& request, absl::Duration timeout,
                                 bool wait_for_ready = false) {
    grpc::ClientContext context;
    SetDeadline(context, timeout);
    context.set_wait_for_ready(wait_for_ready);
    TrackedCall tracked(&calls_, &context);
    Response response;
    const grpc::Status status = (stub_.get()->*method)(&context, request, &response);
    if (!status.ok()) return FromGrpcStatus(status);
    return response;
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::NodeService::Stub> stub_;
  CallRegistry calls_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<NodeClient>> NewGrpcNodeClient(
    const std::string& target, const security::ClientSecurity& security,
    GrpcNodeClientOptions options) {
  grpc::ChannelArguments args;
  // gRPC's own reconnect backoff grows to 2 minutes by default, and a
  // RegisterNode made while the channel waits out that backoff waits for
  // the next connection attempt, however soon the coordinator is back.
  // Keep it at the agent's re-registration pace (at most backoff_max, 1 s
  // by default) so a restarted coordinator is found within about a second.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options.backoff_initial)));
  // Despite its name, gRPC uses this as the minimum time one connection
  // attempt (TCP connect and HTTP/2 handshake) gets before it is abandoned.
  // At backoff_initial (100 ms) attempts to a restarted coordinator on a
  // loaded host were cut short again and again ("tcp handshaker shutdown");
  // 1 s lets a handshake finish there and still retries a stalled attempt
  // soon.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options.backoff_max)));
  // One DNS name for several replicas: calls reach the leader through it.
  AddCoordinatorChannelArgs(target, &args);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      security::MakeChannel(target, security, args);
  if (!channel.ok()) return channel.status();
  return std::make_unique<GrpcNodeClient>(*std::move(channel));
}

}  // namespace mesh::agent
