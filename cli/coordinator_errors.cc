#include "cli/coordinator_errors.h"

#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/meshctl.h"

namespace mesh::cli {
namespace {

// A failed connection, in a few words, and what to check.
struct ConnectFailure {
  std::string why;
  std::string check;
};

std::optional<ConnectFailure> AsConnectFailure(const absl::Status& status) {
  const absl::string_view m = status.message();
  const std::string running = "is it running? set --coordinator or MESH_COORDINATOR";
  if (absl::IsUnavailable(status)) {
    // TLS first: its failures also read "failed to connect to all addresses".
    if (absl::StrContains(m, "andshake") || absl::StrContains(m, "SSL") ||
        absl::StrContains(m, "Ssl")) {
      return ConnectFailure{"the TLS handshake failed",
                            "check --tls-ca, --tls-cert, --tls-key and that it serves TLS"};
    }
    if (absl::StrContains(m, "Connection refused")) {
      return ConnectFailure{"connection refused", running};
    }
    if (absl::StrContains(m, "DNS resolution failed")) {
      return ConnectFailure{"its name does not resolve", "set --coordinator or MESH_COORDINATOR"};
    }
    if (absl::StrContains(m, "No route to host") ||
        absl::StrContains(m, "Network is unreachable")) {
      return ConnectFailure{"no route to it", running};
    }
    if (absl::StrContains(m, "failed to connect to all addresses")) {
      return ConnectFailure{"connection failed", running};
    }
  }
  return std::nullopt;
}

}  // namespace

int ExitCodeFor(const absl::Status& status) {
  if (status.ok()) return kExitOk;
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) return kExitUnreachable;
  return kExitRefused;
}

std::string DescribeCoordinatorError(absl::string_view coordinator, const absl::Status& status) {
  if (std::optional<ConnectFailure> failure = AsConnectFailure(status); failure.has_value()) {
    return absl::StrCat("meshctl: cannot reach the coordinator at ", coordinator, " (",
                        absl::StatusCodeToString(status.code()), ": ", failure->why,
                        "): ", failure->check);
  }
  return absl::StrCat("meshctl: coordinator ", coordinator, ": ",
                      absl::StatusCodeToString(status.code()), ": ", status.message());
}

}  // namespace mesh::cli
