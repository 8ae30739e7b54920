#include "backends/gloo/gloo_errors.h"

#include <exception>

#include <gloo/common/error.h>
#include <gloo/common/logging.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends/gloo/gloo_context.h"
#include "backends/gloo/gloo_store.h"

namespace mesh::gloo_backend {
namespace {

// gloo's tcp transport words its timeouts "Timed out waiting <n>ms for recv
// operation to complete", "Connect timeout", "Read timeout" / "Write
// timeout" (sync mode), and poisons every other pair of the context with
// "Application timeout caused pair closure".
bool IsTimeout(absl::string_view what) {
  return absl::StrContains(what, "Timed out") || absl::StrContains(what, "timeout") ||
         absl::StrContains(what, "Timeout");
}

std::string DescribePeers(const std::vector<int>& peers, const std::vector<int>& global_ranks) {
  std::vector<std::string> parts;
  parts.reserve(peers.size());
  for (int peer : peers) {
    if (peer >= 0 && peer < static_cast<int>(global_ranks.size())) {
      parts.push_back(absl::StrCat(peer, " (world rank ", global_ranks[peer], ")"));
    } else {
      parts.push_back(absl::StrCat(peer));
    }
  }
  return absl::StrCat(peers.size() == 1 ? "group rank " : "group ranks ",
                      absl::StrJoin(parts, ", "));
}

absl::Status TransportError(const std::string& context, absl::string_view what,
                            const std::string& peers) {
  const std::string waiting = peers.empty() ? "" : absl::StrCat(" while waiting on ", peers);
  if (IsTimeout(what)) {
    return absl::DeadlineExceededError(absl::StrCat(context, ": timed out", waiting, ": ", what));
  }
  return absl::UnavailableError(
      absl::StrCat(context, ": connection to a peer failed", waiting, ": ", what));
}

}  // namespace

absl::Status CatchGloo(const std::string& context, const std::vector<int>& global_ranks,
                       const std::function<void()>& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const AbortedError&) {
    return absl::AbortedError(absl::StrCat(context, ": aborted"));
  } catch (const StoreIoException& e) {
    return absl::Status(e.status().code(), absl::StrCat(context, ": ", e.status().message()));
  } catch (const StoreEnforceNotMet& e) {
    return absl::Status(e.status().code(), absl::StrCat(context, ": ", e.status().message()));
  } catch (const PeerIoError& e) {
    return TransportError(context, e.what(),
                          e.peers.empty() ? "" : DescribePeers(e.peers, global_ranks));
  } catch (const ::gloo::IoException& e) {
    return TransportError(context, e.what(), "");
  } catch (const ::gloo::EnforceNotMet& e) {
    return absl::InternalError(absl::StrCat(context, ": gloo check failed: ", e.what()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(context, ": ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(context, ": unknown exception from gloo"));
  }
}

}  // namespace mesh::gloo_backend
