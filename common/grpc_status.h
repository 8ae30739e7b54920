// Conversion between absl::Status and grpc::Status.
//
// Logic classes speak absl::Status; only the RPC edge (service adapters and
// clients) converts. The canonical codes are numerically identical in both
// libraries, and the message is carried over unchanged.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace mesh {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace mesh
