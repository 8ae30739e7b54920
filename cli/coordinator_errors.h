// How meshctl reports a failed call to the coordinator: one line a person
// can act on, and the exit code of cli/meshctl.h.
//
// A coordinator that cannot be reached shows as gRPC's transport text
// ("failed to connect to all addresses; last error: UNKNOWN: ipv4:…:
// Connection refused"); this turns it into what failed and what to check.
//
// Thread safety: pure functions.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace mesh::cli {

// kExitOk, kExitUnreachable (UNAVAILABLE, DEADLINE_EXCEEDED) or
// kExitRefused (any other error).
int ExitCodeFor(const absl::Status& status);

// "meshctl: cannot reach the coordinator at ADDR (UNAVAILABLE: connection
// refused): is it running? set --coordinator or MESH_COORDINATOR" for a
// failed connection (a failed TLS handshake points at the TLS flags);
// "meshctl: coordinator ADDR: CODE: message" otherwise. No newline.
std::string DescribeCoordinatorError(absl::string_view coordinator, const absl::Status& status);

}  // namespace mesh::cli
