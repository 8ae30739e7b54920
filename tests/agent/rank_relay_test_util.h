// Helpers of the rank relay's tests (rank_relay_test.cc,
// rank_relay_replace_test.cc): a call's context, a WorkerService stub on a
// relay's socket, and a wait for its heartbeat flushes to stop.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "agent/rank_relay.h"
#include "mesh/v1/worker.grpc.pb.h"
#include "tests/util/proc.h"

namespace mesh::agent::testing {

// A call's context: a deadline, and the worker token when there is one.
inline std::unique_ptr<grpc::ClientContext> CallContext(
    const std::string& token = "", absl::Duration deadline = absl::Seconds(30)) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  if (!token.empty()) ctx->AddMetadata("authorization", absl::StrCat("Bearer ", token));
  return ctx;
}

// A stub that calls `relay` over its Unix socket, as a worker does.
inline std::unique_ptr<mesh::v1::WorkerService::Stub> RelayStub(const RankRelay& relay) {
  return mesh::v1::WorkerService::NewStub(
      grpc::CreateChannel(relay.target(), grpc::InsecureChannelCredentials()));
}

// Waits (at most 5 s) until `relay` has made no heartbeat flush for 300 ms:
// nothing is left to send and the last flush has been answered.
inline void WaitForFlushesToStop(const RankRelay& relay) {
  int64_t last = relay.stats().heartbeat_batches;
  absl::Time quiet_since = absl::Now();
  ::mesh::testing::WaitUntil(
      [&] {
        const int64_t now = relay.stats().heartbeat_batches;
        if (now != last) {
          last = now;
          quiet_since = absl::Now();
        }
        return absl::Now() - quiet_since >= absl::Milliseconds(300);
      },
      absl::Seconds(5));
}

}  // namespace mesh::agent::testing
