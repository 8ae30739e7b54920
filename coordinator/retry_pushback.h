// NoClientRetryInterceptorFactory: a gRPC server interceptor for the
// leading coordinator. Every UNAVAILABLE it sends carries the trailing
// metadata "grpc-retry-pushback-ms: -1", which tells a client's gRPC retry
// policy not to retry the call (gRPC's retry design: a negative pushback
// means "do not retry").
//
// Why: a client given one DNS name for several replicas retries calls
// answered UNAVAILABLE on the next record (AddCoordinatorChannelArgs in
// common/coordinator_targets.h), because a standby answers so before doing
// anything. The leader's own UNAVAILABLE (etcd without quorum, a write
// whose outcome is unknown, a shutdown under way) must instead reach the
// caller as it is, so that a write is never repeated behind its back.
//
// Thread safety: the factory is stateless; gRPC creates one interceptor per
// call.
#pragma once

#include <grpcpp/support/server_interceptor.h>

namespace mesh::coordinator {

// The metadata key and value the interceptor adds.
inline constexpr char kRetryPushbackKey[] = "grpc-retry-pushback-ms";
inline constexpr char kNoRetryPushback[] = "-1";

class NoClientRetryInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;
};

}  // namespace mesh::coordinator
