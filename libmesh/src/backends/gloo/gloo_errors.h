// Turning what gloo throws into absl::Status (internal).
//
// gloo reports every failure by throwing. Nothing may cross libmesh's API
// as an exception, so each entry point into gloo is wrapped in
// CatchGloo(), which maps:
//   PeerIoError / gloo::IoException  UNAVAILABLE (a broken connection), or
//                                    DEADLINE_EXCEEDED when gloo's message
//                                    says a wait timed out;
//   the store adapter's exceptions   the Status they carry;
//   gloo::EnforceNotMet              INTERNAL (a gloo precondition failed);
//   AbortedError                     ABORTED (the caller substitutes the
//                                    group's abort reason);
//   anything else                    INTERNAL.
// Messages start with `context` (e.g. "gloo group 'world' rank 0/2:
// all_reduce") and name the peers by group and world rank.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace mesh::gloo_backend {

// Runs `fn`, which may throw, and returns its outcome as a Status.
// `global_ranks` maps the group ranks in PeerIoError to world ranks.
absl::Status CatchGloo(const std::string& context, const std::vector<int>& global_ranks,
                       const std::function<void()>& fn);

}  // namespace mesh::gloo_backend
