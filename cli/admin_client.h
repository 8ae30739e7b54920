// AdminClient: blocking client for mesh.v1.AdminService and the standard
// grpc.health.v1 service of a coordinator. Used by meshctl and mesh-bench.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/channel.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/security.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "mesh/v1/admin.grpc.pb.h"

namespace mesh::cli {

// Default coordinator address of meshctl and the agents.
inline constexpr const char* kDefaultCoordinator = "127.0.0.1:7450";

// A plaintext channel to `address` ("host:port"): local clusters and tests.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);

// A channel to `address` with `security`'s TLS files and token
// (common/security.h); plaintext when it names no CA. Errors of
// security::MakeChannel.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(
    const std::string& address, const security::ClientSecurity& security);

// Thread safety: thread-safe (gRPC stubs are).
class AdminClient {
 public:
  explicit AdminClient(std::shared_ptr<grpc::Channel> channel);

  // Possible errors: UNAVAILABLE (cannot connect), DEADLINE_EXCEEDED,
  // FAILED_PRECONDITION when the server speaks another protocol version.
  absl::StatusOr<mesh::v1::GetServerInfoResponse> GetServerInfo(absl::Duration timeout);

  // A bare job record ready for rendezvous (AdminService.CreateJob).
  // Possible errors: UNAVAILABLE, DEADLINE_EXCEEDED, INVALID_ARGUMENT (bad
  // id, world size, shape or names, named by the server), ALREADY_EXISTS.
  absl::StatusOr<mesh::v1::CreateJobResponse> CreateJob(const mesh::v1::CreateJobRequest& request,
                                                        absl::Duration timeout);

  // Serving status of `service` ("" for the whole server).
  // Possible errors: UNAVAILABLE, DEADLINE_EXCEEDED, NOT_FOUND for a service
  // the server does not know.
  absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> CheckHealth(
      const std::string& service, absl::Duration timeout);

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<mesh::v1::AdminService::Stub> admin_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

}  // namespace mesh::cli
