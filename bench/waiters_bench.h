// mesh-bench waiters: shows that N ranks can be blocked in Join, Barrier or
// a waiting KvGet at the same time without a thread per waiting call, and
// how long releasing all of them takes.
//
// For each kind, against a coordinator in this process (the check reads its
// Coordination::PendingWaits(), so it cannot be a remote one):
//
//   job of world N+1 ── N ranks start the wait ──▶ PendingWaits() == N
//        (sample threads, RSS, fds) ──▶ rank N releases ──▶ all N+1 replies OK
//
//   join     ranks 0..N-1 Join; rank N's Join completes the world.
//   barrier  all N+1 join first; ranks 0..N-1 enter barrier "hold"; rank N
//            arrives last.
//   get      all N+1 join first; ranks 0..N-1 KvGet("release", wait=true);
//            rank N sets the key.
//
// Threads and RSS are the whole process's, client and server together, so a
// thread per waiting call on either side would show.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/rendezvous_bench.h"

namespace mesh::bench {

enum class WaitKind { kJoin, kBarrier, kGet };

// "join", "barrier", "get".
const char* WaitKindName(WaitKind kind);
// Possible errors: INVALID_ARGUMENT for another name.
absl::StatusOr<WaitKind> ParseWaitKind(const std::string& name);

struct WaitersBenchOptions {
  // Ranks held blocked at once, per kind.
  int ranks = 10000;
  // Kinds to run, in order; each gets a fresh job on one shared coordinator.
  std::vector<WaitKind> kinds = {WaitKind::kJoin, WaitKind::kBarrier, WaitKind::kGet};
  // Connections the ranks are spread over.
  int channels = 4;
  // Bound on each step: reaching N pending waits, and releasing them.
  absl::Duration timeout = absl::Seconds(120);
};

struct WaitersResult {
  WaitKind kind = WaitKind::kJoin;
  int ranks = 0;
  // Coordination::PendingWaits() once all N were seen waiting (it must be N).
  int64_t pending = 0;
  // Calls completed OK after the release (N + the releasing rank's).
  int64_t completed = 0;
  ProcessStats before;   // Before the first wait was sent.
  ProcessStats holding;  // While all N were pending.
  ProcessStats after;    // After every call completed.
  double hold_s = 0;     // First wait sent -> N pending.
  double release_s = 0;  // Releasing call sent -> the last of the N replies.
  // (holding.rss - before.rss) / N: client and server memory per waiting call.
  double rss_per_wait_bytes = 0;
};

struct WaitersBenchResult {
  std::string coordinator;
  int channels = 0;
  double load_average = 0;  // When the run started.
  std::vector<WaitersResult> kinds;
};

// Possible errors: INVALID_ARGUMENT for bad options; UNAVAILABLE when the
// coordinator cannot be started or reached; DEADLINE_EXCEEDED when the N
// waits are not all pending within the timeout; INTERNAL naming the first
// call that failed or replied wrongly, and how many did.
absl::StatusOr<WaitersBenchResult> RunWaitersBench(const WaitersBenchOptions& options);

nlohmann::json ToJson(const WaitersBenchResult& result);

}  // namespace mesh::bench
