// When a `meshctl cluster up` is up: every local agent READY in the
// coordinator's JobService.ListNodes. The RPC is behind NodeLister, and
// time behind a Clock and a wait callback, so unit tests drive it with
// fakes and no server.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "mesh/v1/job.pb.h"

namespace mesh::cli {

// The seam over JobService.ListNodes. Thread safety: used from one thread.
class NodeLister {
 public:
  virtual ~NodeLister() = default;
  // Possible errors: whatever the RPC returns (UNAVAILABLE while the server
  // is starting, UNIMPLEMENTED on a coordinator without JobService).
  virtual absl::StatusOr<mesh::v1::ListNodesResponse> ListNodes(absl::Duration timeout) = 0;
};

// A NodeLister over a gRPC channel to `address`.
std::unique_ptr<NodeLister> MakeGrpcNodeLister(const std::string& address);

// Names in `expected` that `nodes` does not list as READY, in `expected`'s
// order. Nodes not in `expected` are ignored.
std::vector<std::string> MissingReadyNodes(const mesh::v1::ListNodesResponse& nodes,
                                           const std::vector<std::string>& expected);

// Calls `lister` until every name in `expected` is READY, calling
// `wait(poll_interval)` between tries; `wait` returns false to give up at
// once (Ctrl-C, a child died), and is what makes time pass for a FakeClock.
// Errors from ListNodes are retried (the server may still be starting)
// until `deadline`, except UNIMPLEMENTED, returned at once.
// Possible errors: DEADLINE_EXCEEDED naming the missing nodes (k/n READY)
// and the last RPC error; CANCELLED when `wait` returned false;
// UNIMPLEMENTED.
absl::Status WaitUntilNodesReady(NodeLister& lister, const std::vector<std::string>& expected,
                                 absl::Time deadline, absl::Duration poll_interval,
                                 const Clock& clock, absl::FunctionRef<bool(absl::Duration)> wait);

}  // namespace mesh::cli
