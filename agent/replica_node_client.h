// A NodeClient over the replicas of a coordinator on an etcd store
// (docs/ha.md): every call goes to the replica believed to lead; a call
// that fails with UNAVAILABLE (a standby's answer, or a replica that is
// down) or DEADLINE_EXCEEDED moves the belief on to the next replica, and
// the agent's own retries (registration, reports, the assignment stream's
// reconnect) then reach the leader within one round of the list. The
// failed call itself is not repeated here: the agent decides what to retry.
//
// Thread safety: as NodeClient (thread-safe); the clients it wraps must be.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/node_client.h"
#include "common/coordinator_targets.h"
#include "common/security.h"

namespace mesh::agent {

// `clients[i]` talks to `targets[i]`; at least one of each, as many.
std::unique_ptr<NodeClient> NewReplicaNodeClient(std::vector<std::string> targets,
                                                 std::vector<std::unique_ptr<NodeClient>> clients);

}  // namespace mesh::agent
