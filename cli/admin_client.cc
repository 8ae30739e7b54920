#include "cli/admin_client.h"

#include <chrono>

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/strings/str_cat.h"
#include "common/coordinator_targets.h"
#include "common/grpc_deadline.h"
#include "common/grpc_status.h"
#include "common/version.h"

namespace mesh::cli {
namespace {

// Keepalive pings, so a long stream (logs -f, a wait) notices a coordinator
// host that vanished without closing the connection: within about 30 s
// instead of never. The coordinator accepts pings this often.
grpc::ChannelArguments KeepaliveArgs() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  return args;
}

}  // namespace

// Keepalives, and for one DNS name with several replicas, calls that
// reach the leader through it (AddCoordinatorChannelArgs).
grpc::ChannelArguments CoordinatorArgs(const std::string& address) {
  grpc::ChannelArguments args = KeepaliveArgs();
  AddCoordinatorChannelArgs(address, &args);
  return args;
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) {
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                   CoordinatorArgs(address));
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(
    const std::string& address, const security::ClientSecurity& security) {
  return security::MakeChannel(address, security, CoordinatorArgs(address));
}

AdminClient::AdminClient(std::shared_ptr<grpc::Channel> channel)
    : channel_(std::move(channel)),
      admin_(mesh::v1::AdminService::NewStub(channel_)),
      health_(grpc::health::v1::Health::NewStub(channel_)) {}

absl::StatusOr<mesh::v1::GetServerInfoResponse> AdminClient::GetServerInfo(absl::Duration timeout) {
  grpc::ClientContext context;
  SetDeadlineAfter(context, timeout);
  mesh::v1::GetServerInfoResponse response;
  grpc::Status status = admin_->GetServerInfo(&context, {}, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  if (response.protocol_version() != static_cast<uint32_t>(kProtocolVersion)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "coordinator ", response.version(), " speaks protocol v", response.protocol_version(),
        " but this client speaks v", kProtocolVersion, "; use matching versions"));
  }
  return response;
}

absl::StatusOr<mesh::v1::CreateJobResponse> AdminClient::CreateJob(
    const mesh::v1::CreateJobRequest& request, absl::Duration timeout) {
  grpc::ClientContext context;
  SetDeadlineAfter(context, timeout);
  mesh::v1::CreateJobResponse response;
  grpc::Status status = admin_->CreateJob(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> AdminClient::CheckHealth(
    const std::string& service, absl::Duration timeout) {
  grpc::ClientContext context;
  SetDeadlineAfter(context, timeout);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = health_->Check(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response.status();
}

}  // namespace mesh::cli
