#include "agent/node_client.h"

namespace mesh::agent {

bool IsSessionError(const absl::Status& status) {
  return absl::IsAborted(status) || absl::IsNotFound(status);
}

}  // namespace mesh::agent
