#include "cli/coordinator_errors.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/meshctl.h"

namespace mesh::cli {
namespace {

// Why the connection failed, in a few words, or empty when `status` is not
// a failure to connect.
std::string ConnectFailure(const absl::Status& status) {
  const absl::string_view m = status.message();
  if (absl::IsUnavailable(status)) {
    if (absl::StrContains(m, "Connection refused")) return "connection refused";
    if (absl::StrContains(m, "DNS resolution failed")) return "its name does not resolve";
    if (absl::StrContains(m, "No route to host")) return "no route to host";
    if (absl::StrContains(m, "Network is unreachable")) return "network unreachable";
    if (absl::StrContains(m, "failed to connect to all addresses")) return "connection failed";
    if (absl::StrContains(m, "handshake") || absl::StrContains(m, "SSL")) {
      return "the TLS handshake failed; check --tls-ca and whether it serves TLS";
    }
  }
  if (absl::IsDeadlineExceeded(status) && absl::StrContains(m, "connect")) {
    return "no answer in time";
  }
  return "";
}

}  // namespace

int ExitCodeFor(const absl::Status& status) {
  if (status.ok()) return kExitOk;
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) return kExitUnreachable;
  return kExitRefused;
}

std::string DescribeCoordinatorError(absl::string_view coordinator, const absl::Status& status) {
  if (std::string why = ConnectFailure(status); !why.empty()) {
    return absl::StrCat("meshctl: cannot reach the coordinator at ", coordinator, " (", why,
                        "): is it running? set --coordinator or MESH_COORDINATOR");
  }
  return absl::StrCat("meshctl: coordinator ", coordinator, ": ",
                      absl::StatusCodeToString(status.code()), ": ", status.message());
}

}  // namespace mesh::cli
