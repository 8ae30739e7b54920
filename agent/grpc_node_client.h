// The gRPC NodeClient: one channel to the coordinator's NodeService.
//
// The channel's reconnect backoff follows the agent's re-registration pace
// (GrpcNodeClientOptions), so that a restarted coordinator is found within
// about backoff_max of serving. Each unary call gets the caller's timeout
// as its deadline; RegisterNode waits for a connection (wait-for-ready)
// instead of failing fast. Errors are those of agent/node_client.h.
//
// Thread safety: thread-safe. Ownership: streams must be destroyed before
// the client.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/node_client.h"
#include "common/security.h"

namespace mesh::agent {

struct GrpcNodeClientOptions {
  // gRPC's reconnect backoff: initial, and the cap (see AgentConfig).
  absl::Duration backoff_initial = absl::Milliseconds(100);
  absl::Duration backoff_max = absl::Seconds(1);
};

// A client of the NodeService at `target` ("host:port") with `security`'s
// TLS settings and token.
// Possible errors: those of security::MakeChannel (unreadable TLS files).
// gRPC channels are lazy: an unreachable target is no error here.
absl::StatusOr<std::unique_ptr<NodeClient>> NewGrpcNodeClient(
    const std::string& target, const security::ClientSecurity& security,
    GrpcNodeClientOptions options = {});

}  // namespace mesh::agent
