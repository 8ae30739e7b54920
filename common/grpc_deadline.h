// Deadlines of client calls, from absl durations.
#pragma once

#include <chrono>

#include <grpcpp/client_context.h>

#include "absl/time/time.h"

namespace mesh {

// Sets `context`'s deadline `timeout` from now. Call before starting the call.
inline void SetDeadlineAfter(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout));
}

}  // namespace mesh
