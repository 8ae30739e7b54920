// RpcMetricsInterceptorFactory: a gRPC server interceptor that records
// mesh_coordinator_rpc_duration_seconds{service, method, code} for every
// call (unary and streaming, callback API included): from the call's start
// to its status being sent, waits included. `code` is the status code's
// name ("OK", "DEADLINE_EXCEEDED", ...); a call that ends without sending a
// status (the client went away) counts as CANCELLED.
//
// Label values stay bounded: a method that the protobuf descriptor pool
// does not know (a client calling a made-up name) is recorded as
// service="unknown", method="unknown".
//
// Thread safety: the factory is thread-safe; gRPC creates one interceptor
// per call. Ownership: `registry` must outlive the server the factory is
// installed in.
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <string>

#include "common/metrics.h"

namespace mesh::coordinator {

class RpcMetricsInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcMetricsInterceptorFactory(metrics::Registry* registry);
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  metrics::Family<metrics::Histogram>* const duration_;
};

// "OK", "CANCELLED", ... "UNAUTHENTICATED"; "UNKNOWN" for a value outside.
const char* StatusCodeName(grpc::StatusCode code);

}  // namespace mesh::coordinator
